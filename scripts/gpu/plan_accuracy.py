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
import dataclasses
import json
import re
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


PASSES = (
    ("log-prob pass, entropy", "log_prob_entropy", "log_prob"),
    ("log-prob pass, no entropy", "log_prob_no_entropy", "log_prob_no_entropy"),
    ("update pass", "update", "update"),
)


def bench_settings(row: dict, data: dict):
    """The planner's settings for one recorded bench_memory row: the row's own composed config, as ``action=plan``
    reads it, with the benchmark's roles (only the actor: no reference model, no rollout engine) and batch."""
    from recipes.check.plan import plan_settings
    from recipes.compose.compose import compose_recipe

    cfg = compose_recipe("grpo", list(row["overrides"]))
    settings = plan_settings(cfg, has_critic=False, has_ref=False)
    batch = data["batch"]
    # the budgets as the row ran them (an auto budget was resolved on the GPU machine, from the model folder there)
    return dataclasses.replace(settings, free_cache_engine=True, mini_batch_sequences_per_gpu=batch["mini_batch"],
                               rollout_sequences_per_gpu=batch["sequences"],
                               ppo_max_token_len_per_gpu=row["ppo_max_token_len_per_gpu"],
                               log_prob_max_token_len_per_gpu=row["log_prob_max_token_len_per_gpu"])


def static_bytes(memory: dict) -> dict[str, int]:
    """The actor's resident bytes in each pass (no ref, no engine): log-prob passes run between optimizer steps, with
    the gradients freed; the update holds params, grads and optimizer states."""
    actor = memory["actor"]
    resident = actor["params"] + actor["optimizer"] + actor["master_weights"] + actor["unsharded_layers"]
    return {"log_prob": resident, "update": resident + actor["grads"]}


def memory_matrix_rows(data: dict) -> list[dict]:
    """Per recorded row and pass of bench_memory.py: the plan of the row's config (micro-batches at their configured
    size), the memory model at the micro-batches verl actually formed (from the record), and the measured peak."""
    from hybrid_engine.groups import hybrid_groups
    from hybrid_engine.layout import InferLayout, TrainLayout
    from hybrid_engine.model_spec import build_spec, load_arch
    from hybrid_engine.plan.memory import estimate_memory, fsdp_pass_bytes
    from hybrid_engine.plan.settings import ClusterSpec

    arch = load_arch(data["model"])
    shallower = re.search(r"_(\d+)l$", str(data.get("part", "")))  # bench_memory's --layers-7b: the same shapes
    if shallower:
        arch = dataclasses.replace(arch, num_hidden_layers=int(shallower.group(1)))
    spec = build_spec(arch)
    groups = hybrid_groups(TrainLayout(dp=1).resolve(1), InferLayout(tp=1).resolve(1), fsdp=True)
    cluster = ClusterSpec(nnodes=1, gpus_per_node=1, memory_gib=data["environment"]["gpu_memory_bytes"] / GIB)
    out = []
    for name, row in data["rows"].items():
        if "error" in row:
            continue
        settings = bench_settings(row, data)
        memory = estimate_memory(spec, groups, cluster, settings, spec.numel * 2)
        static = static_bytes(memory)
        acts = memory["activations"]
        planned = {
            "log_prob": static["log_prob"] + acts["log_prob_logits"],
            "log_prob_no_entropy": static["log_prob"] + acts["log_prob_ref_logits"],
            "update": memory["phases"]["training"],
        }
        for label, key, model_key in PASSES:
            measured = row.get(key, {}).get("peak_bytes")
            if measured is None:
                continue
            at_measured = static["update" if key == "update" else "log_prob"] + max(
                fsdp_pass_bytes(spec, settings, *micro)[model_key] for micro in micro_batches(row[key], settings)
            )
            out.append({
                "run": f"actor {data['model']}{'_' + shallower.group(1) + 'l' if shallower else ''} {name}",
                "phase": label,
                "planned_bytes": planned[model_key],
                "model_at_measured_bytes": at_measured,
                "measured_bytes": measured,
                "micro_batch_tokens": max(t for t, _ in micro_batches(row[key], settings)),
                "planner": "estimate_memory on the row's composed config (no ref, no engine); the model at the "
                           "micro-batches verl formed: hybrid_engine.plan.memory.fsdp_pass_bytes",
            })
    return out


def micro_batches(record: dict, settings) -> list[tuple[int, int]]:
    """(computed tokens, real tokens) of each micro-batch verl formed in one pass: padded ones compute their padding."""
    pairs = []
    for call in record["micro_batches"]:
        for real, padded in zip(call["real"], call["padded"], strict=True):
            pairs.append((real if settings.use_remove_padding else padded, real))
    return pairs


def collect(handoffs: list[Path], dynamics: list[Path], memories: list[Path] = ()) -> dict:
    rows = []
    missing = [str(p) for p in [*handoffs, *dynamics, *memories] if not Path(p).is_file()]
    for path in handoffs:
        if Path(path).is_file():
            rows += handoff_rows(json.loads(Path(path).read_text()))
    for path in dynamics:
        if Path(path).is_file():
            rows += dynamic_rows(json.loads(Path(path).read_text()))
    for path in memories:
        if Path(path).is_file():
            rows += memory_matrix_rows(json.loads(Path(path).read_text()))
    for row in rows:
        row["error_pct"] = pct_error(row["planned_bytes"], row["measured_bytes"])
        if "model_at_measured_bytes" in row:
            row["model_error_pct"] = pct_error(row["model_at_measured_bytes"], row["measured_bytes"])
        row["within_target"] = abs(row["error_pct"]) <= TARGET_PCT
    return {
        "target_pct": TARGET_PCT,
        "rows": rows,
        "missing_inputs": missing,
        "all_within_target": bool(rows) and all(r["within_target"] for r in rows),
    }


def render(result: dict) -> str:
    """One line per row; memory rows add the model at the micro-batches verl formed and its error."""
    lines = [f"{'run':<32} {'phase':<56} {'plan GiB':>9} {'measured GiB':>13} {'error':>8}  within 15%"
             f"  {'model@measured':>14} {'error':>8}"]
    for row in result["rows"]:
        ok = "yes" if row["within_target"] else "NO"
        line = (f"{row['run']:<32} {row['phase']:<56} {row['planned_bytes'] / GIB:>9.2f} "
                f"{row['measured_bytes'] / GIB:>13.2f} {row['error_pct']:>+7.1f}%  {ok:<10}")
        if "model_error_pct" in row:
            line += f"  {row['model_at_measured_bytes'] / GIB:>14.2f} {row['model_error_pct']:>+7.1f}%"
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--handoff", type=Path, nargs="*", default=[])
    parser.add_argument("--dynamic", type=Path, nargs="*", default=[])
    parser.add_argument("--memory", type=Path, nargs="*", default=[], help="bench_memory.py JSONs")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    result = collect(args.handoff, args.dynamic, args.memory)
    print(render(result))
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
