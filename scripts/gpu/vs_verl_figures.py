"""The figures of one arm of scripts/gpu/vs_verl.sh, as one JSON (ARM_OUT/figures.json) and one line.

    python scripts/gpu/vs_verl_figures.py RUN_DIR ARM_OUT --arm verl --gpu "NVIDIA H100 80GB HBM3" --cluster h100_80g
        --wall-s 312.4 --exit 0 [--sequences 160]

Reads RUN_DIR/metrics.jsonl (verl's file logger: one line a step) through scripts/gpu/e2e_figures.py, and from ARM_OUT
the runner's step_times.txt (seconds from the command to each step's metrics line), gpu_mem.csv (the device's used
MiB every 0.5 s) and engine_lines.txt (vLLM's own lines). Adds:

- time to the first step: the command's start to step 1's metrics line (``first_step_done_s``), and that less step
  1's own ``timing_s/step`` (``first_step_start_s``: start-up alone);
- the steady steps (2 on): median step time less any checkpoint save in it (verl saves at the last step when
  ``trainer.save_freq`` > 0, as its example sets: not the work compared) and its parts (``timing_s/gen``,
  ``old_log_prob``, ``ref``,
  ``update_actor``, ``update_weights``), response tokens a second per GPU (``response_length/mean`` x sequences /
  ``timing_s/step``, one GPU), and verl's ``perf/throughput`` (prompt and response tokens);
- the device's peak memory (gpu_mem.csv, GiB), the host's (host_mem.csv: used MiB every second, where the runner
  wrote it) and vLLM's KV-cache lines.
Standard library only.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from e2e_figures import figures  # noqa: E402

PARTS = ("timing_s/gen", "timing_s/old_log_prob", "timing_s/ref", "timing_s/update_actor", "timing_s/update_weights",
         "timing_s/reward", "timing_s/adv", "timing_s/save_checkpoint")
KV_LINE = re.compile(r"Available KV cache memory|GPU KV cache size|Maximum concurrency|CUDA graph|Graph capturing|"
                     r"torch.compile takes|Sleep mode|to wake up|Model loading took", re.IGNORECASE)


def step_times(path: Path) -> dict[int, float]:
    """Step count -> seconds since the command, from the runner's 'COUNT SECONDS' lines."""
    out: dict[int, float] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2:
                out.setdefault(int(parts[0]), float(parts[1]))
    return out


def peak_gib(path: Path) -> float | None:
    """The largest MiB of a 'time, MiB' CSV (gpu_mem.csv, host_mem.csv) in GiB; rows that do not parse are skipped."""
    used = []
    if path.is_file():
        for row in csv.reader(path.read_text().splitlines()):
            try:
                used.append(float(row[-1]))
            except (ValueError, IndexError):
                continue
    return round(max(used) / 1024, 2) if used else None


def arm_figures(run_dir: Path, out: Path, arm: str, gpu: str, cluster: str, wall_s: float, exit_code: int,
                sequences: int) -> dict:
    base = figures(run_dir, arm, wall_s)
    steps = step_times(out / "step_times.txt")
    per_step = base.pop("per_step")
    first = min(per_step, default=None)
    steady = [data for step, data in sorted(per_step.items()) if step != first]
    step1 = per_step.get(first)
    # each step's time without a checkpoint save in it
    unsaved = [d.get("timing_s/step", 0.0) - d.get("timing_s/save_checkpoint", 0.0) for d in steady]

    def median(key: str) -> float | None:
        values = [d[key] for d in steady if key in d]
        return statistics.median(values) if values else None

    tokens_per_s = [d["response_length/mean"] * sequences / seconds for d, seconds in zip(steady, unsaved, strict=True)
                    if "response_length/mean" in d and seconds]
    parts = {key.split("/")[-1]: median(key) for key in PARTS}
    first_done = steps.get(1)
    engine = out / "engine_lines.txt"
    lines = engine.read_text(errors="replace").splitlines() if engine.is_file() else []
    return {
        "arm": arm,
        "gpu": gpu,
        "cluster": cluster,
        "exit": exit_code,
        "wall_s": wall_s,
        "steps": base["steps"],
        "steady_steps": len(steady),
        "first_step_done_s": first_done,
        "first_step_start_s": None if first_done is None or not step1 else first_done - step1.get("timing_s/step", 0.0),
        "step_s": statistics.median(unsaved) if unsaved else None,
        "step_with_saves_s": median("timing_s/step"),
        "parts_s": {part: value for part, value in parts.items() if value is not None},
        "response_tokens_per_s_per_gpu": statistics.median(tokens_per_s) if tokens_per_s else None,
        "throughput_tokens_per_s_per_gpu": median("perf/throughput"),
        "response_length_mean": median("response_length/mean"),
        "sequences_per_step": sequences,
        "peak_gpu_gib": peak_gib(out / "gpu_mem.csv"),
        "peak_host_gib": peak_gib(out / "host_mem.csv"),
        "peak_actor_gb": base["peak_memory_gb"],
        "reward_per_step": base["reward"]["per_step"],
        "kl_loss_per_step": [(step, d.get("actor/kl_loss")) for step, d in sorted(per_step.items())],
        "engine_lines": [line for line in lines if KV_LINE.search(line)][:40],
        "per_step": per_step,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--arm", required=True)
    parser.add_argument("--gpu", required=True)
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--wall-s", type=float, required=True)
    parser.add_argument("--exit", type=int, required=True)
    parser.add_argument("--sequences", type=int, default=160)
    args = parser.parse_args()
    fig = arm_figures(args.run_dir, args.out, args.arm, args.gpu, args.cluster, args.wall_s, args.exit, args.sequences)
    (args.out / "figures.json").write_text(json.dumps(fig, indent=1, sort_keys=True))
    parts = ", ".join(f"{k} {v:.2f}" for k, v in fig["parts_s"].items())
    print(f"{args.arm} on {args.gpu}: exit {args.exit}, steps {fig['steps']}, first step done at "
          f"{fig['first_step_done_s']} s, steady step {fig['step_s']} s ({parts}), response tokens/s/GPU "
          f"{fig['response_tokens_per_s_per_gpu']}, peak {fig['peak_gpu_gib']} GiB (host {fig['peak_host_gib']} GiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
