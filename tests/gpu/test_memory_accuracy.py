"""The memory model against the peaks one H200 measured (scripts/gpu/results/2026-12-01-h200-memory), on the CPU.

Each recorded row is re-planned here from its own composed config (``plan_accuracy.memory_matrix_rows``): the memory
model evaluated at the micro-batches verl formed in that pass must be within 15% of the measured
``torch.cuda.max_memory_allocated``; the plan of the configuration (micro-batches at their configured size) must be
within 15% where the configured size is what ran (dynamic budgets below the batch) and above the measurement where
it is an upper bound (fixed micro-batches are planned padded to prompt + response; an auto budget larger than the
batch holds is planned full).

The model's one measured constant, ``hybrid_engine.plan.memory.ENTROPY_EAGER_BYTES``, was fitted on the rows in
``FITTED``; ``test_the_entropy_constant_comes_from_the_fitted_rows`` re-derives it from them, and the accuracy checks
run on every other row (held out), the padded entropy rows of another batch and another model shape among them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "scripts" / "gpu" / "results" / "2026-12-01-h200-memory"
sys.path.insert(0, str(REPO / "scripts" / "gpu"))

import plan_accuracy  # noqa: E402

TARGET = 0.15
RECORDS = ("memory.json", "speed.json", "speed7b_8l.json")
ENTROPY = "log-prob pass, entropy"

# (record, row, pass) the constant ENTROPY_EAGER_BYTES was fitted on: "padded micro-batches (no remove-padding) run
# verl's eager entropy_from_logits over the padded logits: 14.0 B per entry in all at both micro-batch sizes"
# (docs/performance.md section 4; the constant's docstring, commit b6c0cda, which recorded memory.json only: speed.json
# and speed7b_8l.json came later, in 6fbb688 and 1e933ca). The two sizes are memory.json's fixed (32 sequences per
# log-prob micro-batch) and fixed_8_16 (16); fixed_no_ckpt's log-prob pass is the same pass as fixed's (checkpointing
# only changes the update), so it is in-sample too.
FITTED = frozenset({
    ("memory.json", "fixed", ENTROPY),
    ("memory.json", "fixed_8_16", ENTROPY),
    ("memory.json", "fixed_no_ckpt", ENTROPY),
})
# the padded rows with entropy that the fit never saw: another batch (0.5B) and another model shape (7B, 8 layers)
ENTROPY_OUT_OF_SAMPLE = (("speed.json", "fixed", ENTROPY), ("speed7b_8l.json", "fixed", ENTROPY))


def _key(record: str, row: dict) -> tuple[str, str, str]:
    return record, row["run"].split()[-1], row["phase"]


def _rows(name: str) -> dict[tuple[str, str, str], dict]:
    from recipes.compose.resolvers import register_resolvers

    register_resolvers()
    return {_key(name, row): row for row in plan_accuracy.memory_matrix_rows(json.loads((RESULTS / name).read_text()))}


def _error(row: dict, key: str = "model_at_measured_bytes") -> float:
    return row[key] / row["measured_bytes"] - 1


@pytest.fixture(scope="module")
def keyed_rows() -> dict[tuple[str, str, str], dict]:
    return {key: row for name in RECORDS for key, row in _rows(name).items()}


@pytest.fixture(scope="module")
def rows(keyed_rows) -> list[dict]:
    return list(keyed_rows.values())


@pytest.fixture(scope="module")
def held_out(keyed_rows) -> dict[tuple[str, str, str], dict]:
    return {key: row for key, row in keyed_rows.items() if key not in FITTED}


def _constant_each_row_implies(monkeypatch, keyed_rows, keys) -> dict[tuple[str, str, str], float]:
    """The value of ENTROPY_EAGER_BYTES that makes the model equal the measurement on each row: the model at the
    measured micro-batches is linear in the constant (the entropy term is tokens * vocab * constant), so the rows at
    the module's value and at one other give its slope."""
    import hybrid_engine.plan.memory as memory

    base, other = memory.ENTROPY_EAGER_BYTES, memory.ENTROPY_EAGER_BYTES + 8
    monkeypatch.setattr(memory, "ENTROPY_EAGER_BYTES", other)
    at_other = {key: row for name in {k[0] for k in keys} for key, row in _rows(name).items() if key in keys}
    implied = {}
    for key in keys:
        y_base, y_other = keyed_rows[key]["model_at_measured_bytes"], at_other[key]["model_at_measured_bytes"]
        slope = (y_other - y_base) / (other - base)
        assert slope > 0, (key, "the row does not depend on the constant")
        implied[key] = base + (keyed_rows[key]["measured_bytes"] - y_base) / slope
    return implied


