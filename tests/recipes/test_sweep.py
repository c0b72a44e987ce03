"""A local -m sweep runs every job, a failing one included, and ends with a summary and sweep_results.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import SECOND_TRAINING_GROUP
from tests.readme import check_block
from tests.recipes.conftest import sweep_records

START, END = "<!-- sweep output: tests/recipes/test_sweep.py -->", "<!-- end of sweep output -->"
COMMAND = ["-m", "actor_rollout_ref.rollout.n=0,2", "action=validate"]


def _record(tmp_path, recipe: str = "grpo") -> dict:
    records = sweep_records(tmp_path, recipe)
    assert len(records) == 1, records
    return json.loads(records[0].read_text())


def test_a_bad_job_is_reported_and_the_next_one_runs(tmp_path, recipe_cli):
    proc = recipe_cli("grpo", *COMMAND, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "config error: actor_rollout_ref.rollout.n: must be a positive integer, got 0" in proc.stderr
    assert "Traceback" not in proc.stderr
    jobs = _record(tmp_path)["jobs"]
    assert [(j["num"], j["status"], j["exit_code"]) for j in jobs] == [(0, "invalid", 2), (1, "ok", 0)]
    assert (tmp_path / jobs[1]["run_dir"] / "resolved_config.yaml").is_file()
    assert "sweep: 1 of 2 jobs ok" in proc.stdout
    rows = proc.stdout.split("sweep: 1 of 2 jobs ok")[1].splitlines()[2:]
    assert rows[0].split()[:3] == ["0", "invalid", "2"] and "actor_rollout_ref.rollout.n=0" in rows[0]
    assert any(r.split()[:3] == ["1", "ok", "0"] and "actor_rollout_ref.rollout.n=2" in r for r in rows)
    _compare_with_readme(proc.stdout.splitlines(), tmp_path)


def _compare_with_readme(stdout_lines: list[str], workdir: Path) -> None:
    """The README's local-sweep sample is this run's summary (numbers and folders masked)."""
    start = next(i for i, line in enumerate(stdout_lines) if line.startswith("sweep: "))
    lines = [line.replace(f"{workdir}/", "") for line in stdout_lines[start:] if line.strip()]
    check_block(START, END, [f"$ {' '.join(['python -m recipes.grpo', *COMMAND])}", "..."], lines)


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
