"""The raw output of a benchmark behind a README figure: ``--out DIR`` keeps every sample as JSON and the terminal text.

    raw = RawOutput(args.out, "bench_plan")    # at the start: the environment and the machine's load before the work
    raw.print("a line")                         # printed and kept for DIR/output.txt
    raw.write({"samples_s": [...]})             # DIR/bench_plan.json (command, environment, payload) + DIR/output.txt

The environment is ``scripts/gpu/_common.environment`` (date, CPU count, Python, torch, transformers, verl) plus the
load average when the benchmark started and the git commit it ran at (with the dirty flag: changed tracked files).
Results live under ``scripts/results/DATE-NAME/``.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts" / "gpu"))

from _common import environment, write_json  # noqa: E402

from recipes.record.gitstate import git_state  # noqa: E402


def cpu_environment() -> dict:
    load = dict(zip(("1min", "5min", "15min"), os.getloadavg(), strict=True))
    git = git_state(ROOT) or {}
    return {
        **environment(torch.device("cpu")),
        "load_average_at_start": load,
        "git": {key: git.get(key) for key in ("sha", "branch", "dirty", "changed")},
    }


class RawOutput:
    """Lines printed and kept, the environment taken at construction; ``write`` does nothing without ``out``."""

    def __init__(self, out: Path | None, name: str):
        self.out, self.name = (Path(out) if out else None), name
        self.command = shlex.join(["python", *sys.argv])
        self.environment = cpu_environment()
        self.lines: list[str] = []

    def print(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)

    def write(self, payload: dict) -> None:
        if self.out is None:
            return
        record = {"command": self.command, "environment": self.environment, **payload}
        write_json(self.out / f"{self.name}.json", record)
        (self.out / "output.txt").write_text("\n".join(self.lines) + "\n")
