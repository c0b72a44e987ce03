"""Benchmark the embedded CPU demo: verl's own ``main_ppo`` running GRPO on the tiny assets, start to finish.

    python scripts/bench_demo.py                      # 20 GRPO steps, world size 1
    python scripts/bench_demo.py --world-size 2 --steps 10
    python scripts/bench_demo.py --algo kl_ppo --steps 10
    python scripts/bench_demo.py --json bench.json    # also write the numbers as JSON

Prints the wall time (Python start, Hydra, Ray start and shutdown included), the time to the first step, the mean
step time after the first, the peak memory of all processes (summed RSS of the process tree, an upper bound, and the
machine's used-memory growth), their CPU seconds, and the mean reward of the first and last steps. The tiny assets
are built (once, cached) before the clock starts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

GIB = 1024**3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", choices=["grpo", "kl_ppo"], default="grpo")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--workdir", type=Path, default=None, help="run folder (default: a temporary one)")
    parser.add_argument("--json", type=Path, default=None, help="write the numbers to this JSON file")
    parser.add_argument("overrides", nargs="*", help="extra verl overrides, key=value")
    args = parser.parse_args(argv)

    from recipes.verl_ext.demo import ensure_tiny_assets
    from recipes.verl_ext.demo.run import demo_overrides, run_main_ppo

    assets = ensure_tiny_assets()
    overrides = demo_overrides(
        assets, algo=args.algo, world_size=args.world_size, steps=args.steps, extra=args.overrides
    )
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench_demo_"))
    print(f"running verl.trainer.main_ppo: {args.algo}, world size {args.world_size}, {args.steps} steps ({workdir})")
    result = run_main_ppo(overrides, workdir=workdir)
    if result.returncode != 0 or len(result.metrics) < args.steps:
        print(result.log_tail(), file=sys.stderr)
        print(f"run failed: exit code {result.returncode}, {len(result.metrics)} steps logged", file=sys.stderr)
        return 1

    rewards = result.series("critic/score/mean")
    step_times = result.series("timing_s/step")
    k = max(1, min(3, len(rewards) // 2))
    numbers = {
        "algo": args.algo,
        "world_size": args.world_size,
        "steps": len(result.metrics),
        "wall_s": round(result.wall_s, 1),
        "first_step_s": round(result.first_step_s or float("nan"), 1),
        "mean_step_s_after_first": round(statistics.mean(step_times[1:] or step_times), 2),
        "peak_rss_gib": round(result.peak_rss_bytes / GIB, 2),
        "peak_used_delta_gib": round(result.peak_used_delta_bytes / GIB, 2),
        "cpu_s": round(result.cpu_s, 1),
        "max_processes": result.max_processes,
        f"reward_first{k}_mean": round(statistics.mean(rewards[:k]), 3),
        f"reward_last{k}_mean": round(statistics.mean(rewards[-k:]), 3),
        "rollout_probs_diff_max": max(result.series("training/rollout_probs_diff_max")),
    }
    width = max(len(key) for key in numbers)
    for key, value in numbers.items():
        print(f"  {key:<{width}}  {value}")
    print("  CPU seconds by process:")
    for name, seconds in list(result.cpu_s_by_process.items())[:12]:
        print(f"    {seconds:7.1f}  {name}")
    numbers["cpu_s_by_process"] = {name: round(seconds, 1) for name, seconds in result.cpu_s_by_process.items()}
    if args.json:
        args.json.write_text(json.dumps(numbers, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
