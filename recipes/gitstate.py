"""The git state of a folder's repository (SHA, branch, dirty flag), for the run record and recipe copies."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from recipes.redact import redact_value


def _git(folder: Path, *args: str) -> str | None:
    try:
        proc = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.rstrip() if proc.returncode == 0 else None


def git_state(folder: str | os.PathLike) -> dict | None:
    """SHA, branch, dirty flag (tracked files changed) and changed paths of the repository holding ``folder``."""
    folder = Path(folder)
    top = _git(folder, "rev-parse", "--show-toplevel")
    if not top:
        return None
    status = _git(folder, "status", "--porcelain", "--untracked-files=no") or ""
    changed = [line[3:] for line in status.splitlines() if line.strip()]
    remote = _git(folder, "config", "--get", "remote.origin.url")
    return {
        "root": top,
        "sha": _git(folder, "rev-parse", "HEAD"),
        "branch": _git(folder, "rev-parse", "--abbrev-ref", "HEAD"),
        "dirty": bool(changed),
        "changed": changed[:200],
        "remote": redact_value(remote) if remote else None,
    }
