"""scripts/gpu/sync_figures.py as run on the results of two vs_verl.sh arms: the medians it prints are those of the
syncs after the first, read from each arm's raw.tar.gz, the non-feeder ranks' records left out."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _arm(folder: Path, syncs: list[tuple[float, float, int]], sent: dict | None) -> Path:
    """An arm folder whose raw.tar.gz holds weight_sync.jsonl: one feeder record per (seconds, check, bytes), and a
    non-feeder record with outlying numbers that must not count."""
    lines = []
    for step, (seconds, check, nbytes) in enumerate(syncs):
        extra = {"checksum": {"match": True, "check_seconds": check}, **({"sent": sent} if sent else {})}
        lines.append({"global_steps": step, "feeder": True, "seconds": seconds, "model_bytes": nbytes, "extra": extra})
        lines.append({"global_steps": step, "feeder": False, "seconds": 99.0, "model_bytes": 1, "extra": {}})
    data = "\n".join(json.dumps(line) for line in lines).encode()
    folder.mkdir(parents=True)
    with tarfile.open(folder / "raw.tar.gz", "w:gz") as tar:
        info = tarfile.TarInfo("weight_sync.jsonl")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return folder


def test_sync_figures_prints_the_medians_of_the_later_syncs(tmp_path):
    gib = 2**30
    old = _arm(tmp_path / "old" / "pack", [(0.9, 0.7, 7 * gib), (0.1, 0.3, 7 * gib), (0.3, 0.5, 7 * gib),
                                            (0.2, 0.4, 7 * gib)], None)
    new = _arm(tmp_path / "new" / "pack", [(0.8, 0.6, 6 * gib), (0.1, 0.1, 3 * gib), (0.2, 0.2, 3 * gib)],
               {"in_rollout_dtype": 338, "skipped": ["lm_head.weight"]})
    done = subprocess.run([sys.executable, "scripts/gpu/sync_figures.py", str(old), str(new)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [(r["syncs"], r["matched"], r["transfer_s"], r["check_s"], r["bytes_gib"]) for r in rows] == [
        (4, 4, 0.2, 0.4, 7.0), (3, 3, 0.15, 0.15, 3.0)]
    assert rows[1]["in_rollout_dtype"] == 338 and rows[1]["left_out"] == ["lm_head.weight"]
    assert f"| {new} | 3 | 3 | 0.150 s | 0.150 s | 3.00 GiB | 338 | lm_head.weight |" in done.stdout
