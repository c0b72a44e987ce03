"""On a GPU machine the cluster preset follows the GPU found (issue 49, 4): a command line that names none plans for
the card it runs on, and one that names a card with more memory than this machine's is refused before anything
starts when it trains here. This CPU machine has no GPU, so the probe (``recipes.launch.gpu_found``) is replaced by
the names and sizes torch reports on the two cards the pack's GPU runs used (scripts/gpu/results/*/env.txt:
``NVIDIA H100 80GB HBM3`` with 81,559 MiB, ``NVIDIA H200`` with 143,771 MiB)."""

from __future__ import annotations

import re

import pytest

from recipes import launch
from recipes.compose.defaults import cluster_presets, preset_for
from recipes.launch import run_recipe

H100 = ("NVIDIA H100 80GB HBM3", 81_559 / 1024)
H200 = ("NVIDIA H200", 143_771 / 1024)


@pytest.mark.parametrize(("name", "gib", "option"), [
    (*H100, "h100_80g"), (*H200, "h200_141g"), ("NVIDIA A100-SXM4-80GB", 79.2, "a100_80g"),
    ("NVIDIA A100-SXM4-40GB", 39.4, None),  # the family has no 40 GB preset
    ("NVIDIA L40S", 44.4, None),
])
def test_each_card_finds_its_preset(name, gib, option):
    assert preset_for(name, gib, cluster_presets()) == option


@pytest.fixture
def on_gpu(monkeypatch, tmp_path):
    """This process as if on a machine with ``card``; returns a setter."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(launch, "has_accelerator", lambda: True)
    monkeypatch.setattr(launch, "host_memory_found", lambda: None)

    def use(card, host_gib=None):
        monkeypatch.setattr(launch, "gpu_found", lambda: card)
        monkeypatch.setattr(launch, "host_memory_found", lambda: host_gib)

    return use


@pytest.mark.slow  # a validation with the recipe's GPU defaults (5 s)
def test_a_run_that_names_no_cluster_plans_for_the_card_it_finds(on_gpu, capsys):
    on_gpu(H200)
    run_recipe("grpo", ["action=validate"])
    out, err = capsys.readouterr()
    assert "GPU found: NVIDIA H200 (140.4 GiB): cluster=h200_141g" in err
    assert "no GPU found" not in err  # the card's preset is not the laptop's embedded default
    assert " h200_141g, " in out.splitlines()[0] and "assumed" not in out


def test_training_on_a_smaller_card_than_the_named_cluster_is_refused(on_gpu, capsys, tmp_path):
    on_gpu(H100)
    with pytest.raises(SystemExit) as exit_:
        run_recipe("grpo", ["cluster=h200_141g", "trainer.total_training_steps=1"])
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.strip().splitlines() == [
        "config error: cluster=h200_141g: plans for 141 GiB per GPU > this machine's NVIDIA H100 80GB HBM3 with "
        "79.6 GiB; train here with cluster=h100_80g (or launcher=ray for the cluster it names)"]
    assert list(tmp_path.iterdir()) == []  # nothing started, nothing written


def test_validating_for_another_cluster_on_a_gpu_machine_is_allowed(on_gpu, capsys):
    on_gpu(H100)
    run_recipe("grpo", ["cluster=h200_141g", "action=validate"])
    assert " h200_141g, " in capsys.readouterr().out.splitlines()[0]


# the GPU machines the pack's runs were lent: 128 GiB, of which /proc/meminfo's MemTotal says 125.6 GiB
HOST_GIB = 125.6
QWEN_7B = 7_615_616_512  # parameters of Qwen2.5-7B (hybrid_engine/model_configs/qwen2_5_7b)


@pytest.mark.slow  # a validation with the 7B shape's plan (5 s)
def test_the_host_memory_found_checks_what_an_offload_keeps_there(on_gpu, capsys):
    """offload=full on FSDP2 keeps fp32 parameters, gradients and AdamW's two moments (16 bytes a parameter) and the
    bf16 reference model (2 bytes) on the host: more than a 128 GiB machine holds; read from the machine, not
    assumed from the preset, the plan refuses it before anything starts."""
    on_gpu(H200, HOST_GIB)
    with pytest.raises(SystemExit) as exit_:
        run_recipe("grpo", ["model=qwen2_5_7b", "parallel=tp1", "cluster.gpus_per_node=1", "rollout=vllm",
                            "offload=full", "action=validate"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    offloaded = re.search(r"config error: memory: offloaded ([0-9.]+) GiB per node .* vs cluster.host_memory_gib 125: "
                          r"DOES NOT FIT", err)
    assert offloaded and float(offloaded.group(1)) >= QWEN_7B * (16 + 2) / 2**30 - 0.05, err
    # what fits: FSDP1's manual offload keeps fp32 parameters and moments (12 bytes) and the reference (2) on the host,
    # 99.3 GiB, and loads them back for the update with AdamW's foreach temporary off
    route = "offload=full strategy=fsdp +actor_rollout_ref.actor.optim.override_optimizer_config.foreach=false"
    assert f"    {route}  (planned peak " in err
    assert QWEN_7B * (12 + 2) / 2**30 + 16 < 125
    run_recipe("grpo", ["model=qwen2_5_7b", "parallel=tp1", "cluster.gpus_per_node=1", "rollout=vllm",
                        *route.split(), "action=validate"])
    assert capsys.readouterr().out.startswith("config OK: fsdp train dp1 tp1 pp1 cp1 ep1 -> vllm infer tp1")


def test_a_typed_host_memory_is_the_users(on_gpu, capsys):
    on_gpu(H100, HOST_GIB)
    run_recipe("grpo", ["action=validate"])
    assert "host memory found: 125.6 GiB: cluster.host_memory_gib=125" in capsys.readouterr().err
    run_recipe("grpo", ["cluster.host_memory_gib=2000", "action=validate"])
    err = capsys.readouterr().err
    assert "host memory found" not in err and "GPU found: NVIDIA H100 80GB HBM3 (79.6 GiB): cluster=h100_80g" in err
