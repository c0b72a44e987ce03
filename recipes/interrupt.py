"""Ctrl-C (SIGINT) or SIGTERM while training: a clean stop that says what was kept and how to go on.

verl's trainer and Ray are ended (``recipes.train.run_verl`` shuts Ray down on the way out), no traceback is printed,
and the terminal gets: the last step logged, the last complete checkpoint (verl's own tracker,
``latest_checkpointed_iteration.txt``, which verl writes after the checkpoint), and the command that resumes from it
into a new run folder (verl's ``trainer.resume_mode=resume_path``; the KL controller's state is restored from the
checkpoint too). Exit code 130, as a shell gives an interrupted command.
"""

from __future__ import annotations

import contextlib
import shlex
import signal
from pathlib import Path

from recipes.monitor import read_metrics

EXIT_CODE = 130
TRACKER = "latest_checkpointed_iteration.txt"


@contextlib.contextmanager
def sigterm_as_interrupt():
    """For the block, SIGTERM (a scheduler's stop) is handled as Ctrl-C; the previous handler comes back after."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def last_checkpoint(checkpoints: Path) -> Path | None:
    """The last complete checkpoint folder under ``checkpoints`` (verl's tracker names it), or None."""
    tracker = Path(checkpoints) / TRACKER
    try:
        step = int(tracker.read_text().strip())
    except (OSError, ValueError):
        return None
    folder = Path(checkpoints) / f"global_step_{step}"
    return folder if folder.is_dir() else None


def interrupted_lines(run_dir: Path, checkpoints: Path, command: list[str]) -> list[str]:
    """What to tell the user after an interrupted run: the last step, the checkpoint kept, the resume command."""
    rows = read_metrics(Path(run_dir) / "metrics.jsonl")
    lines = [f"interrupted after step {rows[-1][0] if rows else 0}; Ray and verl's workers stopped; the run folder "
             f"stays: {run_dir}"]
    kept = last_checkpoint(checkpoints)
    if kept is None:
        lines.append("no complete checkpoint yet (trainer.save_freq sets how often one is written)")
        return lines
    resume = [*command, "trainer.resume_mode=resume_path", f"trainer.resume_from_path={kept}"]
    lines.append(f"last complete checkpoint: {kept}")
    lines.append(f"resume from it (a new run folder): {shlex.join(resume)}")
    return lines
