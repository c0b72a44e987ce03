"""The GPU benchmarks of scripts/gpu: their logic on tiny shapes on the CPU, their figures on a GPU (marked ``gpu``).

CPU tests here are smokes of the scripts' logic (the varlen attention the dynamic-batch benchmark substitutes for
flash-attn, the plan-accuracy table, the handoff benchmark end to end on a toy shape); the ``gpu`` tests rerun the
benchmarks' checks on CUDA and skip without it (tests/conftest.py).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts" / "gpu"
sys.path.insert(0, str(SCRIPTS))

import plan_accuracy  # noqa: E402

from recipes.verl_ext.plugin import varlen_attention  # noqa: E402


def _tiny_model(implementation: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(REPO / "hybrid_engine" / "model_configs" / "tiny"))
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation=implementation).eval()


def test_varlen_attention_packed_and_padded_match_one_sequence_at_a_time():
    varlen_attention.register()
    model = _tiny_model("sdpa")
    lengths = [5, 9, 3]
    seqs = [torch.randint(0, 512, (n,)) for n in lengths]
    with torch.no_grad():
        reference = [model(input_ids=s[None]).logits[0] for s in seqs]
        model.config._attn_implementation = varlen_attention.NAME
        packed = torch.cat(seqs)[None]
        positions = torch.cat([torch.arange(n) for n in lengths])[None]
        out = model(input_ids=packed, position_ids=positions).logits[0]
        starts = [0, 5, 14]
        errors = [(out[s : s + n] - r).abs().max().item() for s, n, r in zip(starts, lengths, reference, strict=True)]
        assert max(errors) < 1e-5
        ids = torch.zeros(3, 9, dtype=torch.long)
        mask = torch.zeros(3, 9, dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = s
            mask[i, : len(s)] = 1
        out = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
        errors = [(out[i, :n] - r).abs().max().item() for i, (n, r) in enumerate(zip(lengths, reference, strict=True))]
        assert max(errors) < 1e-5
        # one packed row without the restarts in position_ids is one long sequence: the boundaries are what matter
        out = model(input_ids=packed, position_ids=torch.arange(17)[None]).logits[0]
        assert (out[5:14] - reference[1]).abs().max().item() > 1e-2


def test_packed_bounds_are_found_once_per_forward_and_never_reused_stale(monkeypatch):
    """The layers of one forward (and gradient checkpointing's recompute) share position_ids: the bounds are found
    once, not in each of the 2 layers. Another packing, or the same tensor changed in place, is found afresh, and the
    logits still match the sequences run one at a time."""
    varlen_attention.register()
    calls = []
    find = varlen_attention._cu_seqlens_from_positions
    monkeypatch.setattr(varlen_attention, "_cu_seqlens_from_positions", lambda *a: calls.append(1) or find(*a))
    model = _tiny_model(varlen_attention.NAME)

    def packed(lengths):
        seqs = [torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(n)) for n in lengths]
        return seqs, torch.cat(seqs)[None], torch.cat([torch.arange(n) for n in lengths])[None]

    def errors(out, seqs):
        with torch.no_grad():
            model.config._attn_implementation = "sdpa"
            refs = [model(input_ids=s[None]).logits[0] for s in seqs]
            model.config._attn_implementation = varlen_attention.NAME
        starts = [sum(len(x) for x in seqs[:i]) for i in range(len(seqs))]
        return max((out[st : st + len(r)] - r).abs().max().item() for st, r in zip(starts, refs, strict=True))

    seqs, ids, positions = packed([5, 9, 3])
    with torch.no_grad():
        out = model(input_ids=ids, position_ids=positions).logits[0]
    assert len(calls) == 1 and errors(out, seqs) < 1e-5
    seqs, ids, positions = packed([4, 4, 9])  # same total, other bounds: found afresh
    with torch.no_grad():
        out = model(input_ids=ids, position_ids=positions).logits[0]
    assert len(calls) == 2 and errors(out, seqs) < 1e-5
    positions[0, 4:8] = torch.arange(4, 8)  # in place: now sequences of 8 and 9
    with torch.no_grad():
        out = model(input_ids=ids, position_ids=positions).logits[0]
    assert len(calls) == 3 and errors(out, [ids[0, :8], ids[0, 8:]]) < 1e-5
    model.train()
    model.gradient_checkpointing_enable()
    model(input_ids=ids, position_ids=positions.clone()).logits.float().square().mean().backward()
    assert len(calls) == 4  # forward and recompute: once
    monkeypatch.setattr(varlen_attention, "CACHE_BOUNDS", False)
    with torch.no_grad():
        uncached = model(input_ids=ids, position_ids=positions).logits[0]
    assert len(calls) == 4 + model.config.num_hidden_layers and errors(uncached, [ids[0, :8], ids[0, 8:]]) < 1e-5


def test_varlen_self_check_on_cpu():
    check = varlen_attention.self_check(torch.device("cpu"))
    assert check["forward_rel_error"] < 1e-2 and check["grad_q_rel_error"] < 1e-2


def test_plan_accuracy_table(tmp_path):
    handoff = {
        "model": "m",
        "schemes": {
            "pack": {
                "peak_absolute_bytes": 100,
                "peak_extra_bytes": 10,
                "plan": {"peak_bytes_planned": 110, "executor_extra_bytes_planned": 8},
            }
        },
    }
    dynamic = {
        "model": "m",
        "arms": {
            "dynamic": {
                "log_prob_peak_bytes": 200,
                "planned_log_prob_bytes": 180,
                "update_peak_bytes": 400,
                "planned_update_bytes": 500,
            }
        },
    }
    (tmp_path / "h.json").write_text(json.dumps(handoff))
    (tmp_path / "d.json").write_text(json.dumps(dynamic))
    result = plan_accuracy.collect([tmp_path / "h.json"], [tmp_path / "d.json", tmp_path / "missing.json"])
    errors = [round(row["error_pct"], 1) for row in result["rows"]]
    assert errors == [10.0, -20.0, -10.0, 25.0]
    assert [row["within_target"] for row in result["rows"]] == [True, False, True, False]
    assert result["missing_inputs"] == [str(tmp_path / "missing.json")]
    assert "+25.0%" in plan_accuracy.render(result)


@pytest.mark.slow
def test_handoff_benchmark_runs_and_verifies_on_a_toy_shape(tmp_path):
    out = tmp_path / "handoff.json"
    args = ["--model", "qwen2_5_0_5b_reduced", "--device", "cpu", "--repeat", "1", "--warmup", "0"]
    schemes = "copy_floor,pack,pack_into,foreach_copy,verl_bf16"
    args += ["--bandwidth-gib", "0.02", "--schemes", schemes, "--json", str(out)]
    run = subprocess.run([sys.executable, str(SCRIPTS / "bench_handoff.py"), *args], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["verified"] is True
    assert set(result["schemes"]) == {"copy_floor", "pack", "pack_into", "foreach_copy", "verl_bf16"}
    assert result["schemes"]["pack_into"]["mismatched"] == [] and result["schemes"]["foreach_copy"]["mismatched"] == []
    pack = result["schemes"]["pack"]
    assert pack["bytes_read"] == pack["bytes_written"] == result["model_bytes"]  # tp1: the shards are the model
    assert pack["executor_stats"]["received_bytes"] == 0  # world size 1: nothing crosses a link
    assert pack["plan"]["received_bytes_planned"] == 0


# ---------------------------------------------------------------------------------------------------------------------
# on a GPU
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_varlen_kernel_on_cuda_matches_sdpa():
    check = varlen_attention.self_check(torch.device("cuda", 0))
    assert check["forward_rel_error"] < 2e-2 and check["grad_q_rel_error"] < 2e-2, check


@pytest.mark.gpu
@pytest.mark.slow
def test_handoff_on_gpu_is_exact_and_beats_verls_fp32_path(tmp_path):
    out = tmp_path / "handoff.json"
    args = ["--model", "qwen2_5_0_5b", "--device", "cuda", "--repeat", "5", "--json", str(out)]
    run = subprocess.run([sys.executable, str(SCRIPTS / "bench_handoff.py"), *args], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["verified"] is True
    schemes = result["schemes"]
    assert schemes["pack"]["seconds_median"] < schemes["verl_fp32"]["seconds_median"]
    assert schemes["pack"]["peak_extra_bytes"] < schemes["verl_fp32"]["peak_extra_bytes"]


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("verl") is None, reason="needs verl 0.9.1")
def test_dynamic_batch_on_gpu_tiny(tmp_path):
    out = tmp_path / "dynamic.json"
    args = ["--model", "tiny", "--batch", "64", "--mini-batch", "32", "--max-prompt", "32", "--max-response", "64"]
    args += ["--prompt-min", "4", "--response-median", "12", "--repeat", "1", "--no-torch-compile"]
    args += ["--model-dir", str(tmp_path / "model"), "--json", str(out)]
    run = subprocess.run(
        [sys.executable, str(SCRIPTS / "bench_dynamic_batch.py"), *args], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    result = json.loads(out.read_text())
    assert set(result["arms"]) == {"fixed", "dynamic"}
    assert result["log_prob_agreement"]["max_abs_diff"] < 0.1


@pytest.mark.slow  # child processes
def test_micro_batch_benchmark_runs_every_arm_at_every_size(tmp_path):
    """scripts/gpu/bench_micro_batch.py on the tiny shape on the CPU: every arm at both sizes, its table on stdout,
    the same figures in its JSON."""
    out = tmp_path / "micro_batch.json"
    args = ["--model", "tiny", "--device", "cpu", "--tokens", "48,96", "--seq-len", "24", "--warmup", "0",
            "--repeat", "1"]
    proc = subprocess.run([sys.executable, str(SCRIPTS / "bench_micro_batch.py"), *args, "--json", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["arm"], r["tokens"], r["sequences"]) for r in rows] == [
        (arm, tokens, tokens // 24) for tokens in (48, 96) for arm in ("once", "per_layer", "once_no_checkpointing")]
    assert all(r["median_s"] > 0 and r["tokens_per_s"] == pytest.approx(r["tokens"] / r["median_s"]) for r in rows)
    table = [line.split() for line in proc.stdout.splitlines() if line.startswith(("once", "per_layer"))]
    assert [(t[0], int(t[1])) for t in table] == [(r["arm"], r["tokens"]) for r in rows]
