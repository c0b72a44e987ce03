"""A local -m sweep runs every job, one that fails while it runs included, and ends with a summary and
sweep_results.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import SECOND_TRAINING_GROUP
from tests.readme import check_block
from tests.recipes.conftest import sweep_records

START, END = "<!-- sweep output: tests/recipes/test_sweep.py -->", "<!-- end of sweep output -->"
COMMAND = ["-m", "action=plan", "cluster=h100_80g", "parallel=tp1", "model=llama3_1_70b,qwen2_5_0_5b"]
"""Two plans, both valid configs: a 70B model on one node without offload does not fit (the plan exits 2), the 0.5B
one does. A job whose config is invalid refuses the whole sweep before any job runs (tests/recipes/
test_sweep_checks.py); a job that fails while it runs is reported and the next one runs."""


def _record(tmp_path, recipe: str = "grpo") -> dict:
    records = sweep_records(tmp_path, recipe)
    assert len(records) == 1, records
    return json.loads(records[0].read_text())


def test_a_failing_job_is_reported_and_the_next_one_runs(tmp_path, recipe_cli):
    proc = recipe_cli("grpo", *COMMAND, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "does not fit" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr
    jobs = _record(tmp_path)["jobs"]
    assert [(j["num"], j["status"], j["exit_code"]) for j in jobs] == [(0, "failed", 2), (1, "ok", 0)]
    assert all((tmp_path / j["run_dir"] / "resolved_config.yaml").is_file() for j in jobs)
    assert "sweep: 1 of 2 jobs ok" in proc.stdout
    rows = proc.stdout.split("sweep: 1 of 2 jobs ok")[1].splitlines()[2:]
    assert rows[0].split()[:3] == ["0", "failed", "2"] and "model=llama3_1_70b" in rows[0]
    assert any(r.split()[:3] == ["1", "ok", "0"] and "model=qwen2_5_0_5b" in r for r in rows)
    _compare_with_the_docs(proc.stdout.splitlines(), tmp_path)


def _compare_with_the_docs(stdout_lines: list[str], workdir: Path) -> None:
    """docs/clusters.md's local-sweep sample is this run's summary (numbers and folders masked)."""
    start = next(i for i, line in enumerate(stdout_lines) if line.startswith("sweep: "))
    lines = [line.replace(f"{workdir}/", "") for line in stdout_lines[start:] if line.strip()]
    check_block(START, END, [f"$ {' '.join(['python -m recipes.grpo', *COMMAND])}", "..."], lines,
                page="clusters.md")


@pytest.mark.e2e
@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.xdist_group(SECOND_TRAINING_GROUP)  # the sweep's run is shared with test_stability_cpu.py
def test_a_local_training_sweep_finishes_every_job(training_sweep):
    """Ray is shut down and the environment restored between jobs of one process: the second job trains too (the
    sweep: tests/recipes/conftest.py ``training_sweep``)."""
    proc = training_sweep.proc
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    jobs = training_sweep.jobs
    assert [(j["status"], j["exit_code"]) for j in jobs] == [("ok", 0), ("ok", 0)]
    assert "kl=adaptive" in jobs[0]["overrides"] and "kl=fixed" in jobs[1]["overrides"]
    for num, job in enumerate(jobs):
        rows = (training_sweep.run_dir(num) / "metrics.jsonl").read_text().splitlines()
        last = json.loads(rows[-1])
        assert len(rows) == 2 and last["data"]["critic/score/mean"] == pytest.approx(job["reward"])
        assert job["kl"] == pytest.approx(last["data"]["actor/kl_loss"])
        assert "\ncurves: " in training_sweep.stdout_of(num)  # each job summed up
    assert "sweep: 2 of 2 jobs ok" in proc.stdout
