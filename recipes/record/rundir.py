"""A run folder of its own: created exclusively, so two runs started in the same second never share one.

The folder name holds the time to the second (``runs/grpo/2026-12-01_12-40-25``). :func:`reserve` creates it with
``os.mkdir`` (atomic: exactly one process wins); a name already taken gets the next free suffix (``..._12-40-25-1``).
:func:`release` removes what a reservation created when the run does not go ahead (a config error), so a bad input
leaves no folder behind. :func:`refuse_location` checks, before anything is created, that the folder stays inside
``run.root``, that its name fits the file system and that ``run.root`` can be written. A folder typed as
``hydra.run.dir=`` is taken by :func:`claim`: it must be new or empty (an earlier run's ``resolved_config.yaml`` and
``repro/`` are never overwritten; ``run.resume=`` goes on with a run in its folder), not a file, and creatable; what it
creates is released as a reservation is. While a run goes, :func:`lock` keeps ``run.lock`` in its folder (the process
and host): a second live run in the same folder (``run.resume=`` of a running run) is refused; a lock whose process is
gone is taken over.
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
    """Create ``path`` exclusively, or ``path-1``, ``path-2``, ... when it is taken; its parents as needed. On an
    OSError the parents it made are removed again."""
    path = Path(path)
    created = _make_parents(path.parent)
    try:
        for n in range(attempts):
            candidate = path if n == 0 else path.with_name(f"{path.name}-{n}")
            try:
                os.mkdir(candidate)
            except FileExistsError:
                continue
            return Reservation(candidate, (*created, candidate))
        raise FileExistsError(f"{path}: {attempts} run folders of this name exist")
    except BaseException:
        release(Reservation(path, tuple(created)))
        raise


def claim(path: str | os.PathLike, key: str, reuse: bool = False) -> Reservation:
    """The run folder typed as ``key`` (``hydra.run.dir=...``): made now with its missing parents (listed in the
    reservation, so that :func:`release` removes them when the run is refused), or an existing empty folder (nothing to
    release). ConfigError naming ``key``, nothing created: a file, a folder that holds files (an earlier run's record
    would be overwritten; ``reuse``: the Ray Job the pack submitted into the folder it reserved), a name too long for
    the file system, a place this user cannot create a folder in."""
    path = Path(os.path.abspath(path))
    if path.is_dir():
        _refuse_live_lock(path, key)
        try:
            held = sorted(path.iterdir())
        except OSError as error:
            raise ConfigError(_cannot_create(key, path, error, "read")) from None
        if held and not reuse:
            raise ConfigError(_not_empty(path, key, held))
        if not os.access(path, os.W_OK | os.X_OK):
            raise ConfigError(f"{key}: {path} is not writable by this user; choose a folder this user can write")
        return Reservation(path, ())
    if path.exists() or path.is_symlink():
        raise ConfigError(f"{key}: {path} is a file; the run folder must be a folder (a new or empty one)")
    existing = _nearest_existing(path.parent)
    if not existing.is_dir():
        raise ConfigError(f"{key}: cannot create the run folder {path}: {existing} is a file")
    long_name = _too_long(path, existing)
    if long_name:
        raise ConfigError(f"{key}: {_limit(*long_name)}; choose a shorter folder name")
    try:
        created = _make_parents(path.parent)
    except OSError as error:
        raise ConfigError(_cannot_create(key, path, error)) from None
    try:
        os.mkdir(path)
    except FileExistsError:  # another process made it meanwhile: in use by it
        release(Reservation(path, tuple(created)))
        raise ConfigError(f"{key}: {path} was just created by another process; choose another folder") from None
    except OSError as error:
        release(Reservation(path, tuple(created)))
        raise ConfigError(_cannot_create(key, path, error)) from None
    return Reservation(path, (*created, path))


def _not_empty(path: Path, key: str, held: list[Path]) -> str:
    names = [p.name + ("/" if p.is_dir() else "") for p in held]
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    line = (f"{key}: {path} is not empty ({shown}); a typed run folder must be new or empty, so that no earlier "
            "run's record (resolved_config.yaml, repro/) is overwritten: choose another folder, or leave "
            "hydra.run.dir out (each run gets a new folder under run.root)")
    if (path / "resolved_config.yaml").is_file():
        line += f"; to go on with the run in it: run.resume={path} (in place of hydra.run.dir)"
    return line


def _cannot_create(key: str, path: Path, error: OSError, verb: str = "create") -> str:
    return (f"{key}: cannot {verb} the run folder {path}: {error.strerror}"
            f"{f' ({error.filename})' if error.filename and str(error.filename) != str(path) else ''}; choose a "
            "folder this user can create (on a writable file system)")


def _name_max(existing: Path) -> int:
    try:
        return os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def _too_long(path: Path, existing: Path) -> tuple[str, int, int] | None:
    """The first folder name of ``path`` below ``existing`` (the nearest folder that exists) that is longer than the
    file system takes: (name, its bytes, the limit); else None."""
    limit = _name_max(existing)
    for name in path.relative_to(existing).parts:
        if len(os.fsencode(name)) > limit:
            return name, len(os.fsencode(name)), limit
    return None


def _limit(name: str, size: int, limit: int) -> str:
    return f"the folder name {_shown(name)} is {size} bytes, over this file system's {limit}-byte limit for a name"


def _shown(name: str, width: int = 40) -> str:
    return repr(name) if len(name) <= width else f"'{name[:width - 10]}...{name[-6:]}' ({len(name)} characters)"


def _nearest_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (a link counts, dangling or not: it is not a folder to create)."""
    while not (path.exists() or path.is_symlink()):
        path = path.parent
    return path


