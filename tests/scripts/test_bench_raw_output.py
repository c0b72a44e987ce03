"""``--out DIR`` of the benchmarks behind README figures (scripts/bench_plan.py, scripts/bench_validate.py,
scripts/bench_solve.py): the JSON
holds every sample and the environment (CPU count, versions, date, git commit, load average at the start), and
output.txt the terminal text.

bench_plan runs for real (one timed call per layout, well under a second); bench_validate's subprocesses are
replaced by fixed times, since what is checked is what it keeps, not what validation costs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

import bench_plan  # noqa: E402
import bench_solve  # noqa: E402
import bench_validate  # noqa: E402


def _environment_is_recorded(environment: dict) -> None:
    assert environment["host_cpus"] >= 1
    assert environment["python"] and environment["torch"] and environment["date_utc"].endswith("UTC")
    assert set(environment["load_average_at_start"]) == {"1min", "5min", "15min"}
    assert len(environment["git"]["sha"]) == 40 and isinstance(environment["git"]["dirty"], bool)


def test_bench_plan_out_keeps_every_call(tmp_path, capsys):
    assert bench_plan.main(["--repeat", "2", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "bench_plan.json").read_text())
    _environment_is_recorded(record["environment"])
    assert [case["gpus"] for case in record["cases"]] == [4096, 32]
    for case in record["cases"]:
        assert len(case["samples_s"]) == 2 and case["best_s"] == min(case["samples_s"]) and case["first_call_s"] > 0
        assert case["ok"] and case["errors"] == []
    printed = capsys.readouterr().out
    kept = (tmp_path / "output.txt").read_text()
    assert kept.splitlines()[0].startswith("deepseek_v3 @ 4096 GPUs: build_plan best") and kept in printed


def test_bench_validate_out_keeps_every_run(tmp_path, monkeypatch, capsys):
    ran = []

    def timed(command, cwd, env):
        ran.append(command)
        return 1.0 + len(ran) / 10

    monkeypatch.setattr(bench_validate, "timed", timed)
    assert bench_validate.main(["--repeats", "2", "--out", str(tmp_path), "model=tiny"]) == 0
    record = json.loads((tmp_path / "bench_validate.json").read_text())
    _environment_is_recorded(record["environment"])
    # the uncounted warm-up (1.1 s), then --cfg job and action=validate interleaved
    assert record["warmup_s"] == 1.1
    assert record["samples_s"] == {"--cfg job": [1.2, 1.4], "action=validate": [1.3, 1.5]}
    assert record["ratio"] == pytest.approx(1.4 / 1.3) and record["overrides"] == ["model=tiny"]
    assert record["commands"]["action=validate"] == ["-m", "recipes.grpo", "model=tiny", "action=validate"]
    kept = (tmp_path / "output.txt").read_text()
    assert "action=validate / --cfg job = 1.08x (grpo, 2 runs each, interleaved)" in kept
    assert kept in capsys.readouterr().out


def test_bench_solve_out_keeps_every_search(tmp_path, monkeypatch, capsys):
    """The smaller of its two requests only (the 4096-GPU search takes seconds a repeat on 2 cores)."""
    monkeypatch.setattr(bench_solve, "CASES", [case for case in bench_solve.CASES if case[0].startswith("qwen2_7b")])
    assert bench_solve.main(["--repeat", "2", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "bench_solve.json").read_text())
    _environment_is_recorded(record["environment"])
    (case,) = record["cases"]
    assert case["case"] == "qwen2_7b @ 16 GPUs" and len(case["samples_s"]) == 2 and case["ok"]
    assert case["median_s"] == pytest.approx(sum(case["samples_s"]) / 2) and case["fitting"] >= 1 and case["best"]
    kept = (tmp_path / "output.txt").read_text()
    assert kept.startswith("qwen2_7b @ 16 GPUs: solve median") and kept in capsys.readouterr().out
