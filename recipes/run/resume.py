"""``run.resume=<run folder>``: continue a run in its own folder.

The run goes on from the folder's last complete checkpoint (:mod:`recipes.run.checkpoints`) with verl's
``trainer.resume_mode=resume_path``: the same step numbering, the KL controller's state (``kl_control.json``), the
same ``checkpoints/``. Each launch keeps its own record: the first one's ``resolved_config.yaml`` and ``repro/``
stay as they are, resume ``<n>`` writes its own in ``resume_<n>/`` (created exclusively, so two resumes of one
folder never share one). ``metrics.jsonl`` is appended to, never truncated: rows of steps after the checkpoint
(trained after it, before the stop) move to ``resume_<n>/metrics.superseded.jsonl``, since those steps run again;
so every step is in ``metrics.jsonl`` once. The bands summary covers the whole run.

Refused with one line (nothing created): a folder that is not a run folder, one without a complete checkpoint, and,
without ``stability=auto``, one whose latest checkpoint is damaged (the previous complete one is offered;
``stability=auto`` takes it).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from recipes.errors import ConfigError
from recipes.record.records import write_atomic
from recipes.run import checkpoints as ckpt

RECORD = "resolved_config.yaml"
PREFIX = "resume_"
SUPERSEDED = "metrics.superseded.jsonl"


@dataclass(frozen=True)
class Resume:
    folder: Path
    """the run folder continued"""
    record_dir: Path
    """this launch's record: ``<folder>/resume_<n>``, created (empty)"""
    checkpoint: Path
    """the complete checkpoint it starts from"""
    step: int
    notices: tuple[str, ...]
    """checkpoints ignored, and why"""


def plan_resume(given: str, stability_auto: bool, chosen: str | None = None) -> Resume:
    """Check ``run.resume=<given>`` and reserve this launch's record folder; ConfigError naming the key.
    ``chosen``: a ``trainer.resume_from_path`` typed with it (one of the folder's complete checkpoints)."""
    folder = Path(os.path.abspath(given))
    key = f"run.resume={given}"
    if not folder.is_dir():
        raise ConfigError(f"{key}: no such folder")
    if not (folder / RECORD).is_file():
        raise ConfigError(f"{key}: not a run folder (no {RECORD} in it; a run folder is the one a run's "
                          "'training: ... in <folder>' line names)")
    found = ckpt.scan(folder / "checkpoints")
    notices = found.notices()
    if found.latest is None:
        why = "; ".join(notices) or "none was written (trainer.save_freq sets how often one is)"
        raise ConfigError(f"{key}: no complete checkpoint in {folder / 'checkpoints'} ({why})")
    step, start = found.latest
    if chosen:
        step, start = _chosen(key, chosen, found)
    else:
        step, start, logged = _logged_checkpoint(folder / "metrics.jsonl", found, step, start)
        notices += logged
        damaged = [(f, why) for f, why in found.rejected if ckpt.step_of(f) > step and (f / ckpt.MARKER).exists()]
        if damaged and not stability_auto:
            bad, why = damaged[-1]
            raise ConfigError(f"{key}: the latest checkpoint {bad} is damaged: {why}; the previous complete one is "
                              f"{start}: add trainer.resume_from_path={start} to resume from it (stability=auto "
                              "takes it by itself)")
    return Resume(folder=folder, record_dir=_reserve_record(folder), checkpoint=start, step=step,
                  notices=tuple(notices))


def _logged_checkpoint(metrics: Path, found: ckpt.Scan, step: int, start: Path) -> tuple[int, Path, list[str]]:
    """The latest complete checkpoint whose step has its row in ``metrics``: a run stopped between verl's save of
    step N and its log of step N would otherwise resume after N with N's row missing. Unchanged where no earlier
    complete checkpoint is logged."""
    last = _last_logged_step(metrics)
    if last is None or step <= last:
        return step, start, []
    logged = [(s, f) for s, f in found.complete if s <= last]
    if not logged:
        return step, start, []
    back, folder = logged[-1]
    return back, folder, [f"checkpoint {start} has no row in {metrics.name} (the run stopped between its save and its "
                          f"log): resuming from {folder}, steps {back + 1}-{step} run again"]


def resumable_checkpoint(metrics: Path, checkpoints: Path) -> Path | None:
    """The checkpoint ``run.resume=`` would continue from: the latest complete one whose step is logged in
    ``metrics`` (or the latest complete one where none is); None without a complete checkpoint."""
    found = ckpt.scan(checkpoints)
    if found.latest is None:
        return None
    step, folder = found.latest
    return _logged_checkpoint(metrics, found, step, folder)[1]


def _row_step(line: str) -> int | None:
    """The step of one ``metrics.jsonl`` row, or None for a line that is not a row (cut by a crash)."""
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None


def _last_logged_step(metrics: Path) -> int | None:
    if not metrics.is_file():
        return None
    steps = [step for step in map(_row_step, metrics.read_text().splitlines()) if step is not None]
    return max(steps, default=None)


def _chosen(key: str, chosen: str, found: ckpt.Scan) -> tuple[int, Path]:
    wanted = Path(os.path.abspath(chosen))
    for step, folder in found.complete:
        if folder == wanted:
            return step, folder
    listed = ", ".join(str(f) for _, f in found.complete)
    raise ConfigError(f"trainer.resume_from_path={chosen}: not a complete checkpoint of {key.split('=', 1)[1]} "
                      f"(complete: {listed})")


def _reserve_record(folder: Path) -> Path:
    taken = [int(p.name[len(PREFIX):]) for p in folder.glob(f"{PREFIX}*") if p.name[len(PREFIX):].isdigit()]
    n = max(taken, default=0) + 1
    while True:
        try:
            os.mkdir(folder / f"{PREFIX}{n}")
            return folder / f"{PREFIX}{n}"
        except FileExistsError:  # another resume of this folder took the number
            n += 1


def keep_metrics_up_to(metrics: Path, step: int, aside: Path) -> int:
    """Rows of ``metrics`` with a step after ``step`` move to ``aside`` (appended); ``metrics`` is replaced
    atomically. Returns the number of rows kept."""
    if not metrics.is_file():
        return 0
    lines = [line for line in metrics.read_text().splitlines(keepends=True) if line.endswith("\n")]
    kept, moved = [], []
    for line in lines:
        row_step = _row_step(line)
        if row_step is not None:
            (kept if row_step <= step else moved).append(line)
    if moved:
        with aside.open("a") as f:
            f.writelines(moved)
    if moved or len(kept) != len(lines):
        write_atomic(metrics, "".join(kept))
    return len(kept)
