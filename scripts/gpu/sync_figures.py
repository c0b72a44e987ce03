"""The weight syncs of scripts/gpu/vs_verl.sh arms, side by side, from each arm's raw.tar.gz (its weight_sync.jsonl).

    python scripts/gpu/sync_figures.py ARM_DIR [ARM_DIR ...]      # e.g. RESULTS/a57be1e/pack RESULTS/7144735/pack

One row per arm: syncs, the checksums' outcome, the medians over the syncs after the first (the first wakes the
engine and compiles nothing the later ones repeat) of verl's transfer (``seconds``), the check (``check_seconds``:
both sides' checksums and the read-back), and the bytes streamed, with what went in the rollout's dtype and what was
left out. Prints one JSON line per arm after the table. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tarfile
from pathlib import Path


def records(arm_dir: Path) -> list[dict]:
    """The feeder's records of weight_sync.jsonl, from the arm's raw.tar.gz."""
    with tarfile.open(arm_dir / "raw.tar.gz") as tar:
        text = tar.extractfile("weight_sync.jsonl").read().decode()
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [row for row in rows if row.get("feeder", True)]


def figures(arm_dir: Path) -> dict:
    rows = records(arm_dir)
    later = rows[1:] or rows
    checks = [row.get("extra", {}).get("checksum", {}) for row in rows]
    sent = later[-1].get("extra", {}).get("sent", {})
    return {
        "arm": str(arm_dir),
        "syncs": len(rows),
        "matched": sum(1 for check in checks if check.get("match") is True),
        "transfer_s": round(statistics.median(row["seconds"] for row in later), 4),
        "check_s": round(statistics.median(row["extra"]["checksum"]["check_seconds"] for row in later), 4),
        "bytes_gib": round(later[-1]["model_bytes"] / 2**30, 3),
        "in_rollout_dtype": sent.get("in_rollout_dtype", 0),
        "left_out": sent.get("skipped", []),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("arms", nargs="+", type=Path)
    rows = [figures(arm) for arm in parser.parse_args().arms]
    print("| arm | syncs | checksum matched | transfer (median, syncs 2+) | check | bytes a sync "
          "| sent in the rollout's dtype | left out |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for row in rows:
        left_out = ", ".join(row["left_out"]) or "-"
        print(f"| {row['arm']} | {row['syncs']} | {row['matched']} | {row['transfer_s']:.3f} s "
              f"| {row['check_s']:.3f} s | {row['bytes_gib']:.2f} GiB | {row['in_rollout_dtype']} | {left_out} |")
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
