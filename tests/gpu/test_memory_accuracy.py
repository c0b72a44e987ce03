"""The memory model against the peaks one H200 measured (scripts/gpu/results/2026-12-01-h200-memory), on the CPU.

Each recorded row is re-planned here from its own composed config (``plan_accuracy.memory_matrix_rows``): the memory
model evaluated at the micro-batches verl formed in that pass must be within 15% of the measured
``torch.cuda.max_memory_allocated``; the plan of the configuration (micro-batches at their configured size) must be
within 15% where the configured size is what ran (dynamic budgets below the batch) and above the measurement where
it is an upper bound (fixed micro-batches are planned padded to prompt + response; an auto budget larger than the
batch holds is planned full).
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


def _rows(name: str) -> list[dict]:
    from recipes.resolvers import register_resolvers

    register_resolvers()
    return plan_accuracy.memory_matrix_rows(json.loads((RESULTS / name).read_text()))


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return [row for name in ("memory.json", "speed.json", "speed7b_8l.json") for row in _rows(name)]


def test_the_matrix_holds_every_row_the_issue_asks(rows):
    names = {row["run"].split()[-1] for row in rows}
    assert {"fixed", "dynamic_3x", "dynamic_8x", "dynamic_16x", "fixed_no_ckpt", "dynamic_8x_no_ckpt"} <= names
    phases = {row["phase"] for row in rows}
    assert phases == {"log-prob pass, entropy", "log-prob pass, no entropy", "update pass"}
    assert len(rows) == 32


def test_model_at_the_measured_micro_batches_within_15_percent(rows):
    worst = max(rows, key=lambda r: abs(r["model_at_measured_bytes"] / r["measured_bytes"] - 1))
    for row in rows:
        error = row["model_at_measured_bytes"] / row["measured_bytes"] - 1
        assert abs(error) <= TARGET, (row["run"], row["phase"], f"{error:+.1%}")
    assert abs(worst["model_at_measured_bytes"] / worst["measured_bytes"] - 1) > 0.05  # the table is not trivial


def test_plan_of_the_configuration(rows):
    for row in rows:
        name = row["run"].split()[-1]
        error = row["planned_bytes"] / row["measured_bytes"] - 1
        if name.startswith("dynamic"):
            assert abs(error) <= TARGET, (row["run"], row["phase"], f"{error:+.1%}")
        else:  # fixed: padded to prompt + response; auto: the budget exceeds the batch's tokens
            assert error >= -0.01, (row["run"], row["phase"], f"{error:+.1%}")


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


@pytest.mark.parametrize("record", ["speed.json", "speed7b_8l.json"])
def test_auto_budget_speed_up_recorded(record):
    data = json.loads((RESULTS / record).read_text())
    speed = data["speed"]
    assert speed["speedup_both_passes"] >= 1.4
    seq = data["batch"]["max_prompt"] + data["batch"]["max_response"]
    assert speed["auto"]["ppo_max_token_len_per_gpu"] > 16 * seq


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
