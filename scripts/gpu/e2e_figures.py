"""The figures of one recipe run, read from its run folder (metrics.jsonl and resolved_config.yaml), as one JSON.

    python scripts/gpu/e2e_figures.py RUN_DIR --name grpo --json OUT.json [--log RUN.log] [--wall-s S]

Per step verl 0.9.1 logs its timers (``timing_s/gen``, ``old_log_prob``, ``ref``, ``values``, ``update_critic``,
``update_actor``, ``update_weights``, ``step``, ...), its throughput (``perf/throughput``: tokens per second per
GPU, ``perf/total_num_tokens``, ``perf/time_per_step``) and the actor's peak memory (``perf/max_memory_*_gb``). This
script keeps every step's values and adds, per timer, the median over the steady steps (all but the run's first step:
Ray's workers, CUDA's context and the allocator warm up in it), the mean reward of the first and last quarter of the
steps, and the KL controller's state per step. Standard library only (runs beside the GPU job).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

REWARD_KEYS = ("critic/score/mean", "critic/rewards/mean")
MEMORY_KEYS = ("actor/perf/max_memory_allocated_gb", "actor/perf/max_memory_reserved_gb",
               "critic/perf/max_memory_allocated_gb", "critic/perf/max_memory_reserved_gb",
               "perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb")
KEEP_PREFIXES = ("timing_s/", "perf/", "actor/perf/", "critic/perf/", "kl_control/", "guard/", "critic/score/",
                 "critic/rewards/", "actor/kl_loss",
                 "actor/ppo_kl", "actor/entropy", "actor/grad_norm", "actor/pg_loss", "critic/vf_loss",
                 "training/rollout_probs_diff_mean", "response_length/mean", "actor/reward_kl_penalty")


def read_rows(path: Path) -> list[tuple[int, dict]]:
    rows: dict[int, dict] = {}
    if not path.is_file():
        return []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        step = int(record.get("step", 0))
        rows.setdefault(step, {}).update(record.get("data", {}))
    return sorted(rows.items())


def _number(value):
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def figures(run_dir: Path, name: str, wall_s: float | None = None, log: Path | None = None) -> dict:
    rows = read_rows(run_dir / "metrics.jsonl")
    steps = [step for step, _ in rows]
    per_step = {
        step: {k: v for k, v in data.items() if k.startswith(KEEP_PREFIXES) and _number(v) is not None}
        for step, data in rows
    }
    steady = rows[1:] if len(rows) > 1 else rows
    keys = sorted({k for _, data in steady for k in data if k.startswith(("timing_s/", "perf/"))})
    medians = {}
    for key in keys:
        values = [_number(data.get(key)) for _, data in steady]
        values = [v for v in values if v is not None]
        if values:
            medians[key] = statistics.median(values)
    rewards = [(step, next((_number(d[k]) for k in REWARD_KEYS if _number(d.get(k)) is not None), None))
               for step, d in rows]
    rewards = [(s, r) for s, r in rewards if r is not None]
    learning = None
    if len(rewards) >= 4:
        q = max(1, len(rewards) // 4)
        first = statistics.mean(r for _, r in rewards[:q])
        last = statistics.mean(r for _, r in rewards[-q:])
        learning = {"quarter_steps": q, "first_quarter_mean": first, "last_quarter_mean": last, "rise": last - first}
    peak = {k: max(_number(d.get(k)) or 0.0 for _, d in rows)
            for k in MEMORY_KEYS if any(k in d for _, d in rows)}
    checkpoints = sorted(int(p.name.split("_")[-1]) for p in (run_dir / "checkpoints").glob("global_step_*"))
    kl_states = {}
    for step in checkpoints:
        state_file = run_dir / "checkpoints" / f"global_step_{step}" / "kl_control.json"
        if state_file.is_file():
            kl_states[step] = json.loads(state_file.read_text())
    out = {
        "name": name,
        "run_dir": str(run_dir),
        "steps": steps,
        "first_step": steps[0] if steps else None,
        "last_step": steps[-1] if steps else None,
        "wall_s": wall_s,
        "steady_median": medians,
        "peak_memory_gb": peak,
        "reward": {"per_step": rewards, "learning": learning},
        "checkpoints": checkpoints,
        "kl_control_saved": kl_states,
        "per_step": per_step,
    }
    if log is not None and log.is_file():
        out["log_tail"] = log.read_text(errors="replace").splitlines()[-30:]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--name", required=True)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--log", type=Path)
    parser.add_argument("--wall-s", type=float)
    args = parser.parse_args()
    out = figures(args.run_dir, args.name, args.wall_s, args.log)
    args.json.write_text(json.dumps(out, indent=1, sort_keys=True))
    med = out["steady_median"]
    line = ", ".join(f"{k.split('/')[-1]} {med[k]:.3f}" for k in
                     ("timing_s/step", "timing_s/gen", "timing_s/old_log_prob", "timing_s/ref", "timing_s/values",
                      "timing_s/update_critic", "timing_s/update_actor", "timing_s/update_weights",
                      "perf/throughput") if k in med)
    learning = out["reward"]["learning"]
    rise = f"; reward {learning['first_quarter_mean']:+.3f} -> {learning['last_quarter_mean']:+.3f}" if learning else ""
    print(f"{args.name}: steps {out['first_step']}..{out['last_step']}, median {line}{rise}; "
          f"peak {out['peak_memory_gb']}; checkpoints {out['checkpoints']}")


if __name__ == "__main__":
    main()
