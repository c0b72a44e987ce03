"""scripts/bench_sync_check.py as a user runs it on the CPU: exit 0, both sides of the check agree on Qwen2.5-1.5B's
339-tensor layout (an FSDP2 state dict cast to bf16 against a bf16 copy read back), and one JSON line of timings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_sync_check_runs_and_both_sides_agree():
    done = subprocess.run([sys.executable, "scripts/bench_sync_check.py", "--repeats", "1", "--layers", "4"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["tensors"] == 4 * 12 + 3  # 12 a layer, the embedding, the final norm, the tied head's name
    assert result["device"] == "cpu" and result["training_side_ms"] > 0 and result["generation_side_ms"] > 0
