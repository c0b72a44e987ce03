"""The demo as a user runs it: ``python -m recipes.grpo`` (= ``make demo``), timed from the command to its exit.

    python scripts/bench_demo_cli.py [--repeats 3] [--recipe grpo] [--out DIR] [overrides ...]
    python scripts/bench_demo_cli.py --recipe kl_ppo --versus run.gc_threshold=null trainer.total_training_steps=8

Each run starts in a fresh scratch folder (the tiny assets are cached, built once before the clock starts). Prints,
per run and as medians: the wall time; the start-up (from the command until verl's first step begins: Python,
composition and validation, Ray, verl's workers; the first progress line's time less that step's own
``timing_s/step``); the steps (the sum of ``timing_s/step``); the rest (after the last step: checkpoint, plot, Ray
shutdown); the start-up's share of the wall time; and the number of lines the terminal showed. ``--out DIR`` keeps
every run's figures, the environment (load average at the start included) and the printed lines
(``scripts/_raw_output.py``).

``--versus OVERRIDE`` (repeatable) measures a variant side by side: each repeat runs the command as given and with the
variant's overrides added, the order alternating from one repeat to the next (a machine that slows down over the
minutes weighs on both alike); the medians of both and their ratio close the output.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from _raw_output import RawOutput  # noqa: E402


def one_run(recipe: str, overrides: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench_demo_cli_") as scratch:
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", f"recipes.{recipe}", *overrides], cwd=scratch, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        first_step_at, lines = None, []
        for line in proc.stdout:
            lines.append(line)
            if first_step_at is None and line.startswith("step 1/"):
                first_step_at = time.perf_counter() - start
        err = proc.stderr.read()
        code = proc.wait()
        wall = time.perf_counter() - start
        if code != 0 or first_step_at is None:
            raise SystemExit(f"exit {code}:\n{''.join(lines)[-2000:]}\n{err[-2000:]}")
        metrics = next(Path(scratch, "runs", recipe).glob("*/metrics.jsonl")).read_text().splitlines()
        step_s = [json.loads(row)["data"]["timing_s/step"] for row in metrics]
        startup = first_step_at - step_s[0]
        return {"wall_s": wall, "startup_s": startup, "steps_s": sum(step_s), "rest_s": wall - startup - sum(step_s),
                "startup_share": startup / wall, "terminal_lines": len(lines) + len(err.splitlines()),
                "steps": len(step_s)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="grpo", choices=("grpo", "kl_ppo"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, help="keep the raw output here (JSON and the printed lines)")
    parser.add_argument("--versus", action="append", default=[], metavar="OVERRIDE",
                        help="a variant measured side by side: these overrides added (repeatable)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    raw = RawOutput(args.out, "bench_demo_cli")
    sys.path.insert(0, str(ROOT))
    from recipes.verl_ext.demo import ensure_tiny_assets  # the cached assets, outside the clock

    ensure_tiny_assets()
    variants = {"as given": args.overrides, **({" ".join(args.versus): args.overrides + args.versus}
                                               if args.versus else {})}
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    for n in range(args.repeats):
        order = list(variants) if n % 2 == 0 else list(reversed(variants))
        for name in order:
            runs[name].append(one_run(args.recipe, variants[name]))
            raw.print(f"run {n + 1} ({name}): " + "  ".join(
                f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in runs[name][-1].items()))
    medians = {name: {key: statistics.median(r[key] for r in rs) for key in rs[0] if key != "steps"}
               for name, rs in runs.items()}
    for name, values in medians.items():
        raw.print(f"median of {args.repeats} ({name}): " + "  ".join(f"{k} {v:.2f}" for k, v in values.items()))
    if args.versus:
        base, other = medians["as given"], medians[" ".join(args.versus)]
        raw.print("ratio as given / " + " ".join(args.versus) + ": " + "  ".join(
            f"{k} {base[k] / other[k]:.3f}" for k in ("wall_s", "startup_s", "steps_s", "rest_s")))
    raw.write({"recipe": args.recipe, "overrides": args.overrides, "versus": args.versus,
               "runs": runs if args.versus else runs["as given"],
               "medians": medians if args.versus else medians["as given"]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
