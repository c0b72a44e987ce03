"""Ctrl-C (SIGINT) or SIGTERM while training: a clean stop that says what was kept and how to go on.

verl's trainer and Ray are ended (``recipes.train.run_verl`` shuts Ray down on the way out), no traceback is printed,
and the terminal gets: the last step logged, the last complete checkpoint (the pack's completeness marker,
:mod:`recipes.checkpoints`), and the command that continues the run in its own folder from it (``run.resume=``,
:mod:`recipes.resume`: the same step numbering, the KL controller's state, metrics appended). Exit code 130, as a
shell gives an interrupted command.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import signal
import threading
from pathlib import Path

from recipes.monitor import read_metrics
from recipes.resume import resumable_checkpoint
from recipes.verl_ext.stability.faults import classify

EXIT_CODE = 130
# typed for the interrupted launch; the resume command chooses its own
RESUME_KEYS = ("run.resume=", "trainer.resume_mode=", "trainer.resume_from_path=")


@contextlib.contextmanager
def sigterm_as_interrupt(metrics_path: Path | None = None, every_s: float = 2.0):
    """For the block, SIGTERM (a scheduler's stop) is handled as Ctrl-C; the previous handlers come back after (a
    signal the process was started ignoring stays ignored).

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
    previous = {sig: signal.signal(sig, interrupt) for sig in wanted}
    try:
        yield
    finally:
        left.set()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


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
    lines = [f"interrupted after step {rows[-1][0] if rows else 0}; Ray and verl's workers stopped; the run folder "
             f"stays: {run_dir}"]
    kept = last_checkpoint(run_dir, checkpoints)
    if kept is None:
        lines.append("no complete checkpoint yet (trainer.save_freq sets how often one is written)")
        return lines
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
