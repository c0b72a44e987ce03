"""The embedded demo's KL story over several seeds, as a user runs it: ``python -m recipes.<recipe> data.seed=S``.

    python scripts/demo_story.py                          # both recipes, seeds 1 2 3
    python scripts/demo_story.py --recipe grpo --seeds 1 2 3 --out scripts/results/DATE-demo-story
    python scripts/demo_story.py -- kl.controller.rule=proportional   # extra overrides for every run

Per run, from its ``metrics.jsonl`` and ``bands.json``: the mean reward (``critic/score/mean``) of the first and the
last 5 steps, their difference (the margin), the step-to-step spread (standard deviation of consecutive
differences) and the margin in units of it; the steps whose KL is inside the ``kl_mean`` band; the wall time from
the command to its exit. Prints one line per run and the worst of each figure per recipe; ``--out`` also keeps each
run's record (metrics, bands, terminal output) and a ``summary.json``. Targets (issue "KL that stays in its band"):
GRPO margin >= 0.25, KL in band on >= 18 of 20 steps; KL-PPO margin >= 3x the spread, KL in band on >= 18 of 20.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

K = 5


def story(run_dir: Path) -> dict:
    """The figures of one finished run folder."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rewards = [row["data"]["critic/score/mean"] for row in rows]
    steps = [b - a for a, b in zip(rewards, rewards[1:], strict=False)]
    spread = statistics.stdev(steps)
    margin = statistics.fmean(rewards[-K:]) - statistics.fmean(rewards[:K])
    bands = json.loads((run_dir / "bands.json").read_text())["summary"]
    kl = next(row for row in bands if row["band"] == "kl_mean")
    return {"steps": len(rewards), "margin": margin, "spread": spread, "margin_over_spread": margin / spread,
            "kl_in_band": kl["steps"] - kl["violations"], "kl_max": kl["max"], "rewards": rewards}


def run(recipe: str, seed: int, extra: list[str], folder: Path) -> dict:
    command = [sys.executable, "-m", f"recipes.{recipe}", f"data.seed={seed}", *extra, f"hydra.run.dir={folder}"]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)}: exit {done.returncode}\n{done.stderr[-2000:]}")
    (folder / "terminal.txt").write_text(done.stdout + done.stderr)
    return {"recipe": recipe, "seed": seed, "command": " ".join(command[1:-1]), "wall_s": wall, **story(folder)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", choices=["grpo", "kl_ppo"], nargs="*", default=["grpo", "kl_ppo"])
    parser.add_argument("--seeds", type=int, nargs="*", default=[1, 2, 3])
    parser.add_argument("--out", type=Path, help="keep each run's record and summary.json here")
    parser.add_argument("extra", nargs="*", help="overrides for every run (after --)")
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="demo_story_"))
    results = []
    for recipe in args.recipe:
        for seed in args.seeds:
            folder = scratch / f"{recipe}_seed{seed}"
            result = run(recipe, seed, args.extra, folder)
            results.append(result)
            print(f"{recipe} seed {seed}: reward margin {result['margin']:+.3f} = {result['margin_over_spread']:.1f}x "
                  f"the spread {result['spread']:.3f}; KL in band {result['kl_in_band']}/{result['steps']} (max "
                  f"{result['kl_max']:.3f}); {result['wall_s']:.1f} s", flush=True)
            if args.out:
                keep = args.out / folder.name
                keep.mkdir(parents=True, exist_ok=True)
                for name in ("metrics.jsonl", "bands.json", "terminal.txt"):
                    shutil.copy(folder / name, keep / name)
        mine = [r for r in results if r["recipe"] == recipe]
        print(f"{recipe} worst of {len(mine)}: margin {min(r['margin'] for r in mine):+.3f}, "
              f"{min(r['margin_over_spread'] for r in mine):.1f}x the spread, KL in band "
              f"{min(r['kl_in_band'] for r in mine)}/{mine[0]['steps']}, {max(r['wall_s'] for r in mine):.1f} s")
    if args.out:
        (args.out / "summary.json").write_text(json.dumps(results, indent=1))
    shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
