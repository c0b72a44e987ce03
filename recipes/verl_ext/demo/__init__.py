"""Tiny assets for the embedded CPU default: a random Qwen2-family model, its tokenizer, a synthetic task, a reward.

Nothing comes from a model or dataset hub: everything is built here, deterministically (fixed seeds), on first use,
and cached under ``$KLPPO_DATA_DIR`` or else ``~/.cache/klppo-recipes``::

    from recipes.verl_ext.demo import ensure_tiny_assets
    assets = ensure_tiny_assets()          # builds once (seconds), then returns the cached paths
    assets.model_dir, assets.train_parquet, assets.reward_py, assets.reward_fn

- model: ``Qwen2ForCausalLM`` with the architecture of ``hybrid_engine/model_configs/tiny`` (hidden 64, 2 layers,
  vocab 512), random weights from a fixed seed, saved with ``save_pretrained`` (fp32 safetensors).
- tokenizer: a byte-level BPE trained here with the ``tokenizers`` library on a small arithmetic corpus, saved next
  to the model. ChatML template; ``"\\n"`` is one token and ``<|im_end|>`` (the eos) is one token, as verl's Qwen
  continuous-token builder requires; ``<|endoftext|>`` pads.
- data: verl's RL parquet format (``data_source``, ``prompt`` as chat messages, ``ability``,
  ``reward_model.ground_truth``, ``extra_info``) for ``train`` and ``val``; the task is ``"a+b="``.
- reward: :mod:`recipes.verl_ext.demo.reward` (``compute_score``), a shaped rule-based score (see its docstring).

Building is idempotent and safe when several processes build at once: each builds into its own temporary folder
and renames it into place; the loser of the race discards its copy.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from hybrid_engine.model_spec import MODEL_CONFIG_DIR
from recipes import envvars
from recipes.verl_ext.demo import reward as _reward

__all__ = ["ASSETS_VERSION", "TinyAssets", "default_root", "ensure_tiny_assets"]

ASSETS_VERSION = 1
"""Bump when the recipe below changes in a way the build key does not capture."""

_TINY_CONFIG = MODEL_CONFIG_DIR / "tiny" / "config.json"
_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_end|>", "<|im_start|>"]  # ids 0, 1, 2: pad/bos, eos, turn start
_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
_SEED = 0
_N_TRAIN = 1024
_N_VAL = 32
_MAX_OPERAND = 49
_N_ARITH_LINES = 4000  # tokenizer corpus: arithmetic lines ...
_N_WORD_LINES = 600  # ... and lines of English words
_WORDS = (
    "the a an is are was be to of and in on at for with as by from that this it not or but if then so what which "
    "who how when where why answer question number sum plus equals add result user assistant system one two three "
    "four five six seven eight nine ten zero hello world model token reward learn step train value policy actor "
    "critic ratio clip loss"
).split()
_DONE = "ASSETS_OK.json"


@dataclass(frozen=True, slots=True)
class TinyAssets:
    """Paths of one built asset set (all absolute)."""

    root: Path
    """Folder of this asset set: ``<cache root>/tiny-<build key>``."""
    model_dir: Path
    """HF model folder (config, safetensors, generation config); also holds the tokenizer files."""
    tokenizer_dir: Path
    """Tokenizer folder; equal to ``model_dir``."""
    train_parquet: Path
    """verl RL parquet, train split."""
    val_parquet: Path
    """verl RL parquet, val split."""
    reward_py: Path
    """File for verl's ``reward.custom_reward_function.path``."""
    reward_fn: str = "compute_score"
    """Function name for verl's ``reward.custom_reward_function.name``."""


def default_root() -> Path:
    """``$KLPPO_DATA_DIR`` if set, else ``~/.cache/klppo-recipes``."""
    env = envvars.getenv(envvars.DATA_DIR)
    return Path(env).expanduser() if env else Path("~/.cache/klppo-recipes").expanduser()


def _model_config() -> dict:
    config = json.loads(_TINY_CONFIG.read_text())
    config.update(bos_token_id=0, eos_token_id=1, pad_token_id=0)
    return config


