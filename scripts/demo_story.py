"""The embedded demo's KL story over several seeds, as a user runs it: ``python -m recipes.<recipe> data.seed=S``.

    python scripts/demo_story.py                          # both recipes, seeds 1 2 3
    python scripts/demo_story.py --recipe grpo --seeds 1 2 3 --out scripts/results/DATE-demo-story
    python scripts/demo_story.py -- kl.controller.rule=proportional   # extra overrides for every run
    python scripts/demo_story.py --reread scripts/results/2026-12-06-demo-story-kl-reward/kl_ppo_seed*   # kept runs

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
import math
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
            "kl_in_band": kl["steps"] - kl["violations"], "kl_max": kl["max"], "rewards": rewards,
            "reward_coef": coefficient_moves([row["data"].get("kl_control/reward_coef") for row in rows])}


def coefficient_moves(coefs: list) -> dict | None:
    """How a coefficient moved from step to step: log-steps, those at the controller's bound, and reversals (a
    move up then down, or down then up: the swings of a bang-bang controller). None where the run has none."""
    coefs = [c for c in coefs if c]
    if len(coefs) < 3:
        return None
    steps = [math.log(b / a) for a, b in zip(coefs, coefs[1:], strict=False)]
    largest = max(abs(step) for step in steps)
    return {"moves": len(steps), "at_largest": sum(abs(step) > largest - 1e-9 for step in steps),
            "largest": largest, "reversals": sum(a * b < 0 for a, b in zip(steps, steps[1:], strict=False)),
            "mean_abs": statistics.fmean(abs(step) for step in steps)}


def run(recipe: str, seed: int, extra: list[str], folder: Path) -> dict:
    command = [sys.executable, "-m", f"recipes.{recipe}", f"data.seed={seed}", *extra, f"hydra.run.dir={folder}"]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)}: exit {done.returncode}\n{done.stderr[-2000:]}")
    (folder / "terminal.txt").write_text(done.stdout + done.stderr)
    return {"recipe": recipe, "seed": seed, "command": " ".join(command[1:-1]), "wall_s": wall, **story(folder)}


def _moves_text(result: dict) -> str:
    moves = result.get("reward_coef")
    if not moves:
        return ""
    return (f"; in-reward coefficient: {moves['at_largest']} of {moves['moves']} moves at the largest "
            f"(x{math.exp(moves['largest']):.2f}), {moves['reversals']} reversals, mean |log step| "
            f"{moves['mean_abs']:.2f}")


def reread(folders: list[Path]) -> int:
    """The story of runs kept earlier (``--out``), without running them again."""
    for folder in folders:
        result = story(folder)
        print(f"{folder.name}: reward margin {result['margin']:+.3f} = {result['margin_over_spread']:.1f}x the spread; "
              f"KL in band {result['kl_in_band']}/{result['steps']}{_moves_text(result)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", choices=["grpo", "kl_ppo"], nargs="*", default=["grpo", "kl_ppo"])
    parser.add_argument("--seeds", type=int, nargs="*", default=[1, 2, 3])
    parser.add_argument("--out", type=Path, help="keep each run's record and summary.json here")
    parser.add_argument("--reread", type=Path, nargs="+", help="print the story of these kept run folders; run nothing")
    parser.add_argument("extra", nargs="*", help="overrides for every run (after --)")
    args = parser.parse_args(argv)
    if args.reread:
        return reread(args.reread)
    scratch = Path(tempfile.mkdtemp(prefix="demo_story_"))
    results = []
    for recipe in args.recipe:
        for seed in args.seeds:
            folder = scratch / f"{recipe}_seed{seed}"
            result = run(recipe, seed, args.extra, folder)
            results.append(result)
            print(f"{recipe} seed {seed}: reward margin {result['margin']:+.3f} = {result['margin_over_spread']:.1f}x "
                  f"the spread {result['spread']:.3f}; KL in band {result['kl_in_band']}/{result['steps']} (max "
                  f"{result['kl_max']:.3f}); {result['wall_s']:.1f} s{_moves_text(result)}", flush=True)
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
