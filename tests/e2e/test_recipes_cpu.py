"""The recipes end to end on CPU: `python -m recipes.grpo|kl_ppo` runs verl 0.9.1's own (v1) trainer with the
embedded default (FSDP2 over gloo, the plugin's hf rollout, the tiny model and task), as a user types it. Each run
here is also a run that ends badly, so that one launch proves two things.

run                         stopped by              asserted
GRPO, world size 1 (demo)   -                       tests/e2e/test_demo.py: the demo exactly as `make demo` runs it
GRPO, world size 2          Ctrl-C after step 3,    tests/e2e/test_interrupt.py: the batch is split over 2 ranks;
  (one hf server)             then resumed          rollout == actor; weight sync through the resharder, rank 0 feeds
                                                    (a server per rank: verl's own main_ppo at world size 2,
                                                    tests/e2e/test_verl_cpu.py)
KL-PPO, weight sync off     its Ray worker          the critic trains (vf_loss > 0); in-reward KL is 0 at step 1, then
                              SIGKILLed after       > 0, and the terminal shows it with verl's in-reward coefficient;
                              step 3                the rollout/actor gap is 0 at step 1, then > 100x the synced bound.
                                                    The stop: one line with the worker, the last checkpoint and the
                                                    resume command (recipes/run/interrupt.py ``lost_worker_line``)

Without weight sync the rollout keeps the initial weights while the actor trains; what KL-PPO adds (the critic, KL
to the reference in the reward) is computed by the actor and the critic on whatever was generated, so the run
without sync proves both. A scheduler's SIGTERM is taken as Ctrl-C: tests/recipes/test_clear_ends.py (the handler)
and tests/recipes/verl_ext/test_worker_secrets.py (it survives a real ``ray.init``).

"rollout == actor": verl's training/rollout_probs_diff_max (largest |p_rollout - p_actor| over response tokens) and
|rollout_corr/kl| stay below 1e-5: the hf rollout generated with the weights the actor trains. The weight sync is read
from the run folder's weight_sync.jsonl (one line per rank per sync, bytes measured at the collectives and planned).
A run stopped after step 3 may have logged step 4 before it ended: the checks read the steps it logged.
"""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from recipes.verl_ext.plugin.hf_rollout import SYNC_WEIGHTS_ENV
from tests.conftest import SECOND_TRAINING_GROUP, checkout_env
from tests.e2e.checks import (
    DIFF_MAX,
    SYNCED_GAP,
    Run,
    ray_workers,
    watch_recipe,
)

pytestmark = [pytest.mark.e2e, pytest.mark.ray, pytest.mark.slow, pytest.mark.xdist_group(SECOND_TRAINING_GROUP)]


@dataclass
class Stopped(Run):
    """A run stopped from outside after step 3: what :class:`Run` holds, and its exit code."""

    code: int = 0

    def lines(self, prefix: str) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith(prefix)]


def stop_after_step_3(workdir: Path, recipe: str, *overrides: str, stop: Callable[[subprocess.Popen], object],
                      env: dict | None = None) -> Stopped:
    """``python -m recipes.<recipe> *overrides`` (6 steps, a checkpoint every second) in ``workdir``;
    ``stop(process)`` once the terminal shows step 3 (the step-2 checkpoint is complete by then)."""
    def at_step_3(line: str, proc: subprocess.Popen) -> bool:
        if line.startswith("step 3/"):
            stop(proc)
            return True
        return False

    launch = watch_recipe(recipe, ["trainer.total_training_steps=6", "trainer.save_freq=2", *overrides], workdir,
                          checkout_env(env), at_step_3, timeout=600)
    folders = sorted((workdir / "runs" / recipe).glob("*/metrics.jsonl"))
    if not folders:
        pytest.fail(f"{recipe} {overrides}: exit {launch.code}, no metrics\n{launch.stdout}\n{launch.stderr[-3000:]}")
    rows = [json.loads(line) for line in folders[-1].read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1)) and len(rows) >= 3
    return Stopped(launch.stdout, launch.stderr, folders[-1].parent, [r["data"] for r in rows], code=launch.code)


PROCESSES: dict[str, set[int]] = {}
"""The unsynced run's process ids at step 3: ``train`` (verl's actor workers), ``generate`` (the rollout server)."""


