"""Memory per GPU: the formulas of memory.py checked number by number."""

import pytest

from hybrid_engine.groups import hybrid_groups
from hybrid_engine.layout import FSDP_ORDER, InferLayout, TrainLayout
from hybrid_engine.model_spec import build_spec
from hybrid_engine.plan.memory import estimate_memory, kv_bytes_per_token
from hybrid_engine.plan.settings import GIB, ClusterSpec, PlanSettings

CLUSTER = ClusterSpec(nnodes=1, gpus_per_node=8, memory_gib=80)


def _fsdp(spec, world, t_g, settings, gen_bytes=0):
    groups = hybrid_groups(TrainLayout(dp=world, order=FSDP_ORDER), InferLayout(tp=t_g).resolve(world))
    return estimate_memory(spec, groups, CLUSTER, settings, gen_bytes)


def test_fsdp_training_state_tiny():
    spec = build_spec("tiny")  # 107_072 parameters, every dim 0 even
    m = _fsdp(spec, 2, 1, PlanSettings(strategy="fsdp2", has_ref=False))
    shard = 107_072 // 2
    layer = (64 * 64 + 64) + 2 * (32 * 64 + 32) + 64 * 64 + 3 * 128 * 64 + 2 * 64
    assert m["actor"] == {
        "params": 4 * shard,
        "grads": 4 * shard,
        "master_weights": 0,
        "optimizer": 8 * shard,
        "unsharded_layers": 3 * layer * 2,
    }


def test_megatron_training_state_llama_8b():
    spec = build_spec("llama3_1_8b")
    groups = hybrid_groups(TrainLayout(dp=2, tp=4, pp=2), InferLayout(tp=4).resolve(16))
    settings = PlanSettings(strategy="megatron")
    m = estimate_memory(spec, groups, ClusterSpec(nnodes=2), settings, 0)
    layer_split = 2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 14336 * 4096
    # last stage: 16 layers + lm_head split over tp 4, plus its norms (16 layers x 2 + final) whole
    elems = (16 * layer_split + 128256 * 4096) // 4 + 16 * 2 * 4096 + 4096
    assert elems == 1_003_884_544
    assert m["actor"]["params"] == 2 * elems
    assert m["actor"]["grads"] == 4 * elems
    assert m["actor"]["master_weights"] == 4 * elems // 2
    assert m["actor"]["optimizer"] == 8 * elems // 2


def test_kv_bytes_per_token():
    qwen = build_spec("qwen2_7b")
    assert kv_bytes_per_token(qwen, 4, 1, 2) == 28 * 2 * 1 * 128 * 2
    assert kv_bytes_per_token(qwen, 8, 1, 2) == 28 * 2 * 1 * 128 * 2  # tp 8 > 4 kv heads: one head per GPU
    assert kv_bytes_per_token(qwen, 1, 2, 2) == 14 * 2 * 4 * 128 * 2
    deepseek = build_spec("deepseek_v3")
    assert kv_bytes_per_token(deepseek, 8, 2, 2) == 31 * (512 + 64) * 2  # MLA latent, 61 layers -> 30 + 31


def test_activation_formulas():
    spec = build_spec("qwen2_5_7b")
    h, layers, vocab, heads = 3584, 28, 152064, 28
    base = {"strategy": "fsdp2", "ppo_max_token_len_per_gpu": 8192, "has_ref": False}
    ckpt = _fsdp(spec, 8, 2, PlanSettings(gradient_checkpointing=True, **base))["activations"]
    assert ckpt["activations"] == 8192 * (2 * h * layers + 34 * h)
    assert ckpt["logits"] == 8192 * vocab * 8
    full = _fsdp(spec, 8, 2, PlanSettings(gradient_checkpointing=False, **base))["activations"]
    assert full["activations"] == 8192 * 34 * h * layers
    eager = _fsdp(spec, 8, 2, PlanSettings(gradient_checkpointing=False, flash_attention=False, **base))
    assert eager["activations"]["activations"] == 8192 * (34 * h + 5 * heads * 2048) * layers
    fixed = _fsdp(spec, 8, 2, PlanSettings(use_dynamic_bsz=False, ppo_micro_batch_size_per_gpu=2, **base))
    assert fixed["activations"]["tokens_per_micro_batch"] == 2 * 2048
    assert fixed["activations"]["log_prob_tokens"] == 2 * 2048  # the update's micro-batch when none is given
    # verl's log-prob passes take their own micro-batch size (rollout/ref.log_prob_micro_batch_size_per_gpu)
    wide = PlanSettings(
        use_dynamic_bsz=False, ppo_micro_batch_size_per_gpu=2, log_prob_micro_batch_size_per_gpu=8, **base
    )
    wide = _fsdp(spec, 8, 2, wide)["activations"]
    assert wide["tokens_per_micro_batch"] == 2 * 2048 and wide["log_prob_tokens"] == 8 * 2048
    assert wide["log_prob_logits"] == 8 * 2048 * vocab * 4


def test_offload_lowers_generation_not_training():
    spec = build_spec("qwen2_5_7b")
    none = _fsdp(spec, 8, 2, PlanSettings(strategy="fsdp2"), gen_bytes=7 * GIB)
    full = _fsdp(spec, 8, 2, PlanSettings.with_offload("full", strategy="fsdp2"), gen_bytes=7 * GIB)
    actor = none["actor"]
    assert none["phases"]["training"] == full["phases"]["training"] + none["ref_params"]
    assert none["phases"]["generation"] - full["phases"]["generation"] == (
        actor["params"] + actor["optimizer"] + none["ref_params"]
    )
    assert full["phases"]["generation"] == int(0.5 * 80 * GIB)


def test_rollout_reservation_and_sleep():
    spec = build_spec("qwen2_5_7b")
    awake = _fsdp(spec, 8, 2, PlanSettings(strategy="fsdp2", free_cache_engine=False), gen_bytes=7 * GIB)
    asleep = _fsdp(spec, 8, 2, PlanSettings(strategy="fsdp2", free_cache_engine=True), gen_bytes=7 * GIB)
    reserved = int(0.5 * 80 * GIB)
    assert awake["phases"]["training"] - asleep["phases"]["training"] == reserved
    assert asleep["rollout"]["kv_cache"] == reserved - 7 * GIB
    assert asleep["rollout"]["kv_cache_tokens"] == (reserved - 7 * GIB) // (28 * 2 * 2 * 128 * 2)


def test_fits_and_headroom():
    big = _fsdp(build_spec("llama3_1_70b"), 8, 8, PlanSettings(strategy="fsdp2"), gen_bytes=17 * GIB)
    assert not big["fits"] and big["peak_phase"] == "training"
    assert big["headroom_bytes"] == 80 * GIB - big["peak_bytes"] < 0
    small = _fsdp(build_spec("qwen2_5_0_5b"), 8, 1, PlanSettings(strategy="fsdp2"), gen_bytes=GIB)
    assert small["fits"] and small["headroom_bytes"] > 2 * GIB


@pytest.mark.parametrize("utilization", [0.1, 0.9])
def test_engine_reservation_scales_with_utilization(utilization):
    spec = build_spec("qwen2_5_0_5b")
    m = _fsdp(spec, 8, 1, PlanSettings(strategy="fsdp2", gpu_memory_utilization=utilization), gen_bytes=GIB)
    assert m["rollout"]["reserved"] == int(utilization * 80 * GIB)
