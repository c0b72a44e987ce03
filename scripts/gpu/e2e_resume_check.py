"""Did a resumed run continue where its first run saved, and did the first run learn? Read from the two run folders.

    python scripts/gpu/e2e_resume_check.py FIRST_RUN RESUMED_RUN --save-step 10 --json OUT.json

- Resume: the resumed run's steps start at SAVE+1 and end where the first run ended; the KL controller's state saved
  in ``FIRST_RUN/checkpoints/global_step_SAVE/kl_control.json`` (coefficient, step) is what the resumed run's first
  step uses, as the first run's step SAVE+1 did: GRPO's KL-loss coefficient ``kl_control/loss_coef``, KL-PPO's
  in-reward one as verl applied it, ``actor/reward_kl_penalty_coeff``. What the controller makes of that step's
  measured KL (``kl_control/next_loss_coef``, ``kl_control/reward_coef``) parts the two runs as their sampled
  batches do (sampling is not replayed): the step-by-step difference and both runs' last ``kl_control.json``
  states are reported, not required equal.
- Learning: in the first run (never interrupted), the mean reward (``critic/score/mean``) of the last K steps minus
  that of the first K (the margin), against the step-to-step spread (standard deviation of consecutive
  differences): the margin in units of that spread.

Standard library only (runs beside the GPU job). Exit 1 when the resume does not hold (steps or KL state differ).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

REWARD = "critic/score/mean"
# the coefficient a step uses, by the saved state's key (KL-PPO's first: where it is logged, it is the one that moves)
USED = {"reward_coef": "actor/reward_kl_penalty_coeff", "loss_coef": "kl_control/loss_coef"}


def metrics(run: Path) -> dict[int, dict]:
    rows: dict[int, dict] = {}
    path = run / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.is_file() else ():
        if line.strip():
            record = json.loads(line)
            rows.setdefault(int(record.get("step", 0)), {}).update(record.get("data", {}))
    return dict(sorted(rows.items()))


def kl_state(run: Path, step: int) -> dict | None:
    path = run / "checkpoints" / f"global_step_{step}" / "kl_control.json"
    return json.loads(path.read_text()).get("state") if path.is_file() else None


def learning(rows: dict[int, dict], k: int) -> dict:
    rewards = [float(row[REWARD]) for row in rows.values() if isinstance(row.get(REWARD), (int, float))]
    if len(rewards) < 2 * k:
        return {"steps": len(rewards), "error": f"needs at least {2 * k} steps with {REWARD}"}
    first, last = statistics.fmean(rewards[:k]), statistics.fmean(rewards[-k:])
    steps = [b - a for a, b in zip(rewards, rewards[1:], strict=False)]
    spread = statistics.stdev(steps)
    return {
        "steps": len(rewards),
        "k": k,
        "first_k_mean": first,
        "last_k_mean": last,
        "margin": last - first,
        "step_to_step_spread": spread,
        "margin_over_spread": (last - first) / spread if spread else None,
        "rewards": rewards,
    }


def same(x, y) -> bool:
    """Equal values, two numbers within float rounding (relative 1e-9): a coefficient saved as 0.049999999999999996
    and logged as 0.05 is the same one; a controller that started again (0.05 against 0.016) is not."""
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (x, y))
    if numbers:
        return math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-15)
    return x == y


def resume(first: Path, resumed: Path, save: int) -> dict:
    a, b = metrics(first), metrics(resumed)
    saved = kl_state(first, save)
    out: dict = {
        "first_steps": [min(a, default=None), max(a, default=None)],
        "resumed_steps": [min(b, default=None), max(b, default=None)],
        "save_step": save,
        "saved_kl_state": {k: v for k, v in (saved or {}).items() if k != "history"},
    }
    out["numbering_ok"] = bool(b) and min(b) == save + 1 and max(b) == max(a, default=None)
    # every coefficient the first resumed step uses comes out of the restored state, as the first run's did there
    first_a, first_b = a.get(save + 1, {}), b.get(save + 1, {})
    used = {key: metric for key, metric in USED.items() if metric in first_b}
    out["first_resumed_step_equal"] = {metric: same(first_a.get(metric), first_b[metric]) for metric in used.values()}
    out["saved_equals_used"] = {metric: same((saved or {}).get(key), first_b[metric]) for key, metric in used.items()}
    primary = next(iter(used), None)
    out["saved_coef"] = (saved or {}).get(primary) if primary else None
    out["resumed_first_coef"] = first_b[used[primary]] if primary else None
    out["kl_state_read_back"] = bool(used) and all(out["saved_equals_used"].values()) and all(
        out["first_resumed_step_equal"].values())
    metric = used.get(primary) if primary else None
    pairs = [(a[s].get(metric), b[s].get(metric)) for s in sorted(set(a) & set(b))] if metric else []
    diffs = [abs(x - y) for x, y in pairs if isinstance(x, (int, float)) and isinstance(y, (int, float))]
    out["coef_steps_compared"] = len(diffs)
    out["coef_max_abs_diff"] = max(diffs) if diffs else None
    rewards = [(a[s].get(REWARD), b[s].get(REWARD)) for s in sorted(set(a) & set(b))]
    reward_diffs = [abs(x - y) for x, y in rewards if isinstance(x, (int, float)) and isinstance(y, (int, float))]
    out["reward_mean_abs_diff_after_resume"] = statistics.fmean(reward_diffs) if reward_diffs else None
    last = max(b, default=None)
    end_a, end_b = (kl_state(first, last), kl_state(resumed, last)) if last else (None, None)
    if end_a and end_b:
        out["final_kl_state_equal"] = {k: same(end_a[k], end_b[k]) for k in ("step", "loss_coef", "reward_coef")}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("first", type=Path, help="the first run's folder (metrics.jsonl, checkpoints/)")
    parser.add_argument("resumed", type=Path, help="the resumed run's folder")
    parser.add_argument("--save-step", type=int, required=True, help="the checkpoint the resumed run started from")
    parser.add_argument("--k", type=int, default=5, help="steps averaged at each end for the reward margin")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if not (args.first / "metrics.jsonl").is_file():
        print(f"error: {args.first}/metrics.jsonl not found (the first run's folder)", file=sys.stderr)
        return 2
    result = {
        "resume": resume(args.first, args.resumed, args.save_step),
        "learning": learning(metrics(args.first), args.k),
    }
    r, learn = result["resume"], result["learning"]
    print(
        f"resume: steps {r['resumed_steps']} after save {r['save_step']} (numbering ok: {r['numbering_ok']}); "
        f"KL coefficient saved {r['saved_coef']} -> resumed first step {r['resumed_first_coef']} "
        f"(read back: {r['kl_state_read_back']}); max |coef diff| over {r['coef_steps_compared']} steps "
        f"{r['coef_max_abs_diff']}"
    )
    if "margin" in learn and learn["margin_over_spread"] is not None:
        print(
            f"learning: mean reward first {learn['k']} {learn['first_k_mean']:+.3f} -> last {learn['k']} "
            f"{learn['last_k_mean']:+.3f}: margin {learn['margin']:+.3f} = {learn['margin_over_spread']:.1f}x the "
            f"step-to-step spread {learn['step_to_step_spread']:.3f}"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return 0 if r["numbering_ok"] and r["kl_state_read_back"] else 1


if __name__ == "__main__":
    sys.exit(main())
