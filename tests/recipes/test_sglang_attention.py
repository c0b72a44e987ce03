"""Issue 50: rollout=sglang with a model whose head width flashinfer has no kernel for. verl 0.9.1 starts SGLang
0.5.12 and later on flashinfer unless engine_kwargs.sglang.attention_backend names another backend (its
async_sglang_server.py), and flashinfer's kernels are compiled for head_dim 64, 128 and 256 (its DISPATCH_HEAD_DIM).
On one H100 (2026-12-07, scripts/gpu/results/2026-12-07-h100-sglang/tiny_flashinfer/) the tiny model's head_dim 16
stopped SGLang's server while it captured CUDA graphs, after Ray and the training workers had started; with
attention_backend=triton it trained. So: refused before Ray, as typed, naming the override that runs it; the tiny
model's preset names triton itself. The expected lines are written out here, not computed by recipes.check."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from hybrid_engine.model_spec import MODEL_CONFIG_DIR, load_arch
from recipes.check import lookups

GPU_RUN = ("rollout=sglang", "cluster=h100_80g", "cluster.gpus_per_node=1", "parallel=tp1", "task=tiny",
           "action=validate")
KEY = "actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend"


def _narrow_model(folder):
    """A local model folder of the tiny architecture: hidden 64 over 4 heads, head_dim 16."""
    folder.mkdir()
    config = json.loads((MODEL_CONFIG_DIR / "tiny" / "config.json").read_text())
    assert (config["hidden_size"], config["num_attention_heads"]) == (64, 4)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.slow
def test_a_head_width_flashinfer_lacks_is_refused_before_ray_naming_the_override(tmp_path, recipe_cli):
    work = tmp_path / "work"
    work.mkdir()
    model = _narrow_model(tmp_path / "narrow")
    proc = recipe_cli("grpo", *GPU_RUN, f"actor_rollout_ref.model.path={model}", cwd=work, timeout=400)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "Traceback" not in out and "Started a local Ray instance" not in out
    assert list(work.iterdir()) == [], "a refused run leaves nothing behind"
    assert proc.stderr.strip().splitlines() == [
        "config error: actor_rollout_ref.rollout.name: sglang, on flashinfer (verl 0.9.1's choice where "
        "actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend is unset), has attention kernels for "
        "head_dim 64, 128, 256; narrow has head_dim 16: add "
        "+actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=triton"]

    # the override the line names, typed as it says: accepted, and in the config verl gets
    proc = recipe_cli("grpo", *GPU_RUN, f"actor_rollout_ref.model.path={model}", f"+{KEY}=triton", cwd=work,
                      timeout=400)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    (resolved,) = work.glob("runs/grpo/*/resolved_config.yaml")
    assert OmegaConf.select(OmegaConf.load(resolved), KEY) == "triton"


@pytest.mark.slow
def test_the_tiny_model_runs_sglang_on_triton_and_says_which_key_when_it_is_unset(tmp_path, recipe_cli):
    proc = recipe_cli("grpo", *GPU_RUN, "model=tiny", cwd=tmp_path, timeout=400)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    (resolved,) = tmp_path.glob("runs/grpo/*/resolved_config.yaml")
    assert OmegaConf.select(OmegaConf.load(resolved), KEY) == "triton"

    # the preset's key unset by hand: the line names it without the '+' (the key is in the config already)
    work = tmp_path / "again"
    work.mkdir()
    proc = recipe_cli("grpo", *GPU_RUN, "model=tiny", f"{KEY}=null", cwd=work, timeout=400)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].endswith(
        "; tiny has head_dim 16: add actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=triton")


def _container(engine: str, **sglang) -> dict:
    return {"actor_rollout_ref": {"rollout": {"name": engine, "engine_kwargs": {"sglang": sglang}}}}


@pytest.mark.parametrize("model", ["qwen2_5_0_5b", "qwen2_5_7b", "llama3_1_8b", "qwen3_30b_a3b"])
def test_the_shipped_models_head_widths_pass_on_flashinfer(model):
    assert lookups.sglang_attention_problems(_container("sglang"), load_arch(model)) == []


def test_only_sglang_without_a_named_backend_is_checked():
    tiny = load_arch("tiny")
    assert tiny.head_dim == 16
    assert lookups.sglang_attention_problems(_container("vllm"), tiny) == []
    assert lookups.sglang_attention_problems(_container("hf"), tiny) == []
    assert lookups.sglang_attention_problems(_container("sglang", attention_backend="fa3"), tiny) == []
    assert lookups.sglang_attention_problems(_container("sglang"), None) == []  # no architecture read: not guessed
    assert len(lookups.sglang_attention_problems(_container("sglang"), tiny)) == 1