def _build_key() -> str:
    recipe = {
        "version": ASSETS_VERSION,
        "config": _model_config(),
        "special_tokens": _SPECIAL_TOKENS,
        "chat_template": _CHAT_TEMPLATE,
        "seed": _SEED,
        "n_train": _N_TRAIN,
        "n_val": _N_VAL,
        "max_operand": _MAX_OPERAND,
        "corpus": [_N_ARITH_LINES, _N_WORD_LINES, _WORDS],
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def _paths(folder: Path) -> TinyAssets:
    model_dir = folder / "model"
    return TinyAssets(
        root=folder,
        model_dir=model_dir,
        tokenizer_dir=model_dir,
        train_parquet=folder / "data" / "train.parquet",
        val_parquet=folder / "data" / "val.parquet",
        reward_py=Path(_reward.__file__).resolve(),
    )


def ensure_tiny_assets(root: str | os.PathLike | None = None) -> TinyAssets:
    """Return the tiny asset set under ``root`` (default :func:`default_root`), building it first if missing."""
    base = Path(root).expanduser() if root is not None else default_root()
    target = (base / f"tiny-{_build_key()}").resolve()
    if (target / _DONE).is_file():
        return _paths(target)
    base.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tiny-build-", dir=base))
    try:
        _build(staging)
        try:
            os.rename(staging, target)  # atomic; fails if another process already put a complete set there
        except OSError:
            if not (target / _DONE).is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return _paths(target)


def _build(folder: Path) -> None:
    paths = _paths(folder)
    tokenizer = _build_tokenizer()
    tokenizer.save_pretrained(paths.model_dir)
    _build_model(paths.model_dir, vocab_size=len(tokenizer))
    _build_data(paths)
    (folder / _DONE).write_text(json.dumps({"build_key": _build_key(), "vocab_size": len(tokenizer)}, indent=2))


def _corpus(rng: random.Random) -> list[str]:
    """Text the BPE learns its merges from: arithmetic lines and English words.

    The mix sets how many of the 512 tokens are digit-only (~80): a random model's responses are then ~14% digits,
    which leaves the shaped reward room to climb and gives every sample group some spread.
    """
    lines = []
    for _ in range(_N_ARITH_LINES):
        a, b = rng.randint(0, _MAX_OPERAND), rng.randint(0, _MAX_OPERAND)
        lines.append(f"{a}+{b}={a + b}")
    for _ in range(_N_WORD_LINES):
        lines.append(" ".join(rng.choice(_WORDS) for _ in range(8)))
    return lines


def _build_tokenizer():
    from transformers import PreTrainedTokenizerFast  # lazy: seconds to import, only a first build needs it

    vocab_size = _model_config()["vocab_size"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=_SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_corpus(random.Random(_SEED)), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        model_max_length=2048,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = _CHAT_TEMPLATE
    assert len(tokenizer) <= vocab_size, f"tokenizer has {len(tokenizer)} tokens > vocab_size {vocab_size}"
    return tokenizer


def _build_model(model_dir: Path, vocab_size: int) -> None:
    import torch  # lazy: seconds to import, only a first build needs it
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM  # lazy: seconds, only a first build

    config = Qwen2Config(**{k: v for k, v in _model_config().items() if k not in ("architectures", "model_type")})
    assert config.vocab_size >= vocab_size
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_SEED)
        model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(bos_token_id=0, eos_token_id=1, pad_token_id=0)
    model.save_pretrained(model_dir, safe_serialization=True)


def _rows(rng: random.Random, n: int, split: str) -> list[dict]:
    rows = []
    for index in range(n):
        a, b = rng.randint(0, _MAX_OPERAND), rng.randint(0, _MAX_OPERAND)
        rows.append(
            {
                "data_source": _reward.DATA_SOURCE,
                "prompt": [{"role": "user", "content": f"{a}+{b}="}],
                "ability": "arithmetic",
                "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                "extra_info": {"split": split, "index": index, "a": a, "b": b},
            }
        )
    return rows


def _build_data(paths: TinyAssets) -> None:
    import pandas as pd  # lazy: a quarter of a second to import, only a first build writes the parquet files

    paths.train_parquet.parent.mkdir(parents=True, exist_ok=True)
    rng = random.Random(_SEED + 1)
    pd.DataFrame(_rows(rng, _N_TRAIN, "train")).to_parquet(paths.train_parquet, index=False)
    pd.DataFrame(_rows(rng, _N_VAL, "val")).to_parquet(paths.val_parquet, index=False)
