"""Ctrl-C (SIGINT) or SIGTERM while training: a clean stop that says what was kept and how to go on.

verl's trainer and Ray are ended (``recipes.run.train.run_verl`` shuts Ray down on the way out), no traceback is
printed, and the terminal gets: the last step logged, the last complete checkpoint (the pack's completeness marker,
:mod:`recipes.run.checkpoints`), and the command that continues the run in its own folder from it (``run.resume=``,
:mod:`recipes.run.resume`: the same step numbering, the KL controller's state, metrics appended). Exit code 130, as a
shell gives an interrupted command.

No process started while training outlives it (:func:`sigterm_as_interrupt`): a Ctrl-C while Ray starts (its agents
do not yet watch their raylet) or a second one that cuts Ray's own shutdown short would leave Ray's agents or the
dashboard's processes running with parent 1; this process keeps them as its own (a subreaper, on Linux) and ends
those still running when training is left. Ctrl-C anywhere else (composing, validating, before training) is one line
and exit 130 too (:func:`exits_on_ctrl_c`, on the entry point): :class:`Interrupted` carries what the line says.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import re
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from recipes.run.monitor import read_metrics
from recipes.run.resume import resumable_checkpoint
from recipes.verl_ext.stability.faults import classify

EXIT_CODE = 130
# typed for the interrupted launch; the resume command chooses its own
RESUME_KEYS = ("run.resume=", "trainer.resume_mode=", "trainer.resume_from_path=")


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, with the one line that tells the user what was kept (:func:`exits_on_ctrl_c` prints it)."""

    def __init__(self, line: str):
        super().__init__(line)
        self.line = line


def exits_on_ctrl_c(fallback: Callable[[], str]) -> Callable:
    """Decorate an entry point: a KeyboardInterrupt out of it is one line on stderr (an :class:`Interrupted`'s own,
    else what ``fallback()`` says) and exit 130, no traceback. Once it leaves so (or with exit 130 of its own: an
    interrupted training), a further Ctrl-C is ignored: one that came while Python shuts down would end the process
    by the signal instead of with its exit code, and one before that with a traceback."""

    def decorate(main: Callable) -> Callable:
        @functools.wraps(main)
        def run(*args, **kwargs):
            try:
                return main(*args, **kwargs)
            except KeyboardInterrupt as stop:
                _ignore_ctrl_c()
                print(stop.line if isinstance(stop, Interrupted) else fallback(), file=sys.stderr, flush=True)
                sys.exit(EXIT_CODE)
            except SystemExit as done:
                if done.code == EXIT_CODE:
                    _ignore_ctrl_c()
                raise

        return run

    return decorate


def _ignore_ctrl_c() -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextlib.contextmanager
def sigterm_as_interrupt(metrics_path: Path | None = None, every_s: float = 2.0):
    """For the block, SIGTERM (a scheduler's stop) is handled as Ctrl-C; the previous handlers come back after (a
    signal the process was started ignoring stays ignored). The processes started inside the block (Ray's
    gcs_server, raylet, dashboard and agents, verl's workers, what they start) that still run when it is left are
    ended then (:func:`end_leftovers`), with Ctrl-C ignored while that goes on; on Linux this process is their
    subreaper meanwhile, so one whose parent ended (a Ray agent whose raylet was stopped) stays among its descendants.

    With ``metrics_path``: once interrupted, a step logged after that is evidence that the KeyboardInterrupt was
    swallowed on its way up (inside verl or Ray), so the interrupt is raised again, until the block is left."""
    asked = threading.Event()
    left = threading.Event()

    def interrupt(signum, frame):
        if metrics_path is not None and not asked.is_set():
            asked.set()
            steps = len(read_metrics(metrics_path))  # now, in the handler: the steps logged before the interrupt
            threading.Thread(target=_again_while_training,
                             args=(metrics_path, steps, left, every_s, threading.get_ident()),
                             name="interrupt-again", daemon=True).start()
        raise KeyboardInterrupt

    # a SIGINT ignored by whoever started this process (nohup, a background job) stays ignored
    wanted = [sig for sig in (signal.SIGTERM, signal.SIGINT) if signal.getsignal(sig) is not signal.SIG_IGN]
    since = time.time()
    subreaper = _subreaper(True)
    previous = {sig: signal.signal(sig, interrupt) for sig in wanted}
    try:
        yield
    finally:
        left.set()
        for sig in previous:  # the leftovers end first: a Ctrl-C meanwhile does not cut that short
            signal.signal(sig, signal.SIG_IGN)
        while True:
            try:
                end_leftovers(since)
                break
            except KeyboardInterrupt:  # came before the handlers above were set: once more, whole
                continue
        _subreaper(subreaper)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


_PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 36, 37


