"""Assertions both end-to-end files make about a CPU run (through the recipes, and through verl's own main_ppo)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from recipes.verl_ext.plugin.weight_sync import read_sync_log

SYNCED_GAP = 1e-5
"""Largest |p_rollout - p_actor| (and |KL|) a synced step may show: the rollout generated with the actor's weights."""
DIFF_MAX = "training/rollout_probs_diff_max"
DIFF_MEAN = "training/rollout_probs_diff_mean"
ROLLOUT_KL = "rollout_corr/kl"


@dataclass
class Watched:
    """A recipe launch watched line by line: its exit code and the terminal's two streams, whole."""

    code: int
    stdout: str
    stderr: str


def watch_recipe(recipe: str, args, cwd: Path, env: dict, at_line: Callable[[str, subprocess.Popen], bool],
                 timeout: float, **popen) -> Watched:
    """``python -m recipes.<recipe> *args`` in ``cwd``; ``at_line(line, process)`` sees each stdout line as the user
    would, and may act on the process (a signal, a killed worker); it returns True to stop watching, then the launch
    runs to its end (``timeout`` s)."""
    proc = subprocess.Popen([sys.executable, "-m", f"recipes.{recipe}", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if at_line(line, proc):
            break
    out, err = proc.communicate(timeout=timeout)
    return Watched(proc.returncode, "".join(seen) + out, err)


@dataclass
class Run:
    """A recipe's training run as a user sees it: the terminal's two streams, the run folder, one dict per step."""

    stdout: str
    stderr: str
    run_dir: Path
    metrics: list[dict]

    def series(self, key: str) -> list[float]:
        return [m[key] for m in self.metrics if key in m]


def assert_rollout_is_the_actor(result) -> None:
    """At every step verl's ``training/rollout_probs_diff_max`` (the largest |p_rollout - p_actor| over response
    tokens) and ``|rollout_corr/kl|`` stay below :data:`SYNCED_GAP`. ``result``: anything with ``metrics`` (one dict
    per step) and ``series(key)``."""
    gaps = result.series(DIFF_MAX)
    assert len(gaps) == len(result.metrics), "the hf rollout returned no log-probs"
    assert max(gaps) < SYNCED_GAP, f"rollout/actor probability gap per step: {gaps}"
    kls = result.series(ROLLOUT_KL)
    assert len(kls) == len(result.metrics) and max(abs(kl) for kl in kls) < SYNCED_GAP, f"rollout/actor KL: {kls}"


def assert_the_batch_is_split_over(result, ranks: int) -> None:
    """verl balances each step's batch over the data-parallel ranks: each holds 1/ranks of the step's tokens; and
    every rank's update moved the weights (a positive gradient norm at every step)."""
    for step in result.metrics:
        assert step["global_seqlen/mean"] * ranks == pytest.approx(step["perf/total_num_tokens"], abs=1)
    assert all(norm > 0 for norm in result.series("actor/grad_norm"))


def assert_weight_sync_through_the_resharder(log: Path | list[dict], *, world_size: int, rollout_tp: int,
                                             steps: int) -> None:
    """Every weight sync (one before step 1, one after each step) ran through the resharder on every rank: the
    bytes counted at its collectives equal the planner's; a rank that feeds a rollout server received what it lacked
    of the model, any other rank nothing. ``log``: the run's weight_sync.jsonl, or some of its records (one launch's
    of a resumed run)."""
    records = read_sync_log(log) if isinstance(log, Path) else log
    assert records, f"no weight sync was logged in {log}"
    syncs = sorted({r["global_steps"] for r in records})
    assert len(syncs) >= steps, f"{len(syncs)} weight syncs logged for {steps} steps"
    for step in syncs:
        ranks = sorted(r["rank"] for r in records if r["global_steps"] == step)
        assert ranks == list(range(world_size)), f"sync before step {step}: ranks {ranks} logged"
    for record in records:
        assert record["scheme"] == "gather_to_feeders", record
        assert record["received_bytes"] == record["planned_bytes"], record
        assert record["feeder"] == (record["rank"] % rollout_tp == 0), record
        if not record["feeder"]:
            assert record["received_bytes"] == 0 and record["tensors"] == 0, record
        elif world_size > 1:
            assert record["received_bytes"] > 0 and record["tensors"] > 0, record


def assert_every_sync_checked_by_checksum(records: list[dict]) -> None:
    """Each weight sync's check: a rank that feeds a server compared checksums on both sides and they matched; a rank
    that feeds none checked its training side only."""
    for sync in records:
        check = sync["extra"]["checksum"]
        assert check["tensors"] > 0, sync
        if sync["feeder"]:
            assert check["checked"] == "both sides" and check["match"] is True, sync
        else:
            assert check["checked"].startswith("training side only"), sync


def ray_workers(root_pid: int, title: str) -> list[psutil.Process]:
    """The processes named ``title`` (Ray sets ``ray::<actor class>``, and ``ray::<actor class>.<method>`` while a
    method runs) below ``root_pid``: one run's only, whatever else runs on the machine."""
    found = []
    for child in psutil.Process(root_pid).children(recursive=True):
        try:
            name = (child.cmdline() or [""])[0]
            if name == title or name.startswith(f"{title}."):
                found.append(child)
        except psutil.Error:
            continue
    return found


def step_lines(stdout: str) -> list[str]:
    """The step lines a run printed, each step's wall time cut off: what two runs of one command must print alike."""
    return [re.sub(r"\s+[0-9.]+ s$", "", line) for line in stdout.splitlines() if line.startswith("step ")]
