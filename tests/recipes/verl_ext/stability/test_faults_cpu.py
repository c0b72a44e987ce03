"""Rollback on real causes, end to end on the CPU embedded default (``stability=auto``, 5 steps, save_freq=2).

attempt  fault                                                          reason expected
0        torch's OutOfMemoryError raised in the actor worker's update   oom
         at step 3 (where a real one is raised)
1        NaN written into a weight tensor of the actor worker's model   nan_weights: the weight sync's check of step 3
         after step 3's update                                          names the tensor (before generation sees it)
2        SIGKILL of the real Ray worker process (``ray::WorkerDict``)   worker_lost (Ray's message mentions the OOM
         once step 3 is logged                                          killer: not an oom)
3        none: finishes steps 3-5                                       -

Every restart resumes from the step-2 checkpoint; metrics.jsonl holds each step once, the superseded rows aside.
Then the run's last record meets a full disk: ``os.replace`` of ``bands.json`` raises ENOSPC (a ``sitecustomize`` on
the run's PYTHONPATH, where the pack's write happens): one line naming the path, exit 1, no traceback, no temporary
left, every checkpoint kept.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import psutil
import pytest

from tests.conftest import checkout_env
from tests.e2e.checks import ray_workers

pytestmark = [pytest.mark.e2e, pytest.mark.ray, pytest.mark.slow]


FULL_DISK = """
import errno, os
_replace = os.replace
def replace(src, dst, *args, **kwargs):
    if str(dst).endswith("bands.json"):
        raise OSError(errno.ENOSPC, "No space left on device", str(dst))
    return _replace(src, dst, *args, **kwargs)
os.replace = replace
"""


def test_rollback_names_the_real_cause_and_writes_each_step_once_then_a_full_disk_is_one_line(tmp_path):
    command = [sys.executable, "-m", "recipes.grpo", "stability=auto", "trainer.total_training_steps=5",
               "trainer.save_freq=2", "stability.degradations=[forward_prefetch_off]",
               "stability.inject.oom_at_step=3", "stability.inject.oom_attempt=0",
               "stability.inject.nan_weights_at_step=3", "stability.inject.nan_weights_attempt=1"]
    site = tmp_path / "full_disk"
    site.mkdir()
    (site / "sitecustomize.py").write_text(FULL_DISK)
    env = checkout_env()
    env["PYTHONPATH"] = os.pathsep.join([str(site), env["PYTHONPATH"]])
    proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed, seen, failed = [], [], 0
    for line in proc.stdout:
        seen.append(line)
        failed += line.startswith("stability: attempt ")
        if failed == 2 and line.startswith("step 3/") and not killed:
            killed = ray_workers(proc.pid, "ray::WorkerDict")
            assert killed, "no Ray worker of this run found"
            for worker in killed:
                worker.send_signal(signal.SIGKILL)
    out, err = proc.communicate(timeout=900)
    stdout = "".join(seen) + out
    run_dir = next((tmp_path / "runs" / "grpo").glob("*/attempts.jsonl")).parent
    assert proc.returncode == 1, f"{stdout[-3000:]}\n{err[-3000:]}"
    assert err.strip().splitlines()[-1] == (f"could not write {run_dir}/bands.json: no space left on device (the file "
                                            "is left as it was; free space, then resume the run)")
    assert "Traceback" not in err and not list(run_dir.glob(".bands.json.tmp-*"))
    attempts = [json.loads(line) for line in (run_dir / "attempts.jsonl").read_text().splitlines()]
    assert [a["outcome"] for a in attempts] == ["restart", "restart", "restart", "finished"]
    reasons = [a.get("reason") for a in attempts[:3]]
    assert reasons[0] == "oom" and "OutOfMemoryError" in attempts[0]["message"]
    assert reasons[1] == "nan_weights", attempts[1]
    assert "model.embed_tokens.weight holds" in attempts[1]["message"]  # the tensor the injection poisoned
    assert reasons[2] == "worker_lost", attempts[2]
    assert [a["resumed_from_step"] for a in attempts[1:3]] == [2, 2]
    last = attempts[3]["resumed_from_step"]  # 2, or 4 when attempt 2 saved step 4 before the worker died
    assert last == max(attempts[2]["checkpoints_after"]) and attempts[-1]["checkpoints_after"][-1] == 5
    assert set(attempts[2]["checkpoints_after"]) <= set(attempts[-1]["checkpoints_after"])  # no checkpoint lost
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]  # each step once, continuous
    assert [r["attempt"] for r in rows] == [0, 0] + [2 if r["step"] <= last else 3 for r in rows[2:]]
    aside = [json.loads(line) for line in (run_dir / "metrics.superseded.jsonl").read_text().splitlines()]
    assert (2, 3) in {(r["attempt"], r["step"]) for r in aside}  # logged before the worker died, run again
    assert "attempt 2 failed (worker_lost" in stdout and "attempt 0 failed (oom" in stdout
    assert all(not w.is_running() or w.status() == psutil.STATUS_ZOMBIE for w in killed)
