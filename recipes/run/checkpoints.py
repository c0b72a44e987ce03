"""Which checkpoints count: only complete ones, checked against the manifest written after verl's save.

verl 0.9.1 writes ``checkpoints/global_step_<n>/`` file by file and then its tracker
(``latest_checkpointed_iteration.txt``); the pack's trainer then adds the KL controller's state and, last, a
completeness marker ``checkpoint_complete.json``: every file of the folder with its size, and a SHA-256 of each small
file (the controller's state, the data loader's). A checkpoint counts only when the marker is there and every file
still matches it: a folder a crash or a full disk left half-written has no marker, a truncated model file has the
wrong size, a corrupted ``kl_control.json`` the wrong hash. Each folder that does not count is named with the reason.
Pure Python: the trainer (in a Ray worker) writes the marker, the driver (resume, rollback, Ctrl-C) reads it.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from recipes.record.records import write_atomic

MARKER = "checkpoint_complete.json"
HASHED_BELOW = 1 << 20
"""files smaller than this (bytes) are hashed too; larger ones (model and optimizer shards) are checked by size"""


@dataclass(frozen=True)
class Scan:
    complete: list[tuple[int, Path]]
    """(step, folder) of every complete checkpoint, oldest first"""
    rejected: list[tuple[Path, str]]
    """(folder, why it does not count), oldest first"""

    @property
    def latest(self) -> tuple[int, Path] | None:
        return self.complete[-1] if self.complete else None

    def notices(self) -> list[str]:
        return [f"checkpoint {folder} ignored: {why}" for folder, why in self.rejected]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MARKER)


def manifest(folder: str | os.PathLike) -> dict[str, dict]:
    """{relative path: {"bytes": size[, "sha256": hash]}} of every file in a checkpoint folder."""
    folder = Path(folder)
    out = {}
    for path in _files(folder):
        size = path.stat().st_size
        entry: dict = {"bytes": size}
        if size < HASHED_BELOW:
            entry["sha256"] = _sha256(path)
        out[str(path.relative_to(folder))] = entry
    return out


def mark_complete(folder: str | os.PathLike, step: int) -> Path:
    """Write the marker, atomically, after everything else of the checkpoint is on disk."""
    folder = Path(folder)
    payload = {"step": step, "files": manifest(folder)}
    return write_atomic(folder / MARKER, json.dumps(payload, indent=1) + "\n")


def problem(folder: str | os.PathLike) -> str | None:
    """Why this checkpoint folder does not count, or None when it is complete."""
    folder = Path(folder)
    marker = folder / MARKER
    if not marker.is_file():
        return f"incomplete ({len(_files(folder))} files and no {MARKER}: the save did not finish)"
    try:
        files = json.loads(marker.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"its {MARKER} is unreadable"
    for name, entry in files.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != entry["bytes"]:
            return f"{name} is {size} bytes, {entry['bytes']} when saved (truncated or overwritten)"
        if "sha256" in entry and _sha256(path) != entry["sha256"]:
            return f"{name} changed since it was saved (its SHA-256 differs: corrupted)"
    return None


def step_of(folder: Path) -> int | None:
    try:
        return int(folder.name.rsplit("_", 1)[1])
    except (IndexError, ValueError):
        return None


def scan(checkpoints: str | os.PathLike) -> Scan:
    """Every ``global_step_<n>`` folder under ``checkpoints``, sorted into complete and rejected ones."""
    root = Path(checkpoints)
    folders = [p for p in root.glob("global_step_*") if p.is_dir() and step_of(p) is not None]
    complete, rejected = [], []
    for folder in sorted(folders, key=step_of):
        why = problem(folder)
        if why is None:
            complete.append((step_of(folder), folder))
        else:
            rejected.append((folder, why))
    return Scan(complete=complete, rejected=rejected)