@pytest.fixture(scope="module")
def unsynced(tmp_path_factory) -> Stopped:
    # weight sync off; verl's Ray worker (the actor, ray::WorkerDict) SIGKILLed after step 3; before that, the
    # processes that train and the one that generates (the hf server, ray::HFServer) are recorded
    def kill_workers(proc: subprocess.Popen) -> None:
        workers = ray_workers(proc.pid, "ray::WorkerDict")
        assert workers, "no Ray worker of this run found"
        PROCESSES["train"] = {worker.pid for worker in workers}
        PROCESSES["generate"] = {server.pid for server in ray_workers(proc.pid, "ray::HFServer")}
        for worker in workers:
            worker.send_signal(signal.SIGKILL)

    # an in-reward coefficient that starts apart from the loss-side one (both 0.05 in task=tiny): the terminal's
    # coefficient can be told to be the in-reward one
    return stop_after_step_3(tmp_path_factory.mktemp("unsynced"), "kl_ppo", "algorithm.kl_ctrl.kl_coef=0.03",
                             stop=kill_workers, env={SYNC_WEIGHTS_ENV: "0"})


def test_kl_ppo_trains_the_critic_with_kl_in_the_reward(unsynced):
    steps = len(unsynced.metrics)
    assert all(loss > 0 for loss in unsynced.series("critic/vf_loss"))
    assert len(unsynced.series("critic/values/mean")) == steps
    penalty = unsynced.series("actor/reward_kl_penalty")
    # the in-reward estimate (log-ratio, k1) is 0 at step 1 (the actor is the reference) and moves after; without
    # sync the rollout samples from the initial weights, the reference's: its mean, E_ref[log pi/pi_ref], is
    # -KL(ref || actor) <= 0
    assert penalty[0] == pytest.approx(0, abs=1e-6), f"in-reward KL per step: {penalty}"
    assert max(abs(p) for p in penalty[1:]) > 1e-3 and sum(penalty[1:]) < 0, f"in-reward KL per step: {penalty}"
    # an in-reward KL at or below 0 says nothing of its level: the controller holds the in-reward coefficient (0.03
    # as typed) where every step's is; the terminal shows that coefficient, the one verl applied, not the loss-side
    # one the step also logs (0.05, unused in KL-PPO)
    coef, loss_coef = unsynced.series("actor/reward_kl_penalty_coeff"), unsynced.series("kl_control/loss_coef")
    assert all(c == pytest.approx(0.03) for c in coef) and all(c == pytest.approx(0.05) for c in loss_coef), (
        coef, loss_coef)
    step_lines = [line for line in unsynced.stdout.splitlines() if line.startswith("step ")]
    assert 3 <= len(step_lines) <= steps, step_lines  # a step logged while the run stopped may go unprinted
    for line, kl, applied in zip(step_lines, penalty[:len(step_lines)], coef[:len(step_lines)], strict=True):
        assert f"kl {kl:.4f} (coef {applied:.4g})" in line, (line, kl, applied)


def test_generation_never_runs_in_a_training_process(unsynced):
    """verl 0.9.1 samples in its rollout servers (the pack's hf server here, vLLM's server and engine core on a GPU),
    never in the actor's process: generation cannot move the trainer's RNG, so the actor needs no RNG swap around it
    (the source article's switch; the pack's ModeSwitch did it, on no path a run takes, and was removed)."""
    assert PROCESSES["train"] and PROCESSES["generate"]
    assert not PROCESSES["train"] & PROCESSES["generate"]


def test_without_weight_sync_the_gap_grows(unsynced):
    gaps = unsynced.series(DIFF_MAX)
    assert gaps[0] < SYNCED_GAP, "before the first update the rollout and the actor hold the same weights"
    # from the second step on the rollout still holds the initial weights: every step sits far above the synced bound
    assert all(gap > 100 * SYNCED_GAP for gap in gaps[1:]), f"gap per step without sync: {gaps}"
    assert not (unsynced.run_dir / "weight_sync.jsonl").exists(), "with sync off no rank moves any weights"


def test_a_worker_killed_mid_run_ends_with_one_line(unsynced):
    assert unsynced.code == 1, unsynced.stderr[-3000:]
    assert "Traceback" not in unsynced.stderr
    (last,) = unsynced.lines("training stopped after ")  # one line
    run = unsynced.run_dir
    assert last.startswith("training stopped after step ") and ": ray::WorkerDict (pid " in last
    assert f"last complete checkpoint: {run}/checkpoints/global_step_" in last
    argv = shlex.split(last.split("; resume: ", 1)[1].split(" (stability=auto", 1)[0])
    assert argv[1:5] == ["-m", "recipes.kl_ppo", "trainer.total_training_steps=6", "trainer.save_freq=2"]
    assert argv[-1] == f"run.resume={run}"
