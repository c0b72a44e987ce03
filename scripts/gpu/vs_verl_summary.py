"""The side-by-side table of scripts/gpu/vs_verl.sh's arms, and the summary JSON (arms named verl, port, pack).

    python scripts/gpu/vs_verl_summary.py RESULTS_DIR [--json RESULTS_DIR/summary.json]

Reads RESULTS_DIR/<arm>/figures.json (scripts/gpu/vs_verl_figures.py) for every arm there, prints one row per arm
(the GPU each ran on, time to the first step, the steady step and its parts, response tokens/s/GPU, peak memory)
and the ratios the comparison is about: port against verl (step time and time to the first step; the goal: within
3%), pack against verl (response tokens/s/GPU; the source article's 1.4x). Arms that ran on different GPUs are not
compared: the ratio is left out and the line says why. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ORDER = ("verl", "port", "portverl", "pack", "pack7b")
PARTS = ("gen", "old_log_prob", "ref", "update_actor", "update_weights")


def load(results: Path) -> dict[str, dict]:
    arms = {}
    for arm in ORDER:
        path = results / arm / "figures.json"
        if path.is_file():
            arms[arm] = json.loads(path.read_text())
    return arms


def _fmt(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def ratios(arms: dict[str, dict]) -> dict[str, dict]:
    """port/verl, portverl/verl and pack/verl, each only between arms of one GPU."""
    out: dict[str, dict] = {}
    base = arms.get("verl")
    for arm in ("port", "portverl", "pack"):
        other = arms.get(arm)
        if base is None or other is None:
            continue
        if other["gpu"] != base["gpu"]:
            out[arm] = {"why_not": f"{arm} ran on {other['gpu']}, verl on {base['gpu']}"}
            continue

        def ratio(key: str, arm_fig=other) -> float | None:
            a, b = arm_fig.get(key), base.get(key)
            return None if not a or not b else a / b

        out[arm] = {
            "step_s": ratio("step_s"),
            "first_step_done_s": ratio("first_step_done_s"),
            "response_tokens_per_s_per_gpu": ratio("response_tokens_per_s_per_gpu"),
        }
    return out


def table(arms: dict[str, dict]) -> list[str]:
    head = ("| arm | GPU | exit | first step done | steady steps | steady step | " + " | ".join(PARTS)
            + " | response tok/s/GPU | peak GPU | peak host |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for arm, fig in arms.items():
        parts = " | ".join(_fmt(fig["parts_s"].get(part)) for part in PARTS)
        host = fig.get("peak_host_gib")
        lines.append(f"| {arm} | {fig['gpu']} | {fig['exit']} | {_fmt(fig['first_step_done_s'], 1)} s | "
                     f"{fig.get('steady_steps', '-')} | {_fmt(fig['step_s'])} s | {parts} | "
                     f"{_fmt(fig['response_tokens_per_s_per_gpu'], 0)} | {_fmt(fig['peak_gpu_gib'], 1)} GiB | "
                     f"{'-' if host is None else _fmt(host, 1) + ' GiB'} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    arms = load(args.results)
    if not arms:
        print(f"vs_verl_summary: no <arm>/figures.json under {args.results}", file=sys.stderr)
        return 1
    for line in table(arms):
        print(line)
    found = ratios(arms)
    for arm, values in found.items():
        if "why_not" in values:
            print(f"{arm} / verl: not compared ({values['why_not']})")
        else:
            print(f"{arm} / verl: step time x{_fmt(values['step_s'], 3)}, time to the first step "
                  f"x{_fmt(values['first_step_done_s'], 3)}, response tokens/s/GPU "
                  f"x{_fmt(values['response_tokens_per_s_per_gpu'], 3)}")
    summary = {"arms": {arm: {k: v for k, v in fig.items() if k != "per_step"} for arm, fig in arms.items()},
               "ratios_to_verl": found}
    out = args.json or args.results / "summary.json"
    out.write_text(json.dumps(summary, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
