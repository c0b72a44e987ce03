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
        "layer_shard": 4 * layer // 2,  # the fp32 shard CPUOffloadPolicy copies in
        "optimizer_step": 4 * shard,  # AdamW (foreach): one fp32 temporary per element at the step
    }


def test_cpu_offload_policy_moves_the_states_to_the_host():
    """FSDP2's CPUOffloadPolicy: params, grads and Adam states (16 B per element) on the CPU in every phase, the step
    there too; the offloaded ref (2 B per element) beside them; fsdp (FSDP1) does not read the switch."""
    spec = build_spec("tiny")
    shard = 107_072 // 2
    none = _fsdp(spec, 2, 1, PlanSettings(strategy="fsdp2"))
    policy = _fsdp(spec, 2, 1, PlanSettings(strategy="fsdp2", offload_policy=True))
    assert policy["host"]["per_gpu"] == 16 * shard + 2 * shard
    assert policy["host"]["per_node"] == 8 * (16 * shard + 2 * shard)  # CLUSTER: 8 GPUs a node
    assert none["host"]["per_gpu"] == 0
    assert none["phases"]["training"] - policy["phases"]["training"] >= 16 * shard
    assert policy["phases"]["generation"] == policy["rollout"]["reserved"]  # nothing resident beside the engine
    fsdp1 = _fsdp(spec, 2, 1, PlanSettings(strategy="fsdp", offload_policy=True))
    assert fsdp1["phases"] == _fsdp(spec, 2, 1, PlanSettings(strategy="fsdp"))["phases"]


def test_host_memory_is_checked_when_known():
    spec = build_spec("qwen2_5_7b")  # 7,615,616,512 parameters (the model card's count)
    groups = hybrid_groups(TrainLayout(dp=1, order=FSDP_ORDER), InferLayout(tp=1).resolve(1))
    settings = PlanSettings(strategy="fsdp2", offload_policy=True, max_prompt_length=512, max_response_length=512,
                            gpu_memory_utilization=0.36, ppo_max_token_len_per_gpu=4096)
    offloaded = 7_615_616_512 * (16 + 2)  # the actor's fp32 params, grads, m, v and the bf16 ref
    for host_gib, fits in ((128, False), (160, True), (None, None)):
        cluster = ClusterSpec(nnodes=1, gpus_per_node=1, memory_gib=80, host_memory_gib=host_gib)
        m = estimate_memory(spec, groups, cluster, settings, 7_615_616_512 * 2)
        assert m["host"]["per_node"] == offloaded
        assert m["host"]["fits"] is fits
        assert m["gpu_fits"]
        assert m["fits"] is (fits is not False)


def test_foreach_off_drops_the_adamw_step_temporary():
    spec = build_spec("qwen2_5_7b")
    groups = hybrid_groups(TrainLayout(dp=1, order=FSDP_ORDER), InferLayout(tp=1).resolve(1))
    kw = dict(strategy="fsdp2", max_prompt_length=512, max_response_length=512, ppo_max_token_len_per_gpu=1024)
    cluster = ClusterSpec(nnodes=1, gpus_per_node=1, memory_gib=141)
    on = estimate_memory(spec, groups, cluster, PlanSettings(**kw), 0)
    off = estimate_memory(spec, groups, cluster, PlanSettings(**kw, optimizer_foreach=False), 0)
    # the step's temporary (4 B per element) outweighs a 1,024-token pass: without it the pass is the peak
    assert on["phases"]["training"] - off["phases"]["training"] == 7_615_616_512 * 4 - off["training_parts"]["pass"]


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
    h, layers, vocab, inter = 3584, 28, 152064, 18944
    q, kv = 28 * 128, 4 * 128
    tokens = 8192
    base = {"strategy": "fsdp2", "ppo_max_token_len_per_gpu": tokens, "has_ref": False}
    layer = 2 * (4 + 2 * 2) * h + 2 * (4 * q + 4 * kv) + 2 * 4 * inter  # norms, attention, gated MLP (bf16)
    assert layer == 241_664
    logits = tokens * vocab * 2
    root = (2 * vocab * h + h) * 2  # embedding, untied head, final norm (bf16, unsharded)
    final_norm = tokens * 8 * h
    ckpt = _fsdp(spec, 8, 2, PlanSettings(gradient_checkpointing=True, **base))["activations"]
    assert ckpt["logits"] == logits  # remove-padding: the logits alone (flash-attn's CE writes its grad in place)
    assert ckpt["activations"] == tokens * 2 * h * layers + final_norm + root  # each layer's input kept
    full = _fsdp(spec, 8, 2, PlanSettings(gradient_checkpointing=False, **base))["activations"]
    assert full["activations"] == tokens * layer * layers + final_norm + root
    eager = _fsdp(spec, 8, 2, PlanSettings(gradient_checkpointing=False, flash_attention=False, **base))
    assert eager["activations"]["activations"] == tokens * (layer + 5 * 28 * 2048) * layers + final_norm + root
    # padded micro-batches (no remove-padding): the real tokens' copy and the padded logits' gradient; verl's
    # eager entropy over the padded logits in the log-prob pass (12 B per entry beyond them)
    padded = PlanSettings(use_remove_padding=False, use_dynamic_bsz=False, ppo_micro_batch_size_per_gpu=2,
                          log_prob_micro_batch_size_per_gpu=8, **base)
    padded = _fsdp(spec, 8, 2, padded)["activations"]
    assert padded["tokens_per_micro_batch"] == 2 * 2048 and padded["log_prob_tokens"] == 8 * 2048
    assert padded["logits"] == 3 * 2 * 2048 * vocab * 2
    assert padded["log_prob_logits"] == 8 * 2048 * vocab * (2 + 12)
    assert padded["log_prob_ref_logits"] == 8 * 2048 * vocab * (2 + 2)  # no entropy: the copy
    fixed = _fsdp(spec, 8, 2, PlanSettings(use_dynamic_bsz=False, ppo_micro_batch_size_per_gpu=2, **base))
    assert fixed["activations"]["log_prob_tokens"] == 2 * 2048  # the update's micro-batch when none is given


def test_dynamic_micro_batch_capped_by_the_pass_sequences():
    spec = build_spec("qwen2_5_0_5b")
    settings = PlanSettings(ppo_max_token_len_per_gpu=10**6, log_prob_max_token_len_per_gpu=10**6,
                            mini_batch_sequences_per_gpu=64, rollout_sequences_per_gpu=256, has_ref=False)
    acts = _fsdp(spec, 8, 1, settings)["activations"]
    assert acts["tokens_per_micro_batch"] == 64 * 2048 and acts["log_prob_tokens"] == 256 * 2048


def test_optimizer_step_decides_when_the_pass_is_small():
    spec = build_spec("qwen2_5_7b")
    m = _fsdp(spec, 1, 1, PlanSettings(ppo_max_token_len_per_gpu=2048, has_ref=False))  # one GPU: a 30 GB step
    parts = m["training_parts"]
    assert parts["optimizer_step"] > parts["pass"]
    states = sum(m["actor"][k] for k in ("params", "grads", "master_weights", "optimizer"))
    assert m["phases"]["training"] == states + parts["optimizer_step"]


def test_offload_lowers_generation_not_training():
    spec = build_spec("qwen2_5_7b")
    none = _fsdp(spec, 8, 2, PlanSettings(strategy="fsdp2"), gen_bytes=7 * GIB)
    offloaded = PlanSettings(strategy="fsdp2", param_offload=True, optimizer_offload=True)
    full = _fsdp(spec, 8, 2, offloaded, gen_bytes=7 * GIB)
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
