"""Records written whole or not at all: write beside the target, then ``os.replace`` (atomic on one file system).

A reader (the progress printer, a resume, the user) sees the old file or the new one, never a half-written one; a
write that fails (a full disk) leaves the old file as it was, removes its temporary and raises :class:`WriteFailed`,
whose message is one line naming the path. :func:`disk_full_line` finds such a failure in an error raised elsewhere
(verl's checkpoint save in a Ray worker arrives as text).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path


class WriteFailed(OSError):
    """A record could not be written; ``str()`` is one line naming the path."""

    def __init__(self, path: Path, cause: OSError):
        super().__init__(cause.errno, cause.strerror)
        self.path = Path(path)
        self.cause = cause

    def __str__(self) -> str:
        return f"could not write {self.path}: {describe_os_error(self.cause)}"


def describe_os_error(error: OSError) -> str:
    if error.errno == errno.ENOSPC:
        return "no space left on device (the file is left as it was; free space, then resume the run)"
    return f"{error.strerror or error} (errno {error.errno})"


def write_atomic(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary beside it and ``os.replace``; WriteFailed on an OSError."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as error:
        tmp.unlink(missing_ok=True)
        raise WriteFailed(path, error) from None
    return path


def replace_from(tmp: str | os.PathLike, path: str | os.PathLike) -> Path:
    """``os.replace(tmp, path)`` for a temporary another writer produced (matplotlib's savefig); WriteFailed."""
    try:
        os.replace(tmp, path)
    except OSError as error:
        Path(tmp).unlink(missing_ok=True)
        raise WriteFailed(Path(path), error) from None
    return Path(path)


_NO_SPACE = re.compile(r"\[Errno 28\] No space left on device: '([^']+)'")
_OURS = re.compile(r"could not write \S+: no space left on device \([^)]*\)")


# torch.save's writer fails without an errno ("unexpected pos 576 vs 534", "file write failed")
_TORCH_WRITER = re.compile(r"inline_container\.cc|PytorchStreamWriter")
FULL_BELOW = 64 * 2**20  # free bytes under which a failed checkpoint write is taken for a full disk


def disk_full_line(error: BaseException, checkpoints: str | os.PathLike | None = None) -> str | None:
    """One line naming the path when ``error`` (or its cause, or its text: a Ray worker's error) is a full disk;
    with ``checkpoints``, also torch's errno-less writer failure while that folder's disk is (nearly) full."""
    line = _enospc_line(error)
    if line is None and checkpoints is not None and _TORCH_WRITER.search(str(error)):
        line = _full_checkpoint_disk(Path(checkpoints))
    return line


def _full_checkpoint_disk(checkpoints: Path) -> str | None:
    where = checkpoints
    while not where.exists() and where != where.parent:
        where = where.parent
    free = shutil.disk_usage(where).free
    if free >= FULL_BELOW:
        return None
    step = newest_step_folder(checkpoints)  # verl saves steps in order: the newest folder is the one it was writing
    what = f"checkpoint {step}" if step is not None else f"a checkpoint under {checkpoints}"
    return (f"could not write {what}: no space left on device ({free:,} bytes free there; the partial checkpoint is "
            "ignored on resume; free space, then resume the run)")


def newest_step_folder(checkpoints: Path) -> Path | None:
    """The ``global_step_<N>`` folder of ``checkpoints`` with the highest N, or None."""
    steps = [(int(p.name.rsplit("_", 1)[1]), p) for p in (checkpoints.glob("global_step_*") if checkpoints.is_dir()
             else []) if p.is_dir() and p.name.rsplit("_", 1)[1].isdigit()]
    return max(steps)[1] if steps else None


def _enospc_line(error: BaseException) -> str | None:
    seen = error
    while seen is not None:
        if isinstance(seen, WriteFailed) and seen.errno == errno.ENOSPC:
            return str(seen)
        if isinstance(seen, OSError) and seen.errno == errno.ENOSPC:
            where = seen.filename or "a file"
            return f"could not write {where}: {describe_os_error(seen)}"
        seen = seen.__cause__ or seen.__context__
    text = str(error)
    ours = _OURS.search(text)  # the pack's own WriteFailed, raised in a Ray worker (its text crosses over)
    if ours:
        return ours.group(0)
    found = _NO_SPACE.search(text)
    if found:
        return f"could not write {found.group(1)}: {describe_os_error(OSError(errno.ENOSPC, 'No space left'))}"
    return None
