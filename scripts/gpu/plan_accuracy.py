"""Plan accuracy: the planner's memory predictions next to the peaks the GPU benchmarks measured.

    python scripts/gpu/plan_accuracy.py --handoff runs/gpu/handoff_qwen2_7b.json --dynamic runs/gpu/dynamic_batch.json \
        --json runs/gpu/plan_accuracy.json

Needs no GPU: it reads the JSONs of ``bench_handoff.py`` and ``bench_dynamic_batch.py`` (each already holds the
planner's numbers for its own configuration, computed by the same code ``action=plan`` runs) and prints, per run and
phase, predicted bytes, measured ``torch.cuda.max_memory_allocated``, and the error (predicted - measured) / measured.
Target: within 15%.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import GIB, pct_error, write_json  # noqa: E402

TARGET_PCT = 15.0


def handoff_rows(data: dict) -> list[dict]:
    pack = data.get("schemes", {}).get("pack")
    if not pack or not pack.get("plan") or pack.get("peak_absolute_bytes") is None:
        return []
    plan = pack["plan"]
    rows = [
        {
            "run": f"handoff {data['model']}",
            "phase": "switch (shards + generation weights + executor buffers)",
            "planned_bytes": plan["peak_bytes_planned"],
            "measured_bytes": pack["peak_absolute_bytes"],
            "planner": "plan.bytes peak_param_bytes + training shard bytes + executor's tracked buffers",
        }
    ]
    if pack.get("peak_extra_bytes"):
        rows.append(
            {
                "run": f"handoff {data['model']}",
                "phase": "switch, extra memory only",
                "planned_bytes": plan["executor_extra_bytes_planned"],
                "measured_bytes": pack["peak_extra_bytes"],
                "planner": "executor's tracked buffers (MemoryTracker)",
            }
        )
    return rows


def dynamic_rows(data: dict) -> list[dict]:
    rows = []
    for arm, row in data.get("arms", {}).items():
        for phase, planned_key, measured_key in (
            ("log-prob pass", "planned_log_prob_bytes", "log_prob_peak_bytes"),
            ("update pass", "planned_update_bytes", "update_peak_bytes"),
        ):
            if row.get(measured_key) is None:
                continue
            rows.append(
                {
                    "run": f"actor {data['model']} {arm}",
                    "phase": phase,
                    "planned_bytes": row[planned_key],
                    "measured_bytes": row[measured_key],
                    "planner": "hybrid_engine.plan.memory.estimate_memory (no ref, no rollout engine)",
                }
            )
    return rows


def collect(handoffs: list[Path], dynamics: list[Path]) -> dict:
    rows = []
    missing = [str(p) for p in [*handoffs, *dynamics] if not Path(p).is_file()]
    for path in handoffs:
        if Path(path).is_file():
            rows += handoff_rows(json.loads(Path(path).read_text()))
    for path in dynamics:
        if Path(path).is_file():
            rows += dynamic_rows(json.loads(Path(path).read_text()))
    for row in rows:
        row["error_pct"] = pct_error(row["planned_bytes"], row["measured_bytes"])
        row["within_target"] = abs(row["error_pct"]) <= TARGET_PCT
    return {
        "target_pct": TARGET_PCT,
        "rows": rows,
        "missing_inputs": missing,
        "all_within_target": bool(rows) and all(r["within_target"] for r in rows),
    }


def render(result: dict) -> str:
    lines = [f"{'run':<32} {'phase':<56} {'plan GiB':>9} {'measured GiB':>13} {'error':>8}  within 15%"]
    for row in result["rows"]:
        ok = "yes" if row["within_target"] else "NO"
        lines.append(
            f"{row['run']:<32} {row['phase']:<56} {row['planned_bytes'] / GIB:>9.2f} "
            f"{row['measured_bytes'] / GIB:>13.2f} {row['error_pct']:>+7.1f}%  {ok}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--handoff", type=Path, nargs="*", default=[])
    parser.add_argument("--dynamic", type=Path, nargs="*", default=[])
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    result = collect(args.handoff, args.dynamic)
    print(render(result))
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
