"""Ctrl-C while training, then the printed resume command: one run of the default GRPO recipe at world size 2
(``cluster.gpus_per_node=2``), stopped at step 3 and resumed for two more steps.

The stop: exit 130, no traceback, Ray ended, the last complete checkpoint named. The resume command
(``run.resume=<run folder>``) continues the run in its own folder: every step in metrics.jsonl exactly once, the KL
controller's state carried on, each launch's record kept, every weight sync checked by checksum on both sides.
The same run is the recipes' run at world size 2: the batch split over 2 ranks, rollout == actor at every step, and
each weight sync of a launch through the resharder (one hf server for both ranks, fed by rank 0; a server per rank is
verl's own main_ppo run at world size 2: tests/e2e/test_verl_cpu.py).
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from recipes.verl_ext.plugin.weight_sync import read_sync_log
from tests.conftest import SECOND_TRAINING_GROUP, checkout_env
from tests.e2e.checks import (
    Run,
    assert_every_sync_checked_by_checksum,
    assert_rollout_is_the_actor,
    assert_the_batch_is_split_over,
    assert_weight_sync_through_the_resharder,
    watch_recipe,
)

pytestmark = [pytest.mark.e2e, pytest.mark.ray, pytest.mark.slow, pytest.mark.xdist_group(SECOND_TRAINING_GROUP)]

COMMAND = ("trainer.save_freq=2", "cluster.gpus_per_node=2")


def _ray_sessions(below: int | None = None) -> set[str]:
    """The Ray sessions whose raylet runs on this machine; with ``below``, only those started by that process or its
    children (the run's own: other tests may run a Ray of their own meanwhile)."""
    procs = psutil.Process(below).children(recursive=True) if below else psutil.process_iter()
    sessions = set()
    for proc in procs:
        try:
            args = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if match := re.search(r"raylet\S*\s.*?--session-name=(\S+)", args):
            sessions.add(match.group(1))
    return sessions


def _sessions_left(sessions: set[str], within_s: float = 30.0) -> set[str]:
    """Those of ``sessions`` still running after ``within_s`` s (a raylet that ends takes its workers with it)."""
    deadline = time.monotonic() + within_s
    while (left := sessions & _ray_sessions()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


@dataclass
class Interrupted:
    """The interrupted launch (its exit code, streams, the Ray sessions it had and those left after it), what its
    run folder held then, and the resumed launch."""

    code: int
    out: str
    err: str
    sessions: set[str]
    sessions_left: set[str]
    run_dir: Path
    first_record: bytes
    steps_before: list[int]
    syncs_before: int
    resumed: subprocess.CompletedProcess

    def line(self, prefix: str) -> str:
        """The interrupted launch's stderr line that starts with ``prefix``, without it."""
        return next(line for line in self.err.splitlines() if line.startswith(prefix))[len(prefix):]

    @property
    def kept_step(self) -> int:
        return int(self.line("last complete checkpoint: ").rsplit("_", 1)[1])

    def as_run(self) -> Run:
        rows = [json.loads(line) for line in (self.run_dir / "metrics.jsonl").read_text().splitlines()]
        return Run(self.resumed.stdout, self.resumed.stderr, self.run_dir, [r["data"] for r in rows])


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory, recipe_cli) -> Interrupted:
    workdir = tmp_path_factory.mktemp("interrupted")
    # Ctrl-C as a terminal delivers it: a suite started in the background (`make test &`) hands its children SIGINT
    # ignored, and Python then leaves it ignored
    sessions: set = set()

    def ctrl_c_at_step_3(line: str, proc: subprocess.Popen) -> bool:
        if line.startswith("step 3/"):
            sessions.update(_ray_sessions(below=proc.pid))
            proc.send_signal(signal.SIGINT)
            return True
        return False

    launch = watch_recipe("grpo", COMMAND, workdir, checkout_env(), ctrl_c_at_step_3, timeout=300,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    left = _sessions_left(sessions)
    folders = list((workdir / "runs" / "grpo").glob("*/metrics.jsonl"))
    if not folders or "resume in the same folder: " not in launch.stderr:
        pytest.fail(f"the interrupted launch: exit {launch.code}\n{launch.stdout}\n{launch.stderr[-3000:]}")
    run_dir = folders[0].parent
    first_record = (run_dir / "resolved_config.yaml").read_bytes()
    steps_before = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    syncs_before = len(read_sync_log(run_dir / "weight_sync.jsonl"))
    stopped = Interrupted(launch.code, launch.stdout, launch.stderr, sessions, left, run_dir, first_record,
                          steps_before, syncs_before, resumed=None)
    argv = shlex.split(stopped.line("resume in the same folder: "))
    stopped.resumed = recipe_cli("grpo", *argv[3:], f"trainer.total_training_steps={stopped.kept_step + 2}",
                                 cwd=workdir, timeout=600)
    return stopped


def test_ctrl_c_stops_cleanly(interrupted):
    assert interrupted.code == 130, interrupted.err[-3000:]
    assert "Traceback" not in interrupted.err + interrupted.out and "KeyboardInterrupt" not in interrupted.err
    assert interrupted.sessions and not interrupted.sessions_left, "the run's Ray (and so verl's workers) outlived it"
    assert any(line.startswith("interrupted after step ") for line in interrupted.err.splitlines())
    run_dir, step = interrupted.run_dir, interrupted.kept_step  # the run may have gone on a step or two meanwhile
    assert interrupted.line("last complete checkpoint: ") == f"{run_dir}/checkpoints/global_step_{step}"
    assert step in (2, 4, 6)
    argv = shlex.split(interrupted.line("resume in the same folder: "))
    assert argv[:3] == ["python", "-m", "recipes.grpo"] and all(arg in argv for arg in COMMAND)
    assert argv[-1] == f"run.resume={run_dir}"


def test_the_resume_command_continues_the_run_in_its_folder(interrupted):
    resumed, run_dir, step = interrupted.resumed, interrupted.run_dir, interrupted.kept_step
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [p.parent for p in run_dir.parent.glob("*/metrics.jsonl")] == [run_dir]  # no new folder
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, step + 3))  # continuous, each step once
    assert [r.get("resume") for r in rows] == [None] * step + [1, 1]
    superseded = run_dir / "resume_1" / "metrics.superseded.jsonl"
    redone = [json.loads(line)["step"] for line in superseded.read_text().splitlines()] if superseded.exists() else []
    assert redone == [s for s in interrupted.steps_before if s > step]  # trained after the checkpoint: run again
    saved = json.loads((run_dir / "checkpoints" / f"global_step_{step}" / "kl_control.json").read_text())["state"]
    assert rows[step]["data"]["kl_control/loss_coef"] == saved["loss_coef"]
    # a restored controller, not a fresh one: the resumed launch's last checkpoint holds the whole run's history,
    # the first launch's steps included (a fresh controller would hold the resumed steps alone; the coefficient
    # itself may be back at its initial value at the checkpoint, 0.05 -> 0.0274 -> 0.05, and cannot tell)
    final = json.loads((run_dir / "checkpoints" / f"global_step_{step + 2}" / "kl_control.json").read_text())["state"]
    assert final["step"] == step + 2 and [h[0] for h in final["history"]] == list(range(1, step + 3))
    assert final["history"][:step] == saved["history"][:step]
    progress = [line.split("/")[0] for line in resumed.stdout.splitlines() if line.startswith("step ")]
    assert progress == [f"step {step + 1}", f"step {step + 2}"]  # earlier steps are not shown again as new
    assert (run_dir / "resolved_config.yaml").read_bytes() == interrupted.first_record  # the first record stays
    second = (run_dir / "resume_1" / "resolved_config.yaml").read_text()
    assert f"total_training_steps: {step + 2}" in second
    assert f"resume_from_path: {run_dir}/checkpoints/global_step_{step}" in second
    syncs = read_sync_log(run_dir / "weight_sync.jsonl")
    assert len({r["global_steps"] for r in syncs}) >= step + 2  # a sync per step, both launches
    assert_every_sync_checked_by_checksum(syncs)  # rank 0 feeds the server: both sides; rank 1: its training side
    bands = json.loads((run_dir / "bands.json").read_text())["summary"]
    assert {b["band"]: b["steps"] for b in bands}["kl_mean"] == step + 2  # the summary covers the whole run


def test_grpo_world_size_2(interrupted):
    run = interrupted.as_run()
    assert_the_batch_is_split_over(run, ranks=2)
    assert_rollout_is_the_actor(run)
    # the resumed launch's syncs (the interrupted one's last may have been cut short between the ranks)
    resumed_syncs = read_sync_log(interrupted.run_dir / "weight_sync.jsonl")[interrupted.syncs_before:]
    assert_weight_sync_through_the_resharder(resumed_syncs, world_size=2, rollout_tp=2, steps=2)
    assert "weight sync (" in run.stdout and " syncs, hybrid_engine resharder" in run.stdout
