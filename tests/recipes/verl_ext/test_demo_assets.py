"""The tiny assets: built locally, deterministic, cached, race-safe; what verl needs from tokenizer, model, data."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
from pathlib import Path

import pandas as pd
import pytest
import torch

from recipes.verl_ext.demo import TinyAssets, default_root, ensure_tiny_assets
from recipes.verl_ext.demo.reward import compute_score, digit_fraction


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> TinyAssets:
    return ensure_tiny_assets(tmp_path_factory.mktemp("cache"))


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_paths_exist_under_the_given_root(assets):
    assert assets.root.name.startswith("tiny-")
    for path in (assets.model_dir / "config.json", assets.model_dir / "model.safetensors", assets.train_parquet,
                 assets.val_parquet, assets.reward_py):  # fmt: skip
        assert path.is_file(), path
    assert assets.tokenizer_dir == assets.model_dir
    assert assets.reward_fn == "compute_score"


def test_default_root_follows_pack_data_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("KLPPO_DATA_DIR", str(tmp_path))
    assert default_root() == tmp_path
    monkeypatch.delenv("KLPPO_DATA_DIR")
    assert default_root() == Path("~/.cache/klppo-recipes").expanduser()


def test_second_call_reuses_the_cache(assets):
    stamp = (assets.model_dir / "model.safetensors").stat().st_mtime_ns
    again = ensure_tiny_assets(assets.root.parent)
    assert again == assets
    assert (assets.model_dir / "model.safetensors").stat().st_mtime_ns == stamp


@pytest.mark.slow
def test_build_is_deterministic(assets, tmp_path):
    other = ensure_tiny_assets(tmp_path)
    for name in ("model/model.safetensors", "model/tokenizer.json", "data/train.parquet", "data/val.parquet"):
        assert _sha(other.root / name) == _sha(assets.root / name), name


def _build(root: str) -> str:
    return str(ensure_tiny_assets(root).root)


@pytest.mark.slow
def test_concurrent_builds_agree_and_leave_no_staging_behind(tmp_path):
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        roots = pool.map(_build, [str(tmp_path)] * 2)
    assert roots[0] == roots[1]
    assert [p.name for p in tmp_path.iterdir()] == [Path(roots[0]).name]


def test_tokenizer_has_what_verls_qwen_builder_needs(assets):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(assets.tokenizer_dir)
    assert len(tokenizer.encode("\n", add_special_tokens=False)) == 1
    assert tokenizer.encode("<|im_end|>", add_special_tokens=False) == [tokenizer.eos_token_id] == [1]
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.pad_token_id == 0
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "3+4="}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<|im_start|>user\n3+4=<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "3+4="}], add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert tokenizer.decode(ids) == text
    assert len(tokenizer) <= json.loads((assets.model_dir / "config.json").read_text())["vocab_size"]


def test_verls_continuous_token_builder_accepts_the_tokenizer(assets):
    from transformers import AutoTokenizer
    from verl.utils.tokenizer.continuous_token import QwenContinuousTokenBuilder

    tokenizer = AutoTokenizer.from_pretrained(assets.tokenizer_dir)
    builder = QwenContinuousTokenBuilder(tokenizer)
    assert builder.build_initial_tokens([{"role": "user", "content": "1+2="}])[-1] == tokenizer.encode("\n")[0]


def test_model_is_the_shipped_tiny_architecture_and_runs(assets):
    from transformers import AutoModelForCausalLM

    shipped = json.loads((Path(__file__).parents[3] / "hybrid_engine/model_configs/tiny/config.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(assets.model_dir, attn_implementation="sdpa")
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size"):
        assert getattr(model.config, key) == shipped[key], key
    assert model.config.eos_token_id == 1 and next(model.parameters()).dtype == torch.float32
    logits = model(input_ids=torch.tensor([[2, 5, 9]])).logits
    assert logits.shape == (1, 3, shipped["vocab_size"])
    # random init: close to uniform over the vocabulary, so every response token is a fresh draw
    entropy = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)
    assert entropy.min() > 0.95 * torch.log(torch.tensor(float(shipped["vocab_size"])))


def test_data_is_verls_rl_parquet_format(assets):
    train, val = pd.read_parquet(assets.train_parquet), pd.read_parquet(assets.val_parquet)
    assert len(train) == 1024 and len(val) == 32
    assert list(train.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    row = train.iloc[0]
    assert row["data_source"] == "tiny_arith"
    [message] = list(row["prompt"])
    assert message["role"] == "user" and message["content"].endswith("=")
    extra = row["extra_info"]
    assert row["reward_model"]["ground_truth"] == str(extra["a"] + extra["b"])
    assert message["content"] == f"{extra['a']}+{extra['b']}="


@pytest.mark.parametrize(
    ("response", "truth", "score", "acc"),
    [
        ("12", "12", 1.0, 1.0),  # the answer: format and accuracy
        (" 12\n", "12", 1.0, 1.0),  # surrounding whitespace does not count
        ("13", "12", 0.8, 0.0),  # a number, the wrong one: format only
        ("1a", "12", 0.4, 0.0),  # half digits
        ("ab", "12", 0.0, 0.0),
        ("", "12", 0.0, 0.0),
    ],
)
def test_reward_scores_known_strings(response, truth, score, acc):
    result = compute_score("tiny_arith", response, truth)
    assert result["score"] == pytest.approx(score) and result["acc"] == acc
    assert result["digits"] == pytest.approx(digit_fraction(response))


def test_reward_loads_through_verls_custom_reward_hook(assets):
    from verl.utils.import_utils import load_extern_object

    score = load_extern_object(str(assets.reward_py), assets.reward_fn)
    assert score(data_source="tiny_arith", solution_str="7", ground_truth="7", extra_info={})["score"] == 1.0
