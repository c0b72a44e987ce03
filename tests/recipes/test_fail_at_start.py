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
def test_refused_before_anything_starts(tmp_path, recipe_cli, argv, expected):
    (tmp_path / "a_file").write_text("not a folder\n")
    (tmp_path / "elsewhere").mkdir()
    proc = recipe_cli("grpo", *argv, cwd=tmp_path, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert lines[-1].startswith(expected.format(tmp=tmp_path, up=tmp_path.parent)), lines
    assert "Traceback" not in proc.stderr and "training:" not in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "elsewhere"]  # no run folder, nothing started
    assert not list(tmp_path.parent.glob("20*-*-*_*-*-*"))  # run.name=../..: nothing written above run.root
