"""scripts/bench_reshard.py as a user runs it, over the layouts its docstring names (pipeline stages that hold
different tensors, TP alone, FSDP), on the tiny model: exit 0, every scheme's bytes equal the plan and every
generation tensor is verified bit for bit.

A collective mismatch in the benchmark's sync check (ranks of different pipeline stages all-reducing checksums of
different lengths) once aborted it in gloo while every unit test passed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("layout", "nproc", "schemes"),
    [
        ("tp4pp2:tp2", None, {"hybridflow", "tp_group_gather", "full_gather"}),
        ("tp2pp2:tp1", None, {"hybridflow", "tp_group_gather", "full_gather"}),
        ("fsdp:tp2", "4", {"fsdp_to_tp", "full_gather"}),
    ],
)
def test_bench_reshard_runs_its_layouts_and_matches_the_plan(tmp_path, layout, nproc, schemes):
    summary = tmp_path / "summary.json"
    command = [sys.executable, "scripts/bench_reshard.py", "--model", "tiny", "--layout", layout, "--repeat", "1",
               "--verify", "--device", "cpu", "--json", str(summary)]
    if nproc:
        command += ["--nproc", nproc]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads(summary.read_text())
    assert set(result["schemes"]) == schemes
    for scheme, row in result["schemes"].items():
        assert row["measured_equals_planned"], scheme
        assert row["mismatched"] == [], scheme
        assert row["checksum"]["generation_tensors"] > 0, scheme
    for scheme in schemes:
        assert f"verified {scheme}: every rank's generation tensors equal the reference slices" in done.stdout
    zero = "fsdp_to_tp" if "fsdp_to_tp" in schemes else "hybridflow"
    assert result["schemes"][zero]["received_max"] < result["schemes"]["full_gather"]["received_max"]
