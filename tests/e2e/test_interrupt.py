"""Ctrl-C while training: exit 130, no traceback, Ray ended, the last complete checkpoint named, and the printed
resume command (``run.resume=<run folder>``) continues the run in its own folder: every step in metrics.jsonl
exactly once, the KL controller's state carried on, each launch's record kept, every weight sync checked by
checksum on both sides."""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import checkout_env

pytestmark = [pytest.mark.e2e, pytest.mark.ray, pytest.mark.slow]


def _ray_sessions() -> set[str]:
    """The Ray sessions whose raylet runs on this machine (a cluster another test started is one of them)."""
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return {m.group(1) for m in re.finditer(r"raylet\S*\s.*?--session-name=(\S+)", out)}


def _sessions_left(before: set[str], within_s: float = 30.0) -> set[str]:
    """The Ray sessions started since ``before`` still running after ``within_s`` s (a raylet that ends takes its
    workers with it)."""
    deadline = time.monotonic() + within_s
    while (left := _ray_sessions() - before) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def test_ctrl_c_stops_cleanly_and_the_resume_command_continues(tmp_path, recipe_cli):
    command = [sys.executable, "-m", "recipes.grpo", "trainer.save_freq=2"]
    before = _ray_sessions()
    # Ctrl-C as a terminal delivers it: a suite started in the background (`make test &`) hands its children SIGINT
    # ignored, and Python then leaves it ignored
    proc = subprocess.Popen(command, cwd=tmp_path, env=checkout_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("step 3/"):
            proc.send_signal(signal.SIGINT)
            break
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err + out and "KeyboardInterrupt" not in err
    assert not _sessions_left(before), "the interrupted run's Ray (and so verl's workers) outlived it"
    run_dir = next((tmp_path / "runs" / "grpo").glob("*/metrics.jsonl")).parent
    lines = err.splitlines()
    assert any(line.startswith("interrupted after step ") for line in lines)
    kept = next(line for line in lines if line.startswith("last complete checkpoint: ")).split(": ", 1)[1]
    step = int(kept.rsplit("_", 1)[1])  # the run may have gone on a step or two while the signal arrived
    assert kept == f"{run_dir}/checkpoints/global_step_{step}" and step in (2, 4, 6)
    resume = next(line for line in lines if line.startswith("resume in the same folder: "))
    argv = shlex.split(resume.split(": ", 1)[1])
    assert argv[:3] == ["python", "-m", "recipes.grpo"] and "trainer.save_freq=2" in argv
    assert argv[-1] == f"run.resume={run_dir}"
    first_record = (run_dir / "resolved_config.yaml").read_bytes()
    seen_before = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]

    resumed = recipe_cli("grpo", *argv[3:], f"trainer.total_training_steps={step + 2}", cwd=tmp_path, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [p.parent for p in (tmp_path / "runs" / "grpo").glob("*/metrics.jsonl")] == [run_dir]  # no new folder
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, step + 3))  # continuous, each step once
    assert [r.get("resume") for r in rows] == [None] * step + [1, 1]
    superseded = run_dir / "resume_1" / "metrics.superseded.jsonl"
    redone = [json.loads(line)["step"] for line in superseded.read_text().splitlines()] if superseded.exists() else []
    assert redone == [s for s in seen_before if s > step]  # trained after the checkpoint: kept aside, run again
    saved = json.loads((run_dir / "checkpoints" / f"global_step_{step}" / "kl_control.json").read_text())["state"]
    assert rows[step]["data"]["kl_control/loss_coef"] == saved["loss_coef"]
    progress = [line.split("/")[0] for line in resumed.stdout.splitlines() if line.startswith("step ")]
    assert progress == [f"step {step + 1}", f"step {step + 2}"]  # earlier steps are not shown again as new
    assert (run_dir / "resolved_config.yaml").read_bytes() == first_record  # the first launch's record stays
    second = (run_dir / "resume_1" / "resolved_config.yaml").read_text()
    assert f"total_training_steps: {step + 2}" in second and f"resume_from_path: {kept}" in second
    syncs = [json.loads(line) for line in (run_dir / "weight_sync.jsonl").read_text().splitlines()]
    checks = [r["extra"]["checksum"] for r in syncs]
    assert len({r["global_steps"] for r in syncs}) >= step + 2  # a sync per step, both launches
    assert all(c["checked"] == "both sides" and c["match"] is True and c["tensors"] > 0 for c in checks)
    bands = json.loads((run_dir / "bands.json").read_text())["summary"]
    assert {b["band"]: b["steps"] for b in bands}["kl_mean"] == step + 2  # the summary covers the whole run
