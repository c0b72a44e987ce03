"""The git state of a folder's repository (SHA, branch, dirty flag), for the run record and recipe copies."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from recipes.record.redact import redact_value


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
    # one call for the commit, the branch and the changed tracked files (porcelain v2: "# branch.oid <sha>",
    # "# branch.head <name>", then one line per changed entry, its path last)
    status = _git(folder, "status", "--porcelain=v2", "--branch", "--untracked-files=no") or ""
    heads = dict(line[2:].split(" ", 1) for line in status.splitlines() if line.startswith("# ") and " " in line[2:])
    changed = [_changed_path(line) for line in status.splitlines() if line and not line.startswith("#")]
    remote = _git(folder, "config", "--get", "remote.origin.url")
    sha = heads.get("branch.oid")
    branch = heads.get("branch.head")
    return {
        "root": top,
        "sha": None if sha in (None, "(initial)") else sha,
        "branch": "HEAD" if branch == "(detached)" else branch,
        "dirty": bool(changed),
        "changed": changed[:200],
        "remote": redact_value(remote) if remote else None,
    }


def _changed_path(line: str) -> str:
    """The path of a porcelain v2 entry: ordinary (``1 ...``, 8 fields before it), renamed (``2 ...``, 9 fields,
    then the new path a tab before the old) or unmerged (``u ...``, 10 fields)."""
    fields = {"1": 8, "2": 9, "u": 10}.get(line[:1], 0)
    path = line.split(" ", fields)[-1] if fields else line
    return path.split("\t", 1)[0]
