"""The side-by-side runner against verl (scripts/gpu/vs_verl.sh) on the CPU: its data, its figures, its table, and
each arm's command composed as the GPU machine runs it (verl's own Hydra for the verl arm, the pack's validation for
the others)."""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "gpu"))

import vs_verl_data  # noqa: E402
import vs_verl_figures  # noqa: E402
import vs_verl_summary  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    from recipes.verl_ext.demo import ensure_tiny_assets

    return Path(ensure_tiny_assets(tmp_path_factory.mktemp("assets")).model_dir)


def test_the_data_holds_prompts_of_the_asked_lengths_that_verls_reward_file_scores(tokenizer_dir, tmp_path):
    import pandas as pd
    from transformers import AutoTokenizer

    from recipes.verl_ext.demo.reward import compute_score

    assert vs_verl_data.main([str(tokenizer_dir), str(tmp_path), "--train", "12", "--val", "2",
                              "--min-tokens", "128", "--max-tokens", "200"]) == 0
    train = pd.read_parquet(tmp_path / "train.parquet")
    assert len(train) == 12 and len(pd.read_parquet(tmp_path / "val.parquet")) == 2
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    for _, row in train.iterrows():
        ids = tokenizer.apply_chat_template(list(row["prompt"]), add_generation_prompt=True, tokenize=True)
        length = len(ids["input_ids"] if hasattr(ids, "keys") else ids)
        # at most the drawn target; a word is a few tokens, so within a few tokens of it
        assert 120 <= length <= 200, length
        info = row["extra_info"]
        assert row["reward_model"]["ground_truth"] == str(info["a"] + info["b"])
        assert row["prompt"][0]["content"].endswith(f"{info['a']}+{info['b']}=")
        truth = row["reward_model"]["ground_truth"]
        assert compute_score(row["data_source"], str(info["a"] + info["b"]), truth)["acc"] == 1.0
    # a second call keeps what is there
    assert vs_verl_data.main([str(tokenizer_dir), str(tmp_path), "--train", "3"]) == 0
    assert len(pd.read_parquet(tmp_path / "train.parquet")) == 12


def _arm(folder: Path, steps: list[dict], times: str, mem_mib: list[int]) -> tuple[Path, Path]:
    run, out = folder / "run", folder / "out"
    run.mkdir(parents=True)
    out.mkdir(parents=True)
    lines = [json.dumps({"step": i + 1, "data": d}) + "\n" for i, d in enumerate(steps)]
    (run / "metrics.jsonl").write_text("".join(lines))
    (out / "step_times.txt").write_text(times)
    (out / "gpu_mem.csv").write_text("".join(f"2026/12/06 20:00:0{i}.000, {m}\n" for i, m in enumerate(mem_mib)))
    (out / "engine_lines.txt").write_text("INFO It took 0.097 seconds to wake up tags ['kv_cache'].\nunrelated\n")
    return run, out


def test_the_figures_leave_checkpoint_saves_out_and_count_response_tokens(tmp_path):
    steps = [{"timing_s/step": 70.0, "timing_s/gen": 8.0, "response_length/mean": 300.0}]
    steps += [{"timing_s/step": s, "timing_s/gen": 4.0, "timing_s/update_actor": 18.0, "response_length/mean": r}
              for s, r in ((38.0, 310.0), (36.0, 290.0), (35.0, 280.0), (37.0, 300.0))]
    steps.append({"timing_s/step": 55.0, "timing_s/save_checkpoint": 21.0, "timing_s/gen": 4.0,
                  "response_length/mean": 296.0})
    run, out = _arm(tmp_path, steps, "0 180.0\n1 250.0\n2 288.0\n", [1000, 60_000, 81_000, 500])
    (out / "host_mem.csv").write_text("1.0, 20000\n2.0, 101376\n3.0, garbled\n4.0, 9000\n")
    fig = vs_verl_figures.arm_figures(run, out, "verl", "NVIDIA H100 80GB HBM3", "h100_80g", 460.0, 0, 160)
    # steps 2-6 less their saves: 38, 36, 35, 37, 34 -> 36
    assert fig["step_s"] == 36.0 and fig["step_with_saves_s"] == 37.0
    # response tokens a second: 160 sequences x mean length / step time, median over the steady steps
    expected = statistics.median([310 * 160 / 38, 290 * 160 / 36, 280 * 160 / 35, 300 * 160 / 37, 296 * 160 / 34])
    assert fig["response_tokens_per_s_per_gpu"] == pytest.approx(expected)
    assert fig["first_step_done_s"] == 250.0 and fig["first_step_start_s"] == 250.0 - 70.0
    assert fig["peak_gpu_gib"] == round(81_000 / 1024, 2) and fig["peak_host_gib"] == 99.0
    assert fig["parts_s"]["gen"] == 4.0 and fig["steady_steps"] == 5
    assert fig["engine_lines"] == ["INFO It took 0.097 seconds to wake up tags ['kv_cache']."]


