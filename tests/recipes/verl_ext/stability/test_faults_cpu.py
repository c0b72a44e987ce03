"""Rollback on each real cause, end to end on the CPU embedded default: one run (``stability=auto``, 5 steps,
save_freq=2, ``kl=ramp`` over 4 steps, ``overlap=prefetch``, a planted secret), one fault per attempt.

attempt  fault                                                          reason expected
0        a NaN policy loss at step 3                                    nan_loss
1        torch's OutOfMemoryError raised in the actor worker's update   oom
         at step 3 (where a real one is raised)
2        NaN written into a weight tensor of the actor worker's model   nan_weights: the weight sync's check of step 3
         after step 3's update                                          names the tensor (before generation sees it)
3        SIGKILL of the real Ray worker process (``ray::WorkerDict``)   worker_lost (Ray's message mentions the OOM
         once step 3 is logged                                          killer: not an oom)
4        none: finishes steps 3-5                                       -

Every restart resumes from the step-2 checkpoint (attempt 1 with forward_prefetch off, the one degradation given);
metrics.jsonl holds each step once, the superseded rows aside; the ramp's target per step and the KL controller's
state come back exactly from the checkpoint; the planted ``+trainer.wandb_key`` appears in no file, terminal or Ray
log. Then the run's last record meets a full disk: ``os.replace`` of ``bands.json`` raises ENOSPC (a
``sitecustomize`` on the run's PYTHONPATH, where the pack's write happens): one line naming the path, exit 1, no
traceback, no temporary left, every checkpoint kept.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.conftest import checkout_env
from tests.e2e.checks import ray_workers, watch_recipe

pytestmark = [pytest.mark.e2e, pytest.mark.ray, pytest.mark.slow]

PLANTED = "sk-planted-0123456789abcdef"  # a secret-shaped value under a secret-shaped key: never written in clear

FULL_DISK = """
import errno, os
_replace = os.replace
def replace(src, dst, *args, **kwargs):
    if str(dst).endswith("bands.json"):
        raise OSError(errno.ENOSPC, "No space left on device", str(dst))
    return _replace(src, dst, *args, **kwargs)