def _subreaper(on: bool) -> bool:
    """Linux: from now on, a descendant whose parent ends is handed to this process (``on``) instead of to process 1,
    or no longer. Returns whether this process was a subreaper before (False where it cannot be one)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        before = ctypes.c_int(0)
        libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(before), 0, 0, 0)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)
        return bool(before.value)
    except (OSError, AttributeError):
        return False


def leftovers(since: float) -> list[psutil.Process]:
    """This process's descendants started at ``since`` (``time.time()``) or later that still run, less the helper
    processes of its own ``multiprocessing`` (they serve it until it exits)."""
    own = _multiprocessing_helpers()
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if (proc.pid not in own and proc.create_time() >= since - 0.5  # its start time counts in clock ticks
                    and proc.status() != psutil.STATUS_ZOMBIE):
                found.append(proc)
        except psutil.Error:  # gone meanwhile
            continue
    return found


def _multiprocessing_helpers() -> set[int]:
    pids = set()
    tracker = sys.modules.get("multiprocessing.resource_tracker")
    if tracker is not None:
        pids.add(getattr(tracker._resource_tracker, "_pid", None))
    forkserver = sys.modules.get("multiprocessing.forkserver")
    if forkserver is not None:
        pids.add(getattr(forkserver._forkserver, "_forkserver_pid", None))
    return pids - {None}


def end_leftovers(since: float, grace_s: float = 1.0, rounds: int = 3) -> list[psutil.Process]:
    """End this process's descendants started since ``since`` that still run (:func:`leftovers`): Ray's own
    shutdown first where this process's Ray is still up (a second Ctrl-C cut it short), then SIGTERM, and SIGKILL for
    those still there after ``grace_s``; again for any started meanwhile (a raylet that was starting workers).
    Returns those ended (reaped where they were this process's children)."""
    found = leftovers(since)
    ray = sys.modules.get("ray")  # imported: this process ran Ray
    if found and ray is not None and ray.is_initialized():
        with contextlib.suppress(Exception):
            ray.shutdown()
    ended: list[psutil.Process] = []
    for _ in range(rounds):
        found = leftovers(since)
        if not found:
            break
        for proc in found:
            with contextlib.suppress(psutil.Error):
                proc.terminate()
        _, alive = psutil.wait_procs(found, timeout=grace_s)
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(alive, timeout=5.0)
        ended += found
    return ended


def _again_while_training(metrics_path: Path, steps: int, left: threading.Event, every_s: float, main: int) -> None:
    while not left.wait(every_s):
        logged = len(read_metrics(metrics_path))
        if logged > steps:  # training went on: the interrupt did not arrive
            steps = logged
            signal.pthread_kill(main, signal.SIGINT)  # to the main thread: it wakes from a blocking call


def last_checkpoint(run_dir: Path, checkpoints: Path) -> Path | None:
    """The checkpoint the run goes on from (``run.resume=``): the latest complete one whose step is in the run's
    metrics.jsonl (an interrupt between verl's save of step N and its log of step N leaves N unlogged), or None."""
    return resumable_checkpoint(Path(run_dir) / "metrics.jsonl", checkpoints)


def resume_command(command: list[str], run_dir: Path) -> list[str]:
    """``command`` continued in ``run_dir``: its resume keys replaced by ``run.resume=<run_dir>``."""
    kept = [arg for arg in command if not arg.lstrip("+").startswith(RESUME_KEYS)]
    return [*kept, f"run.resume={run_dir}"]


def interrupted_lines(run_dir: Path, checkpoints: Path, command: list[str]) -> list[str]:
    """What to tell the user after an interrupted run: the last step, the checkpoint kept, the resume command."""
    rows = read_metrics(Path(run_dir) / "metrics.jsonl")
    kept = last_checkpoint(run_dir, checkpoints)
    if kept is None:  # nothing to go on from: one line
        if not rows:
            return [f"interrupted while training started (before step 1); Ray and verl's workers stopped; the run "
                    f"folder stays: {run_dir}"]
        return [f"interrupted after step {rows[-1][0]}; Ray and verl's workers stopped; no complete checkpoint yet "
                f"(trainer.save_freq sets how often one is written); the run folder stays: {run_dir}"]
    lines = [f"interrupted after step {rows[-1][0] if rows else 0}; Ray and verl's workers stopped; the run folder "
             f"stays: {run_dir}"]
    lines.append(f"last complete checkpoint: {kept}")
    lines.append(f"resume in the same folder: {shlex.join(resume_command(command, run_dir))}")
    return lines


_RAY_FIELD = re.compile(r"^\s*(class_name|pid): (\S+)", re.M)
_EXIT_TYPE = re.compile(r"Worker exit type: (\w+)")


def lost_worker_line(failure: str, run_dir: Path, checkpoints: Path, command: list[str]) -> str | None:
    """One line for a run whose Ray worker died (or ran out of memory) without ``stability=auto``: the cause, the
    last complete checkpoint and the command that resumes from it; None for any other failure (``failure``: the
    exception chain as text, read by the exception types as the rollback supervisor reads them)."""
    reason = classify(failure)
    if reason not in ("worker_lost", "oom"):
        return None
    fields = dict(_RAY_FIELD.findall(failure))
    exit_type = _EXIT_TYPE.search(failure)
    # verl's colocated workers are classes made in a function (create_colocated_worker_cls.<locals>.WorkerDict)
    who = f"ray::{fields['class_name'].rsplit('.', 1)[-1]}" if "class_name" in fields else "a Ray worker"
    who += f" (pid {fields['pid']})" if "pid" in fields else ""
    cause = (f"{who} ran out of memory" if reason == "oom" else
             f"{who} died" + (f" ({exit_type.group(1)})" if exit_type else ""))
    rows = read_metrics(Path(run_dir) / "metrics.jsonl")
    kept = last_checkpoint(run_dir, checkpoints)
    where = (f"last complete checkpoint: {kept}; resume: {shlex.join(resume_command(command, run_dir))}" if kept
             else "no complete checkpoint yet (trainer.save_freq sets how often one is written)")
    return (f"training stopped after step {rows[-1][0] if rows else 0}: {cause}; {where} (stability=auto restarts "
            "from the last checkpoint by itself; verl's own account is in the run folder's log)")