def _figures(folder: Path, arm: str, gpu: str, step: float, tokens: float, first: float) -> None:
    (folder / arm).mkdir(parents=True)
    (folder / arm / "figures.json").write_text(json.dumps({
        "arm": arm, "gpu": gpu, "exit": 0, "first_step_done_s": first, "step_s": step, "parts_s": {},
        "response_tokens_per_s_per_gpu": tokens, "peak_gpu_gib": 50.0, "per_step": {}}))


def test_the_summary_compares_only_arms_of_one_gpu(tmp_path, capsys):
    _figures(tmp_path, "verl", "NVIDIA H100 80GB HBM3", 36.0, 1300.0, 256.0)
    _figures(tmp_path, "port", "NVIDIA H200", 30.0, 1500.0, 240.0)
    _figures(tmp_path, "pack", "NVIDIA H100 80GB HBM3", 9.0, 5200.0, 220.0)
    assert vs_verl_summary.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "port / verl: not compared (port ran on NVIDIA H200, verl on NVIDIA H100 80GB HBM3)" in out
    assert "pack / verl: step time x0.250, time to the first step x0.859, response tokens/s/GPU x4.000" in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["arms"]) == {"verl", "port", "pack"} and "why_not" in summary["ratios_to_verl"]["port"]


def _check(arm: str, gpu: str, tmp_path: Path, **env_vars: str) -> subprocess.CompletedProcess:
    # VERL_PLATFORM: the plugin sets it in a process that imported it here (no accelerator); the arm is a new one
    env = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}
    env.update(CHECK="1", GPU_NAME=gpu, E2E_WORK=str(tmp_path / "work"), **env_vars)
    return subprocess.run(["bash", str(REPO / "scripts" / "gpu" / "vs_verl.sh"), arm, str(tmp_path / "out")],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)


@pytest.mark.slow  # child processes (verl's Hydra, the pack's validation)
def test_each_arm_composes_as_the_gpu_machine_runs_it(tmp_path):
    verl = _check("verl", "NVIDIA H100 80GB HBM3", tmp_path)
    assert verl.returncode == 0, verl.stderr[-2000:]
    # verl's own composition, the H100's micro-batch and the attention path both verl arms share
    assert "ppo_micro_batch_size_per_gpu: 20" in verl.stdout and "attn_implementation: sdpa" in verl.stdout
    pack = _check("pack", "NVIDIA H200", tmp_path)
    assert pack.returncode == 0, pack.stderr[-2000:]
    said = pack.stdout + pack.stderr
    assert "config OK: fsdp2 train dp1 tp1 pp1 cp1 ep1 -> vllm infer tp1 pp1 x1 replicas on 1x1 h200_141g" in said
    # the engine's share sized to the step on an H200: 160 sequences of 1,024 tokens, weights and working memory
    resolved = (tmp_path / "work" / "check" / "pack" / "resolved_config.yaml").read_text()
    assert "gpu_memory_utilization: 0.09" in resolved
    # the port on an H200: verl's micro-batch of 40 fits the H200's plan (the h100_80g the pack assumed without
    # cluster= refused it: 101.53 GiB > 80, scripts/gpu/results/2026-12-06-h200-vs-verl/port-refused-run.log)
    port = _check("port", "NVIDIA H200", tmp_path)
    assert port.returncode == 0, port.stderr[-2000:]
    assert "x1 replicas on 1x1 h200_141g, model qwen2_5_1_5b" in port.stdout + port.stderr
    # the port is told of verl's 2-s poll and of the plugin's stand-ins for flash-attn, which portverl then types
    assert "poll_interval: 0.1 (verl: 2.0)" in port.stderr and "run.flash_attn_fallbacks=false" in port.stderr
    # verl's run through the launcher: the port with the overrides its note prints; only the checkpoint folder differs
    portverl = _check("portverl", "NVIDIA H200", tmp_path)
    assert portverl.returncode == 0, portverl.stderr[-2000:]
    assert "note: 1 of verl's defaults differ in this run" in portverl.stderr
    assert "flash-attn is not installed here" not in portverl.stderr  # verl's own code, no fallbacks
    resolved = (tmp_path / "work" / "check" / "portverl" / "resolved_config.yaml").read_text()
    assert "KLPPO_FLASH_ATTN_FALLBACKS: '0'" in resolved
    assert "config OK: fsdp train dp1 tp1 pp1 cp1 ep1" in portverl.stdout


