"""Time the layout search (``plan.solve=true``, ``hybrid_engine.plan.solve``) on two requests and print the figures.

    python scripts/bench_solve.py [--repeat 5] [--out scripts/results/DATE-bench-solve]

- DeepSeek-V3 (671B MoE) on 4096 GPUs (512 nodes x 8 H100 80GB), GRPO: 8192 prompts x 8 samples per step,
  mini-batch 2048, prompt 1024 + response 2048 tokens. Target: under 10 s.
- Qwen2-7B on 16 GPUs (2 nodes x 8 H100 80GB), the GRPO recipe's defaults: 1024 prompts x 5 samples, mini-batch 256,
  prompt 512 + response 1024. Target: under 1 s.

Both search FSDP2 and Megatron with dynamic token budgets. The figure is the median of ``--repeat`` searches after
one warm-up (the tensor spec is built inside each search); the fastest layout found is printed with its time parts.
``--out DIR`` keeps every sample, the environment and the printed lines (``scripts/_raw_output.py``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _raw_output import RawOutput  # noqa: E402

from hybrid_engine.model_spec import load_arch  # noqa: E402
from hybrid_engine.plan import ClusterSpec, PlanSettings  # noqa: E402
from hybrid_engine.plan.solve import SolveRequest, solve  # noqa: E402
from hybrid_engine.plan.step_time import Workload  # noqa: E402

H100 = dict(gpus_per_node=8, gpu="h100_80g", memory_gib=80.0, nvlink_GBps=450.0, network_GBps=50.0)

CASES = [
    ("deepseek_v3 @ 4096 GPUs", SolveRequest(
        arch=load_arch("deepseek_v3"), cluster=ClusterSpec(nnodes=512, **H100),
        settings=PlanSettings(max_prompt_length=1024, max_response_length=2048, rollout_n=8),
        workload=Workload(train_batch_size=8192, ppo_mini_batch_size=2048)), 10.0),
    ("qwen2_7b @ 16 GPUs", SolveRequest(
        arch=load_arch("qwen2_7b"), cluster=ClusterSpec(nnodes=2, **H100),
        settings=PlanSettings(max_prompt_length=512, max_response_length=1024, rollout_n=5),
        workload=Workload(train_batch_size=1024, ppo_mini_batch_size=256)), 1.0),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path, help="keep the raw output here (JSON and the printed lines)")
    args = parser.parse_args(argv)
    raw = RawOutput(args.out, "bench_solve")
    failed, cases = False, []
    for label, request, target in CASES:
        solve(request)  # warm-up: imports, the slice-table cache
        times, result = [], None
        for _ in range(args.repeat):
            start = time.perf_counter()
            result = solve(request)
            times.append(time.perf_counter() - start)
        median = statistics.median(times)
        ok = median < target and bool(result.candidates)
        failed |= not ok
        raw.print(f"{label}: solve median {median:.2f} s of {args.repeat} (min {min(times):.2f}, max {max(times):.2f}),"
                  f" target < {target:g} s -> {'ok' if ok else 'SLOW' if result.candidates else 'NOTHING FITS'}")
        raw.print(f"  {result.considered} layouts, {result.allowed} allowed, {result.evaluated} planned,"
                  f" {result.fitting} fit")
        if result.candidates:
            best = result.candidates[0]
            parts = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in best.time.parts().items())
            raw.print(f"  #1 {best.describe()}: step {best.time.total:.1f} s ({parts}),"
                      f" peak {best.memory['peak_bytes'] / 2**30:.2f} GiB in {best.memory['peak_phase']}")
        cases.append({"case": label, "target_s": target, "samples_s": times, "median_s": median, "ok": ok,
                      "considered": result.considered, "allowed": result.allowed, "evaluated": result.evaluated,
                      "fitting": result.fitting,
                      "best": result.candidates[0].describe() if result.candidates else None})
    raw.write({"repeat": args.repeat, "cases": cases})
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
