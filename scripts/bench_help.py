"""What ``--help`` costs: the wall time of ``python -m recipes.<recipe> --help`` as a user runs it.

    python scripts/bench_help.py [--recipe grpo] [--repeats 5] [--hydra]

Each run is a fresh process in a scratch folder (interpreter start, imports, reading conf/), after one uncounted run
that warms the file cache; prints the median of ``--repeats`` runs. ``--hydra`` also times Hydra's own help
(``--hydra-help``), interleaved, for comparison.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from bench_validate import timed  # noqa: E402 - the same timer as the validation benchmark


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="grpo", choices=("grpo", "kl_ppo"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--hydra", action="store_true", help="also time --hydra-help")
    args = parser.parse_args(argv)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(":")}
    base = [sys.executable, "-m", f"recipes.{args.recipe}"]
    arms = {"--help": [*base, "--help"]}
    if args.hydra:
        arms["--hydra-help"] = [*base, "--hydra-help"]
    times: dict[str, list[float]] = {name: [] for name in arms}
    with tempfile.TemporaryDirectory() as scratch:
        timed(arms["--help"], scratch, env)  # warm the file cache once, uncounted
        for _ in range(args.repeats):
            for name, command in arms.items():
                times[name].append(timed(command, scratch, env))
    for name, values in times.items():
        print(f"{name:12s} median {statistics.median(values):.2f} s  ({args.recipe}, {len(values)} runs: "
              f"{', '.join(f'{v:.2f}' for v in values)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