@pytest.mark.slow  # child processes (verl's Hydra, the pack's validation)
def test_arm_extra_reaches_the_arms_command(tmp_path):
    """ARM_EXTRA: a variant of one arm (the first-generation test: the data loader without worker processes)."""
    pack = _check("pack", "NVIDIA H200", tmp_path, ARM_EXTRA="data.dataloader_num_workers=0")
    assert pack.returncode == 0, pack.stderr[-2000:]
    resolved = (tmp_path / "work" / "check" / "pack" / "resolved_config.yaml").read_text()
    assert "dataloader_num_workers: 0" in resolved
    verl = _check("verl", "NVIDIA H100 80GB HBM3", tmp_path, ARM_EXTRA="data.dataloader_num_workers=0")
    assert verl.returncode == 0, verl.stderr[-2000:]
    assert "dataloader_num_workers: 0" in verl.stdout
    without = _check("verl", "NVIDIA H100 80GB HBM3", tmp_path)
    assert "dataloader_num_workers: 8" in without.stdout  # verl's default, as the arms ran on 2026-12-06


@pytest.mark.slow  # child processes (the pack's validation)
def test_the_7b_arm_takes_the_route_that_fits_one_h200_and_its_host(tmp_path):
    """The GPU machines this pack is lent hold 128 GiB (125 GiB in /proc/meminfo): FSDP2's CPU offload of the 7B
    shape needs 127.7 + 16 GiB there; FSDP1's manual offload with AdamW's foreach off needs 99.3 + 16 on the host and
    137.2 GiB on an H200 (docs/vs_verl.md). On an H100 the same route is refused, with the GPU's arithmetic."""
    h200 = _check("pack7b", "NVIDIA H200", tmp_path, HOST_GIB="125")
    assert h200.returncode == 0, h200.stderr[-2000:]
    assert ("config OK: fsdp train dp1 tp1 pp1 cp1 ep1 -> vllm infer tp1 pp1 x1 replicas on 1x1 h200_141g, model "
            "qwen2_5_7b") in h200.stdout + h200.stderr
    (tmp_path / "h100").mkdir()
    h100 = _check("pack7b", "NVIDIA H100 80GB HBM3", tmp_path / "h100", HOST_GIB="125")
    assert h100.returncode == 2 and "Traceback" not in h100.stderr
    peak = re.search(r"memory: planned peak ([0-9.]+) GiB per GPU in training > cluster.gpu.memory_gib 80 "
                     r"\(h100_80g\)", h100.stderr)
    # fp32 parameters, gradients and AdamW's two moments: 16 bytes for each of Qwen2.5-7B's 7,615,616,512 parameters
    assert peak and float(peak.group(1)) > 7_615_616_512 * 16 / 2**30, h100.stderr