def test_the_entropy_constant_comes_from_the_fitted_rows(monkeypatch, keyed_rows):
    """ENTROPY_EAGER_BYTES is what the FITTED rows measured, and nothing else: solved on each of them, it rounds to the
    module's value."""
    from hybrid_engine.plan.memory import ENTROPY_EAGER_BYTES

    assert FITTED <= keyed_rows.keys(), FITTED - keyed_rows.keys()
    implied = _constant_each_row_implies(monkeypatch, keyed_rows, FITTED)
    shown = {key[1]: f"{value:.3f}" for key, value in implied.items()}
    for value in implied.values():
        assert round(value) == ENTROPY_EAGER_BYTES, (shown, ENTROPY_EAGER_BYTES)


def test_held_out_model_at_the_measured_micro_batches_within_15_percent(held_out):
    assert len(held_out) == 29  # 32 rows, 3 fitted
    worst_key = max(held_out, key=lambda key: abs(_error(held_out[key])))
    worst = f"worst held-out: {worst_key} {_error(held_out[worst_key]):+.1%}"
    for key, row in held_out.items():
        assert abs(_error(row)) <= TARGET, (key, f"{_error(row):+.1%}", worst)
    assert abs(_error(held_out[worst_key])) > 0.05, worst  # the table is not trivial


def test_the_entropy_constant_out_of_sample(monkeypatch, keyed_rows, held_out):
    """The padded rows with entropy the constant was not fitted on (another batch, another model shape): the model
    holds them, and each of them alone would have given the same constant to within one byte per entry."""
    from hybrid_engine.plan.memory import ENTROPY_EAGER_BYTES

    assert set(ENTROPY_OUT_OF_SAMPLE) <= held_out.keys()
    implied = _constant_each_row_implies(monkeypatch, keyed_rows, set(ENTROPY_OUT_OF_SAMPLE))
    for key in ENTROPY_OUT_OF_SAMPLE:
        error = _error(held_out[key])
        assert abs(error) <= 0.05, (key, f"{error:+.1%}")
        assert abs(implied[key] - ENTROPY_EAGER_BYTES) < 1, (key, f"implies {implied[key]:.2f} B per entry")


def test_held_out_plan_of_the_configuration(held_out):
    for key, row in held_out.items():
        error = _error(row, "planned_bytes")
        if key[1].startswith("dynamic"):
            assert abs(error) <= TARGET, (key, f"{error:+.1%}")
        else:  # fixed: padded to prompt + response; auto: the budget exceeds the batch's tokens
            assert error >= -0.01, (key, f"{error:+.1%}")


def test_a_whole_7b_on_one_h200_does_not_fit_and_the_plan_says_so():
    """Its fixed arm ran out of GPU memory (AdamW's step: fp32 weights, grads, two moments and one temporary)."""
    from hybrid_engine.groups import hybrid_groups
    from hybrid_engine.layout import InferLayout, TrainLayout
    from hybrid_engine.model_spec import build_spec
    from hybrid_engine.plan.budget import auto_token_budgets
    from hybrid_engine.plan.settings import ClusterSpec, PlanSettings

    record = json.loads((RESULTS / "speed7b_full_oom.json").read_text())
    assert "OutOfMemoryError" in record["rows"]["fixed"]["error"]
    spec = build_spec("qwen2_5_7b")
    groups = hybrid_groups(TrainLayout(dp=1).resolve(1), InferLayout(tp=1).resolve(1), fsdp=True)
    cluster = ClusterSpec(nnodes=1, gpus_per_node=1, memory_gib=record["environment"]["gpu_memory_bytes"] / 2**30)
    settings = PlanSettings(max_prompt_length=512, max_response_length=1024, has_ref=False)
    auto = auto_token_budgets(spec, groups, cluster, settings, spec.numel * 2)
    assert not auto["fits"] and auto["limits"]["update"] == "does not fit one sequence"


@pytest.mark.slow  # child processes
def test_bench_memory_records_the_micro_batches_verl_formed(tmp_path):
    """The benchmark's logic on the CPU (tiny model): each pass records its micro-batches; a dynamic one never holds
    more real tokens than its budget, a fixed one computes its padding (count x longest)."""
    import subprocess

    done = subprocess.run(
        [sys.executable, "scripts/gpu/bench_memory.py", "--out", str(tmp_path), "--device", "cpu", "--model", "tiny",
         "--parts", "memory", "--rows", "fixed,dynamic_3x", "--batch", "32", "--max-prompt", "32",
         "--max-response", "64", "--prompt-min", "8", "--response-median", "20", "--no-torch-compile"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads((tmp_path / "memory.json").read_text())["rows"]
    dynamic, fixed = rows["dynamic_3x"], rows["fixed"]
    assert dynamic["ppo_max_token_len_per_gpu"] == 3 * 96
    for key in ("log_prob_entropy", "log_prob_no_entropy", "update"):
        (call,) = dynamic[key]["micro_batches"]
        assert len(call["real"]) >= 2 and max(call["real"]) <= 3 * 96
        (call,) = fixed[key]["micro_batches"]
        assert all(p >= r for p, r in zip(call["padded"], call["real"], strict=True))
    assert len(fixed["update"]["micro_batches"][0]["real"]) == 32 // fixed["ppo_micro_batch_size_per_gpu"]
