"""Failures at start, as a user meets them: ``python -m recipes.grpo ...`` (action=train, the default) exits 2 with
one line naming the key, no traceback, before Ray or verl start, and leaves no folder behind."""

from __future__ import annotations

import pytest

CASES = [
    (["+monitor.bands.grad_norm.low=2", "monitor.bands.grad_norm.high=1"],
     "config error: monitor.bands.grad_norm.low: 2 > monitor.bands.grad_norm.high 1: no value is inside the band"),
    (["monitor.bands.entropy.unstable=high"],
     "config error: monitor.bands.entropy.unstable: 'high' but monitor.bands.entropy.high is null: that side has no "
     "bound to leave"),
    (["monitor.bands.grad_norm.high=nan"], "config error: monitor.bands.grad_norm.high: nan is not a finite number"),
    (["run.name=../.."], "config error: run.name=../..: the run folder {up}/20"),
    (["run.root=a_file/runs"], "config error: run.root=a_file/runs: cannot create run folders under it: "
                               "{tmp}/a_file is a file"),
    (["run.resume=elsewhere"], "config error: run.resume=elsewhere: not a run folder (no resolved_config.yaml"),
]


@pytest.mark.parametrize(("argv", "expected"), CASES, ids=[c[0][-1] for c in CASES])
def test_refused_before_anything_starts(tmp_path, recipe_main, argv, expected):
    (tmp_path / "a_file").write_text("not a folder\n")
    (tmp_path / "elsewhere").mkdir()
    proc = recipe_main("grpo", *argv, cwd=tmp_path, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert lines[-1].startswith(expected.format(tmp=tmp_path, up=tmp_path.parent)), lines
    assert "Traceback" not in proc.stderr and "training:" not in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "elsewhere"]  # no run folder, nothing started
    assert not list(tmp_path.parent.glob("20*-*-*_*-*-*"))  # run.name=../..: nothing written above run.root


def test_resume_of_a_run_whose_latest_checkpoint_is_damaged_offers_the_previous_one(tmp_path, recipe_main):
    from tests.recipes.test_checkpoints import _checkpoint, _run_folder

    run = _run_folder(tmp_path)
    good = _checkpoint(run, 2)
    damaged = _checkpoint(run, 4)
    model = damaged / "actor" / "model_world_size_1_rank_0.pt"
    with open(model, "r+b") as f:
        f.truncate(4096)  # a model file cut short
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    proc = recipe_main("grpo", f"run.resume={run}", cwd=tmp_path, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"config error: run.resume={run}: the latest checkpoint {damaged} is damaged: "
        f"actor/model_world_size_1_rank_0.pt is 4096 bytes, {2 << 20} when saved (truncated or overwritten); the "
        f"previous complete one is {good}: add trainer.resume_from_path={good} to resume from it (stability=auto "
        "takes it by itself)")
    assert "Traceback" not in proc.stderr
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before  # nothing created in the run folder


def test_resume_of_a_run_that_is_still_running_is_refused(tmp_path, recipe_main):
    import json
    import os
    import socket

    from tests.recipes.test_checkpoints import _checkpoint, _run_folder

    run = _run_folder(tmp_path)
    _checkpoint(run, 2)
    holder = {"pid": os.getpid(), "host": socket.gethostname()}  # this test's process: alive
    (run / "run.lock").write_text(json.dumps(holder))
    proc = recipe_main("grpo", f"run.resume={run}", cwd=tmp_path, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"config error: run.resume={run}: {run} is in use by process {os.getpid()} on {holder['host']} "
        f"({run}/run.lock; it goes when that run ends)")
    assert not (run / "resume_1").exists() and "Traceback" not in proc.stderr
