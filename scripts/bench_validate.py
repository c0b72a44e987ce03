"""What validation costs: ``action=validate`` against Hydra's own ``--cfg job`` for the same recipe, side by side.

    python scripts/bench_validate.py [--recipe grpo] [--repeats 5] [--out DIR] [overrides ...]

Both commands run as a user runs them (``python -m recipes.<recipe> ...`` in a fresh process, in a scratch folder),
interleaved, ``--repeats`` times each; prints the median wall time of each and their ratio. ``--cfg job`` composes
the config and prints it; ``action=validate`` composes it once, checks it (the pack's checks and verl's own
validator), finalizes it and writes the run's record. ``--out DIR`` keeps every run's time, the uncounted warm-up
and the environment (``DIR/bench_validate.json``) and the terminal text (``DIR/output.txt``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from _raw_output import RawOutput  # noqa: E402


def timed(command: list[str], cwd: str, env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="grpo", choices=("grpo", "kl_ppo"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, help="keep every run's time, the environment and the terminal text here")
    parser.add_argument("overrides", nargs="*", help="group=option / key=value for both commands")
    args = parser.parse_args(argv)
    raw = RawOutput(args.out, "bench_validate")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(":")}
    base = [sys.executable, "-m", f"recipes.{args.recipe}", *args.overrides]
    arms = {"--cfg job": [*base, "--cfg", "job"], "action=validate": [*base, "action=validate"]}
    times: dict[str, list[float]] = {name: [] for name in arms}
    with tempfile.TemporaryDirectory() as scratch:
        warmup = timed(arms["--cfg job"], scratch, env)  # warm the file cache and the tiny assets once, uncounted
        for _ in range(args.repeats):
            for name, command in arms.items():
                times[name].append(timed(command, scratch, env))
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, values in times.items():
        raw.print(f"{name:16s} median {medians[name]:.2f} s  (runs: {', '.join(f'{v:.2f}' for v in values)})")
    ratio = medians["action=validate"] / medians["--cfg job"]
    raw.print(f"action=validate / --cfg job = {ratio:.2f}x ({args.recipe}, {args.repeats} runs each, interleaved)")
    raw.write({
        "recipe": args.recipe,
        "repeats": args.repeats,
        "overrides": args.overrides,
        "commands": {name: command[1:] for name, command in arms.items()},
        "warmup_s": warmup,
        "samples_s": times,
        "medians_s": medians,
        "ratio": ratio,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
