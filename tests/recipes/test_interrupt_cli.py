"""Ctrl-C outside training's own stop (issue 49, 6), as a user meets it: ``python -m recipes.grpo`` interrupted while
it validates, after its record is written, and twice while Ray starts. Each is exit 130, one line on stderr, no
traceback, no run folder where none was made and no process left running. (Ctrl-C while training, with its
checkpoint and resume command: tests/e2e/test_interrupt.py.)

The moment inside a launch is reached without guessing at timings: a ``sitecustomize`` on the child's PYTHONPATH
(tests only) pauses the launch when it opens a given file, as the user's launch would be paused by reading a slow
disk, and says so in a marker file; the test then sends SIGINT, as a terminal's Ctrl-C does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import checkout_env

PAUSE = '''
import os, sys, time

_at, _marker = os.environ.get("KLPPO_TEST_PAUSE_AT"), os.environ.get("KLPPO_TEST_PAUSED")


def _pause(event, args):
    global _at
    if event == "open" and _at and isinstance(args[0], (str, bytes, os.PathLike)) and _at in os.fsdecode(args[0]):
        _at = None  # once
        with open(_marker, "w") as f:
            f.write(os.fsdecode(args[0]))
        time.sleep(120)  # until Ctrl-C


if _at and _marker:
    sys.addaudithook(_pause)
'''


def _launch(args, cwd: Path, env: dict | None = None) -> subprocess.Popen:
    # Ctrl-C as a terminal delivers it: a suite started in the background hands its children SIGINT ignored
    return subprocess.Popen([sys.executable, "-m", "recipes.grpo", *args], cwd=cwd, env=checkout_env(env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _paused_at(tmp_path: Path, at: str, *args: str) -> subprocess.CompletedProcess:
    """``python -m recipes.grpo *args`` in ``tmp_path/work``, Ctrl-C while it opens a file whose path holds ``at``."""
    hook, work = tmp_path / "hook", tmp_path / "work"
    hook.mkdir()
    work.mkdir()
    (hook / "sitecustomize.py").write_text(PAUSE)
    marker = tmp_path / "paused"
    env = {"PYTHONPATH": os.pathsep.join([checkout_env()["PYTHONPATH"], str(hook)]),
           "KLPPO_TEST_PAUSE_AT": at, "KLPPO_TEST_PAUSED": str(marker)}
    proc = _launch(args, work, env)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), f"never opened {at}: exit {proc.poll()}"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.slow  # a child process: 5-6 s on 2 cores
def test_ctrl_c_while_validating_is_one_line_exit_130_and_leaves_nothing(tmp_path):
    # validation reads the model's config.json (the tiny demo model's, in its cache folder): Ctrl-C right then
    proc = _paused_at(tmp_path, "/model/config.json", "action=validate")
    assert proc.returncode == 130
    assert proc.stderr == "interrupted before the run started: nothing was written and nothing is left running\n"
    assert proc.stdout == ""
    assert list((tmp_path / "work").iterdir()) == []  # no runs/, no run folder


@pytest.mark.slow  # a child process: 5-6 s on 2 cores
def test_ctrl_c_after_the_run_folder_is_made_says_where_it_stays(tmp_path):
    # the job has begun: its record is being written
    proc = _paused_at(tmp_path, "resolved_config.yaml", "action=validate")
    (run_dir,) = (tmp_path / "work" / "runs" / "grpo").iterdir()
    assert proc.returncode == 130 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[-1] == f"interrupted (action=validate); the run folder stays: {run_dir}"
    assert not (run_dir / "run.lock").exists()  # released: a later run.resume= or hydra.run.dir= is not refused


class Descendants:
    """Every process started under ``pid`` while it runs (polled), by pid and start time."""

    def __init__(self, pid: int):
        self.pid = pid
        self.seen: dict[int, tuple[float, str]] = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        while not self.done.is_set():
            try:
                children = psutil.Process(self.pid).children(recursive=True)
            except psutil.Error:
                return
            for child in children:
                if child.pid not in self.seen:
                    try:
                        self.seen[child.pid] = (child.create_time(), " ".join(child.cmdline()))
                    except psutil.Error:
                        continue
            time.sleep(0.05)

    def names(self) -> list[str]:
        return [cmd for _, cmd in list(self.seen.values())]

    def alive(self) -> list[psutil.Process]:
        found = []
        for pid, (started, _) in list(self.seen.items()):
            try:
                proc = psutil.Process(pid)
                if abs(proc.create_time() - started) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
            except psutil.Error:
                continue
        return found


@pytest.mark.slow  # 15-25 s on 2 cores: the CPU demo up to Ray's start
@pytest.mark.ray
@pytest.mark.parametrize("to", ["driver", "terminal"])
def test_two_ctrl_c_while_ray_starts_leave_no_process(tmp_path, to):
    """The default demo, Ctrl-C once Ray's agents are starting and again 0.5 s later: to the launch's process (a
    ``kill -INT``), or to its whole process group (a terminal's Ctrl-C reaches Ray's processes too)."""
    proc = _launch([], tmp_path)
    watch = Descendants(proc.pid)
    try:
        deadline = time.monotonic() + 180
        while proc.poll() is None and time.monotonic() < deadline and not any(
                "DashboardAgent" in name or "dashboard/agent.py" in name for name in watch.names()):
            time.sleep(0.05)
        assert proc.poll() is None, f"ended before Ray started: exit {proc.returncode}"
        for _ in range(2):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT) if to == "terminal" else proc.send_signal(signal.SIGINT)
            time.sleep(0.5)
        out, err = proc.communicate(timeout=120)
        watch.done.set()
        _, left = psutil.wait_procs(watch.alive(), timeout=5)  # a process on its way out
        assert not left, f"left running: {[(p.pid, p.ppid(), watch.seen[p.pid][1][:200]) for p in left]}"
    finally:
        watch.done.set()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for leftover in watch.alive():  # ours: started by this launch
            leftover.kill()
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    lines = [line for line in err.splitlines() if not line.startswith(("no GPU found:", "nccl env for every worker"))]
    assert len(lines) == 1 and lines[0].startswith("interrupted "), err[-3000:]