def refuse_location(root: str | os.PathLike, path: str | os.PathLike, name: str) -> None:
    """ConfigError when the run folder ``path`` escapes ``root`` (``run.name=../..``), a folder name in it is longer
    than the file system takes (blaming ``run.name`` or ``run.root``, whichever holds it) or ``root`` cannot be
    written; nothing is created."""
    root_abs, path_abs = Path(os.path.abspath(root)), Path(os.path.abspath(path))
    if root_abs != path_abs and root_abs not in path_abs.parents:
        raise ConfigError(f"run.name={name}: the run folder {path_abs} is outside run.root ({root_abs}); a run "
                          "name is a folder name under run.root, without '..'")
    existing = _nearest_existing(root_abs)
    if not existing.is_dir():
        raise ConfigError(f"run.root={root}: cannot create run folders under it: {existing} is a file")
    long_root = _too_long(root_abs, existing)
    if long_root:
        raise ConfigError(f"run.root={_shown(str(root))}: {_limit(*long_root)}; choose a shorter run.root")
    long_name = _too_long(path_abs, existing)  # run.root's own names fit: one of run.name's
    if long_name:
        bad, size, limit = long_name
        what = (f"{size} bytes, over this file system's {limit}-byte limit for a folder name" if bad == name else
                _limit(bad, size, limit))
        raise ConfigError(f"run.name={_shown(name)}: {what} (the run folder is run.root/run.name/<time>); choose a "
                          "shorter run.name")
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
    made: list[Path] = []
    try:
        for parent in reversed(missing):
            try:
                os.mkdir(parent)
                made.append(parent)
            except FileExistsError:  # another run made it meanwhile: theirs, not ours to remove
                pass
    except BaseException:  # a name too long, no permission: what was made goes again
        release(Reservation(folder, tuple(made)))
        raise
    return made


LOCK = "run.lock"


def lock(folder: str | os.PathLike, key: str) -> Path:
    """Create ``<folder>/run.lock`` for this process, exclusively; ConfigError naming ``key`` while another live
    process holds it. A lock left by a process that is gone (killed, its machine rebooted) is taken over."""
    path = Path(folder) / LOCK
    path.parent.mkdir(parents=True, exist_ok=True)  # made by claim or reserve; a folder removed meanwhile comes back
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            _refuse_live_lock(path.parent, key)
            path.unlink(missing_ok=True)  # stale: its process is gone
            continue
        with os.fdopen(fd, "w") as f:
            json.dump({"pid": os.getpid(), "host": socket.gethostname()}, f)
        return path
    raise ConfigError(f"{key}: could not take {path} (another run keeps taking it)")


def _refuse_live_lock(folder: Path, key: str) -> None:
    """ConfigError naming ``key`` while a live process holds ``folder``'s lock."""
    path = folder / LOCK
    holder = _holder(path) if path.exists() else None
    if holder is not None and _alive(holder):
        raise ConfigError(f"{key}: {folder} is in use by process {holder['pid']} on {holder['host']} "
                          f"({path}; it goes when that run ends)")


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