os.replace = replace
"""

COMMAND = ("stability=auto", "trainer.total_training_steps=5", "trainer.save_freq=2", "stability.max_attempts=4",
           "stability.degradations=[forward_prefetch_off]", "kl=ramp", "kl.ramp.start=0.1", "kl.ramp.end=0.3",
           "kl.ramp.steps=4", "overlap=prefetch", f"+trainer.wandb_key={PLANTED}",
           "stability.inject.nan_at_step=3", "stability.inject.attempt=0",
           "stability.inject.oom_at_step=3", "stability.inject.oom_attempt=1",
           "stability.inject.nan_weights_at_step=3", "stability.inject.nan_weights_attempt=2")


@dataclass
class Rollbacks:
    code: int
    stdout: str
    stderr: str
    run_dir: Path
    started: float
    killed: list[psutil.Process]

    @functools.cached_property
    def attempts(self) -> list[dict]:
        return [json.loads(line) for line in (self.run_dir / "attempts.jsonl").read_text().splitlines()]

    @functools.cached_property
    def rows(self) -> list[dict]:
        return [json.loads(line) for line in (self.run_dir / "metrics.jsonl").read_text().splitlines()]

    def at(self, step: int) -> dict:
        return [r["data"] for r in self.rows if r["step"] == step][-1]


@pytest.fixture(scope="module")
def rollbacks(tmp_path_factory) -> Rollbacks:
    workdir = tmp_path_factory.mktemp("rollbacks")
    site = workdir / "full_disk"
    site.mkdir()
    (site / "sitecustomize.py").write_text(FULL_DISK)
    env = checkout_env()
    env["PYTHONPATH"] = os.pathsep.join([str(site), env["PYTHONPATH"]])
    started = time.time()
    killed: list[psutil.Process] = []
    failed = 0

    def kill_at_step_3_of_attempt_3(line: str, proc: subprocess.Popen) -> bool:
        nonlocal failed
        failed += line.startswith("stability: attempt ")
        if failed == 3 and line.startswith("step 3/") and not killed:
            killed.extend(ray_workers(proc.pid, "ray::WorkerDict"))
            assert killed, "no Ray worker of this run found"
            for worker in killed:
                worker.send_signal(signal.SIGKILL)
        return False  # watched to the end

    launch = watch_recipe("grpo", COMMAND, workdir, env, kill_at_step_3_of_attempt_3, timeout=900)
    folders = list((workdir / "runs" / "grpo").glob("*/attempts.jsonl"))
    if not folders:
        pytest.fail(f"no attempts.jsonl: exit {launch.code}\n{launch.stdout}\n{launch.stderr[-3000:]}")
    return Rollbacks(launch.code, launch.stdout, launch.stderr, folders[0].parent, started, killed)


def test_each_attempt_names_its_real_cause(rollbacks):
    attempts = rollbacks.attempts
    assert [a["outcome"] for a in attempts] == ["restart"] * 4 + ["finished"], rollbacks.stdout[-3000:]
    reasons = [a.get("reason") for a in attempts[:4]]
    assert reasons[0] == "nan_loss", attempts[0]
    assert reasons[1] == "oom" and "OutOfMemoryError" in attempts[1]["message"]
    assert reasons[2] == "nan_weights", attempts[2]
    assert "model.embed_tokens.weight holds" in attempts[2]["message"]  # the tensor the injection poisoned
    assert reasons[3] == "worker_lost", attempts[3]
    for num, reason in enumerate(("nan_loss", "oom", "nan_weights", "worker_lost")):
        assert f"attempt {num} failed ({reason}" in rollbacks.stdout
    assert all(not w.is_running() or w.status() == psutil.STATUS_ZOMBIE for w in rollbacks.killed)


def test_each_restart_resumes_from_the_last_checkpoint_degraded_once(rollbacks):
    attempts = rollbacks.attempts
    assert attempts[0]["checkpoints_after"] == [2]
    assert attempts[1]["degradations"] == ["forward_prefetch_off"]  # the one degradation given, then none more
    assert attempts[1]["changes"]["actor_rollout_ref.actor.fsdp_config.forward_prefetch"] == [True, False]
    assert [a["resumed_from_step"] for a in attempts[1:4]] == [2, 2, 2]
    config = (rollbacks.run_dir / "attempt_1_config.yaml").read_text()
    assert "forward_prefetch: false" in config and "forward_prefetch: true" not in config
    last = attempts[4]["resumed_from_step"]  # 2, or 4 when attempt 3 saved step 4 before its worker died
    assert last == max(attempts[3]["checkpoints_after"]) and attempts[-1]["checkpoints_after"][-1] == 5
    assert set(attempts[3]["checkpoints_after"]) <= set(attempts[-1]["checkpoints_after"])  # no checkpoint lost


def test_metrics_hold_each_step_once(rollbacks):
    rows, last = rollbacks.rows, rollbacks.attempts[4]["resumed_from_step"]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]  # each step once, continuous
    assert [r["attempt"] for r in rows] == [0, 0] + [3 if r["step"] <= last else 4 for r in rows[2:]]
    aside = [json.loads(line) for line in (rollbacks.run_dir / "metrics.superseded.jsonl").read_text().splitlines()]
    assert (3, 3) in {(r["attempt"], r["step"]) for r in aside}  # logged before the worker died, run again


def test_ramp_target_and_controller_state_survive_the_restarts(rollbacks):
    targets = [rollbacks.at(s)["kl_control/target"] for s in (1, 2, 3, 4, 5)]
    assert targets == pytest.approx([0.1, 0.15, 0.2, 0.25, 0.3])
    saved = json.loads((rollbacks.run_dir / "checkpoints/global_step_2/kl_control.json").read_text())["state"]
    resumed = rollbacks.at(3)  # logged by attempt 3, after loading the step-2 checkpoint
    assert resumed["kl_control/loss_coef"] == saved["loss_coef"] == rollbacks.at(2)["kl_control/next_loss_coef"]
    assert resumed["kl_control/target"] == saved["target"]


def test_a_planted_secret_appears_nowhere(rollbacks):
    """The run typed +trainer.wandb_key=<a key-shaped secret>: not in any file of its run folder (configs, logs,
    checkpoints, records), not on its terminal, not in Ray's session logs (verl's TaskRunner prints the config
    there)."""
    planted = PLANTED.encode()
    assert "wandb_key: '***'" in (rollbacks.run_dir / "attempt_1_config.yaml").read_text()
    leaked = [str(p) for p in rollbacks.run_dir.rglob("*") if p.is_file() and planted in p.read_bytes()]
    assert not leaked
    assert PLANTED not in rollbacks.stdout + rollbacks.stderr
    ray_logs = [p for p in Path(tempfile.gettempdir(), "ray").glob("session_*/logs/*")
                if p.is_file() and p.stat().st_mtime >= rollbacks.started]  # this run's sessions
    assert ray_logs, "Ray's session logs were not found"
    assert not [str(p) for p in ray_logs if planted in p.read_bytes()]


def test_then_a_full_disk_is_one_line(rollbacks):
    run_dir = rollbacks.run_dir
    assert rollbacks.code == 1, f"{rollbacks.stdout[-3000:]}\n{rollbacks.stderr[-3000:]}"
    assert rollbacks.stderr.strip().splitlines()[-1] == (
        f"could not write {run_dir}/bands.json: no space left on device (the file is left as it was; free space, "
        "then resume the run)")
    assert "Traceback" not in rollbacks.stderr and not list(run_dir.glob(".bands.json.tmp-*"))
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("global_step_*")) == [
        f"global_step_{s}" for s in rollbacks.attempts[-1]["checkpoints_after"]]
