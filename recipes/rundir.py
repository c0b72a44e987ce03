"""A run folder of its own: created exclusively, so two runs started in the same second never share one.

The folder name holds the time to the second (``runs/grpo/2026-12-01_12-40-25``). :func:`reserve` creates it with
``os.mkdir`` (atomic: exactly one process wins); a name already taken gets the next free suffix (``..._12-40-25-1``).
:func:`release` removes what a reservation created when the run does not go ahead (a config error), so a bad input
leaves no folder behind. :func:`refuse_location` checks, before anything is created, that the folder stays inside
``run.root`` and that ``run.root`` can be written. While a run goes, :func:`lock` keeps ``run.lock`` in its folder
(the process and host): a second live run in the same folder (``run.resume=`` of a running run, a typed
``hydra.run.dir``) is refused; a lock whose process is gone is taken over.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from recipes.errors import ConfigError


@dataclass(frozen=True)
class Reservation:
    path: Path
    """the run folder, created and empty"""
    created: tuple[Path, ...]
    """every folder the reservation created, the run folder last (its parents that did not exist before)"""


def reserve(path: str | os.PathLike, attempts: int = 1000) -> Reservation:
    """Create ``path`` exclusively, or ``path-1``, ``path-2``, ... when it is taken; its parents as needed."""
    path = Path(path)
    created = _make_parents(path.parent)
    for n in range(attempts):
        candidate = path if n == 0 else path.with_name(f"{path.name}-{n}")
        try:
            os.mkdir(candidate)
        except FileExistsError:
            continue
        return Reservation(candidate, (*created, candidate))
    raise FileExistsError(f"{path}: {attempts} run folders of this name exist")


def refuse_location(root: str | os.PathLike, path: str | os.PathLike, name: str) -> None:
    """ConfigError when the run folder ``path`` escapes ``root`` (``run.name=../..``) or ``root`` cannot be
    written; nothing is created."""
    root_abs, path_abs = Path(os.path.abspath(root)), Path(os.path.abspath(path))
    if root_abs != path_abs and root_abs not in path_abs.parents:
        raise ConfigError(f"run.name={name}: the run folder {path_abs} is outside run.root ({root_abs}); a run "
                          "name is a folder name under run.root, without '..'")
    existing = root_abs
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"run.root={root}: cannot create run folders under it: {existing} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"run.root={root}: cannot create run folders under it: {existing} is not writable by "
                          "this user")


def release(reservation: Reservation) -> None:
    """Remove the folders the reservation created, deepest first, as long as they are empty."""
    for folder in reversed(reservation.created):
        try:
            folder.rmdir()
        except OSError:  # not empty (another run's folder is in it) or already gone
            return


def _make_parents(folder: Path) -> list[Path]:
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    made = []
    for parent in reversed(missing):
        try:
            os.mkdir(parent)
            made.append(parent)
        except FileExistsError:  # another run made it meanwhile: theirs, not ours to remove
            pass
    return made


LOCK = "run.lock"


def lock(folder: str | os.PathLike, key: str) -> Path:
    """Create ``<folder>/run.lock`` for this process, exclusively; ConfigError naming ``key`` while another live
    process holds it. A lock left by a process that is gone (killed, its machine rebooted) is taken over."""
    path = Path(folder) / LOCK
    path.parent.mkdir(parents=True, exist_ok=True)  # a typed hydra.run.dir need not exist yet
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _holder(path)
            if holder is not None and _alive(holder):
                raise ConfigError(f"{key}: {path.parent} is in use by process {holder['pid']} on {holder['host']} "
                                  f"({path}; it goes when that run ends)") from None
            path.unlink(missing_ok=True)  # stale: its process is gone
            continue
        with os.fdopen(fd, "w") as f:
            json.dump({"pid": os.getpid(), "host": socket.gethostname()}, f)
        return path
    raise ConfigError(f"{key}: could not take {path} (another run keeps taking it)")


def unlock(path: Path | None) -> None:
    """Remove a lock this process took."""
    if path is not None and (_holder(path) or {}).get("pid") == os.getpid():
        path.unlink(missing_ok=True)


def _holder(path: Path) -> dict | None:
    try:
        holder = json.loads(path.read_text())
        return holder if isinstance(holder, dict) and isinstance(holder.get("pid"), int) else None
    except (OSError, ValueError):
        return None  # half written or gone: a process that died while taking it


def _alive(holder: dict) -> bool:
    if holder.get("host") != socket.gethostname():
        return True  # another machine's process: it cannot be checked from here
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
