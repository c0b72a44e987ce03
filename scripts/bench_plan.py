"""Time ``build_plan`` on two layouts and print the figures.

    python scripts/bench_plan.py [--repeat 5] [--out DIR]

- DeepSeek-V3 (671B MoE) on 4096 GPUs (512 nodes x 8): train megatron tp8 pp16 ep32 (dp 32 left over),
  generate tp8 pp2 ep16 (dp 256). Target: under 2 s.
- Qwen2-7B on 32 GPUs (4 nodes x 8): train megatron tp8 pp4, generate tp4. Target: under 0.5 s.

Both use the analytic tensor spec (no transformers import) and numpy over the ranks (no O(N^2) group lists).
The first call of a run pays for imports and caches; the figure reported is the best of ``--repeat`` cold-cache
calls after one warm-up, and the first call's time is printed too. ``--out DIR`` keeps every call's time, the plan's
figures and the environment (``DIR/bench_plan.json``) and the terminal text (``DIR/output.txt``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _raw_output import RawOutput  # noqa: E402

from hybrid_engine.layout import InferLayout, TrainLayout  # noqa: E402
from hybrid_engine.model_spec import load_arch  # noqa: E402
from hybrid_engine.plan import ClusterSpec, PlanSettings, build_plan  # noqa: E402
from hybrid_engine.plan import bytes as plan_bytes  # noqa: E402
from hybrid_engine.plan.bytes import fraction_text  # noqa: E402

CASES = [
    (
        "deepseek_v3 @ 4096 GPUs",
        "deepseek_v3",
        TrainLayout(tp=8, pp=16, ep=32),
        InferLayout(tp=8, pp=2, ep=16),
        ClusterSpec(nnodes=512, gpus_per_node=8),
        PlanSettings(strategy="megatron", param_offload=True, optimizer_offload=True),
        2.0,
    ),
    (
        "qwen2_7b @ 32 GPUs",
        "qwen2_7b",
        TrainLayout(tp=8, pp=4),
        InferLayout(tp=4),
        ClusterSpec(nnodes=4, gpus_per_node=8),
        PlanSettings(strategy="megatron"),
        0.5,
    ),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path, help="keep every call's time, the environment and the terminal text here")
    args = parser.parse_args(argv)
    raw = RawOutput(args.out, "bench_plan")
    failed = False
    cases = []
    for label, model, train, infer, cluster, settings, target in CASES:
        arch = load_arch(model)
        start = time.perf_counter()
        plan = build_plan(arch, train, infer, cluster, settings)
        first = time.perf_counter() - start
        times = []
        for _ in range(args.repeat):
            plan_bytes._slice_table.cache_clear()
            start = time.perf_counter()
            plan = build_plan(arch, train, infer, cluster, settings)
            times.append(time.perf_counter() - start)
        best = min(times)
        ok = best < target and not plan.errors
        failed |= not ok
        raw.print(
            f"{label}: build_plan best {best * 1e3:.1f} ms (first call {first * 1e3:.1f} ms), target < {target} s"
            f" -> {'ok' if ok else 'SLOW'}"
        )
        raw.print(
            f"  train dp={plan.train.dp} tp={plan.train.tp} pp={plan.train.pp} ep={plan.train.ep};"
            f" infer tp={plan.infer.tp} pp={plan.infer.pp} dp={plan.infer.dp} ep={plan.infer.ep}"
        )
        for name, scheme in plan.bytes.items():
            raw.print(
                f"  {name:<16} {scheme.max / 2**30:9.2f} GiB/GPU  {fraction_text(scheme.fraction):>10}"
                f"  {scheme.time_s * 1e3:10.1f} ms"
            )
        memory = plan.memory
        raw.print(
            f"  memory peak {memory['peak_bytes'] / 2**30:.2f} GiB in {memory['peak_phase']},"
            f" headroom {memory['headroom_bytes'] / 2**30:.2f} GiB, fits={memory['fits']}"
        )
        cases.append({
            "case": label,
            "model": model,
            "gpus": cluster.nnodes * cluster.gpus_per_node,
            "target_s": target,
            "first_call_s": first,
            "samples_s": times,
            "best_s": best,
            "ok": ok,
            "errors": list(plan.errors),
            "received_max_bytes": {name: scheme.max for name, scheme in plan.bytes.items()},
            "memory_peak_bytes": memory["peak_bytes"],
        })
    raw.write({"repeat": args.repeat, "cases": cases})
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
