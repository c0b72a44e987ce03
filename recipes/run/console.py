"""What the terminal shows while verl trains: the pack's own lines; verl's and Ray's output goes to the run folder.

verl's trainer, its Ray workers (forwarded to the driver by Ray) and Ray itself print about a thousand lines for a
20-step CPU run: config dumps, engine warnings, worker logs. :func:`verl_output_to_log` sends everything written to
this process's stdout and stderr file descriptors (and so every child process, such as a rollback attempt) to
``<run folder>/verl.log`` for the duration of the run; with ``verbose`` the same text is also shown live. The pack's
own lines (progress, band warnings, summaries) go to the terminal through the returned :class:`Terminal`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

LOG_NAME = "verl.log"


class Terminal:
    """The terminal as it was before the redirection: ``say`` for data lines (stdout), ``note`` for notices
    (stderr)."""

    def __init__(self, stdout, stderr) -> None:
        self._stdout, self._stderr = stdout, stderr
        self._lock = threading.Lock()

    def say(self, line: str) -> None:
        with self._lock:
            print(line, file=self._stdout, flush=True)

    def note(self, line: str) -> None:
        with self._lock:
            print(line, file=self._stderr, flush=True)


@contextlib.contextmanager
def verl_output_to_log(log_path: Path, verbose: bool = False) -> Iterator[Terminal]:
    """Send this process's fd 1 and 2 to ``log_path`` (appended; and to the terminal's stderr with ``verbose``)
    until the block ends; yields the :class:`Terminal` for the pack's own lines."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    term_out = os.fdopen(os.dup(saved[0]), "w", buffering=1)
    term_err = os.fdopen(os.dup(saved[1]), "w", buffering=1)
    read_fd, write_fd = os.pipe()
    log = open(log_path, "ab")  # noqa: SIM115 - closed by the copier thread
    copier = threading.Thread(target=_copy, args=(read_fd, log, term_err if verbose else None), daemon=True)
    copier.start()
    os.dup2(write_fd, 1)
    os.dup2(write_fd, 2)
    os.close(write_fd)
    try:
        yield Terminal(term_out, term_err)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)  # the last writers of the pipe in this process go: the copier sees the end
        os.dup2(saved[1], 2)
        copier.join(timeout=10)
        for fd in saved:
            os.close(fd)
        term_out.close()
        term_err.close()


def _copy(read_fd: int, log, mirror) -> None:
    """Copy the pipe to the log (and the mirror) until every writer has closed it."""
    with os.fdopen(read_fd, "rb", buffering=0) as pipe, log:
        while chunk := pipe.read(65536):
            log.write(chunk)
            log.flush()
            if mirror is not None:
                mirror.write(chunk.decode(errors="replace"))
                mirror.flush()
