"""Memory per GPU of a colocated verl run (actor, ref, critic and the rollout engine share every GPU).

The model, in bytes per GPU, phase by phase (the peak phase decides whether the run fits):

Training state of the actor (the critic, when there is one, is the same size):
  fsdp / fsdp2   verl loads the actor in fp32 and shards every tensor's dim 0 over all N ranks (FSDP2 Shard(0)):
                 params 4 B (the fp32 copy is the master), grads 4 B, Adam m and v 8 B per held element; plus the
                 unsharded bf16 parameters of the layer being computed, the prefetched one and its gradient
                 (3 x the largest decoder layer).
  megatron       bf16 params 2 B and fp32 main grads 4 B per element of the rank's (tp, pp, ep) shard; the
                 distributed optimizer shards the fp32 master 4 B and Adam m, v 8 B over dp*cp (experts over
                 dp*cp/ep).
Offload (verl moves states back to the GPU for the phase that uses them, so offload lowers the OTHER phases):
  param      actor/ref/critic params and grads on CPU outside their compute; optimizer  optimizer states (and the
  megatron master weights) on CPU outside the update; full  both.
Activations of one micro-batch (tokens = ppo_max_token_len_per_gpu with dynamic batch size, else
  ppo_micro_batch_size_per_gpu * (prompt + response); log-prob passes: log_prob_max_token_len_per_gpu, else
  log_prob_micro_batch_size_per_gpu * (prompt + response)), Korthikanti et al. 2022 with 2-byte activations:
  no checkpointing   34*h (+ 5*heads*seq without flash attention) bytes per token per layer, all layers kept;
  checkpointing      2*h bytes per token per layer (each layer's input) + one layer's full 34*h recomputed.
  Megatron divides by tp (sequence parallel) and keeps the layers of p in-flight micro-batches on its first stage
  (about all L layers); FSDP keeps all L layers. Logits: vocab * 4 B (fp32) per token, twice in training (logits
  and their gradient), divided by tp (vocab-parallel). The log-prob phase keeps one layer and the fp32 logits.
Rollout engine (vLLM/SGLang colocated): it takes gpu_memory_utilization of the GPU for its weights (the generation
  shard in ``dtype``) and KV cache; KV bytes per token per GPU = layers of the generation stage * 2 * kv heads per
  TP rank (at least 1) * head_dim * dtype (MLA: (kv_lora_rank + qk_rope_head_dim) * dtype per layer, replicated).
  With free_cache_engine the engine sleeps during training (KV freed, weights offloaded), otherwise it stays.
Phases: generation = engine + resident states that are not offloaded; training = actor update with everything it
  needs + resident ref/critic + the engine unless it sleeps; log_prob = forward-only pass. fits = peak +
  min_headroom_gib <= GPU memory.
"""

from __future__ import annotations

import math

import numpy as np

from hybrid_engine.groups import HybridGroups
from hybrid_engine.model_spec import ModelSpec
from hybrid_engine.plan.bytes import expert_counts, fsdp_chunk, stage_bounds, stage_tables
from hybrid_engine.plan.settings import GIB, ClusterSpec, PlanSettings, dtype_bytes

__all__ = ["estimate_memory", "kv_bytes_per_token"]


def _fsdp_shard_elems(spec: ModelSpec, world: int) -> int:
    """Elements rank 0 holds under FSDP2 Shard(0) (rank 0 holds the most: torch.chunk fills ranks in order)."""
    total = 0
    zero = np.zeros(1, dtype=np.int64)
    for tensor in spec.tensors:
        if tensor.tied_to is None:
            start, stop = fsdp_chunk(tensor.shape[0], world, zero)
            total += int(stop[0] - start[0]) * (tensor.numel // tensor.shape[0])
    return total


def _largest_layer_elems(spec: ModelSpec) -> int:
    per_layer: dict[int, int] = {}
    for tensor in spec.tensors:
        if tensor.layer is not None:
            per_layer[tensor.layer] = per_layer.get(tensor.layer, 0) + tensor.numel
    return max(per_layer.values(), default=0)


def kv_bytes_per_token(spec: ModelSpec, t_g: int, p_g: int, dtype_size: int) -> int:
    """KV-cache bytes one generation GPU stores per token (its stage's layers, its kv heads)."""
    arch = spec.arch
    bounds = stage_bounds(arch.num_hidden_layers, p_g)
    layers = max(bounds[s + 1] - bounds[s] for s in range(p_g))
    if arch.is_mla:
        return layers * (arch.kv_lora_rank + arch.qk_rope_head_dim) * dtype_size
    heads_per_rank = max(1, math.ceil(arch.num_key_value_heads / t_g))
    return layers * 2 * heads_per_rank * arch.head_dim * dtype_size


def _training_state(spec: ModelSpec, groups: HybridGroups, settings: PlanSettings, fsdp: bool) -> dict[str, int]:
    """Bytes per GPU of one trained model (actor or critic): params, grads, master_weights, optimizer, working set."""
    compute = dtype_bytes(settings.dtype)
    if fsdp:
        shard = _fsdp_shard_elems(spec, groups.world_size)
        return {
            "params": shard * 4,
            "grads": shard * 4,
            "master_weights": 0,
            "optimizer": shard * 8,
            "unsharded_layers": 3 * _largest_layer_elems(spec) * compute,
            "param_elems": shard,
        }
    tables = stage_tables(spec, groups)
    a = groups.arrays
    stage, tp, ep = a["stage"], a["tp"], a["ep"]
    if tables.experts:
        counts = expert_counts(tables.experts, groups.ep)[ep]
    else:
        counts = np.zeros_like(ep)
    dense = tables.own_d[stage, tp]
    expert = tables.own_e[stage, tp] * counts
    worst = int(np.argmax(dense + expert))
    dense_elems, expert_elems = int(dense[worst]), int(expert[worst])
    dp_cp = groups.train.dp * groups.train.cp
    edp = max(dp_cp // groups.train.ep, 1)
    return {
        "params": (dense_elems + expert_elems) * compute,
        "grads": (dense_elems + expert_elems) * 4,
        "master_weights": -(-dense_elems * 4 // dp_cp) + -(-expert_elems * 4 // edp),
        "optimizer": -(-dense_elems * 8 // dp_cp) + -(-expert_elems * 8 // edp),
        "unsharded_layers": 0,
        "param_elems": dense_elems + expert_elems,
    }


def _activations(spec: ModelSpec, groups: HybridGroups, settings: PlanSettings, fsdp: bool) -> dict[str, int]:
    arch = spec.arch
    h, layers, vocab = arch.hidden_size, arch.num_hidden_layers, arch.vocab_size
    seq = settings.sequence_length
    if settings.use_dynamic_bsz:
        tokens = settings.ppo_max_token_len_per_gpu
    else:
        tokens = settings.ppo_micro_batch_size_per_gpu * seq
    log_prob_tokens = settings.log_prob_max_token_len_per_gpu or settings.ppo_max_token_len_per_gpu
    if not settings.use_dynamic_bsz:
        log_prob_tokens = (settings.log_prob_micro_batch_size_per_gpu or settings.ppo_micro_batch_size_per_gpu) * seq
    attention_scores = 0 if settings.flash_attention else 5 * arch.num_attention_heads * seq
    full_layer = 34 * h + attention_scores
    tp = 1 if fsdp else groups.train.tp
    if fsdp:
        layers_kept = layers
    else:
        p = groups.train.pp
        layers_kept = math.ceil(layers / p) * p  # first stage: p micro-batches in flight (1F1B)
    if settings.gradient_checkpointing:
        per_token = 2 * h * layers_kept + full_layer
        formula = "tokens * (2*h*layers + (34*h + attn)) / tp"
    else:
        per_token = full_layer * layers_kept
        formula = "tokens * (34*h + attn) * layers / tp"
    return {
        "tokens_per_micro_batch": tokens,
        "layers_kept": layers_kept,
        "activations": tokens * per_token // tp,
        "logits": tokens * vocab * 4 * 2 // tp,
        "log_prob_tokens": log_prob_tokens,
        "log_prob_activations": log_prob_tokens * full_layer // tp,
        "log_prob_logits": log_prob_tokens * vocab * 4 // tp,
        "formula": formula,
    }


def estimate_memory(
    spec: ModelSpec,
    groups: HybridGroups,
    cluster: ClusterSpec,
    settings: PlanSettings,
    generation_weight_bytes: int,
) -> dict:
    """The per-GPU memory breakdown (bytes) of every phase, the peak, headroom and whether it fits.

    ``generation_weight_bytes``: the largest generation shard one GPU holds (from the byte accounting).
    """
    fsdp = settings.is_fsdp
    compute = dtype_bytes(settings.dtype)
    gpu = cluster.memory_bytes
    actor = _training_state(spec, groups, settings, fsdp)
    acts = _activations(spec, groups, settings, fsdp)
    critic = dict(actor) if settings.has_critic else None
    ref_params = actor["param_elems"] * compute if settings.has_ref else 0

    reserved = int(settings.gpu_memory_utilization * gpu)
    kv_cache = reserved - generation_weight_bytes
    per_token = kv_bytes_per_token(spec, groups.t_g, groups.p_g, compute)
    kv_tokens = max(kv_cache, 0) // per_token if per_token else 0

    def resident(state: dict[str, int] | None) -> int:
        """What a trained model keeps on the GPU outside its own update."""
        if state is None:
            return 0
        kept = 0
        if not settings.param_offload:
            kept += state["params"] + (0 if fsdp else state["grads"])  # FSDP frees grads after the step
        if not settings.optimizer_offload:
            kept += state["optimizer"] + state["master_weights"]
        return kept

    def full(state: dict[str, int]) -> int:
        return state["params"] + state["grads"] + state["master_weights"] + state["optimizer"]

    ref_resident = 0 if settings.param_offload else ref_params
    generation = reserved + resident(actor) + resident(critic) + ref_resident
    training = (
        full(actor)
        + actor["unsharded_layers"]
        + acts["activations"]
        + acts["logits"]
        + resident(critic)
        + ref_resident
        + (0 if settings.free_cache_engine else reserved)
    )
    log_prob = (
        resident(actor)
        + (actor["params"] if settings.param_offload else 0)
        + actor["unsharded_layers"]
        + acts["log_prob_activations"]
        + acts["log_prob_logits"]
        + resident(critic)
        + ref_resident
        + (0 if settings.free_cache_engine else reserved)
    )
    phases = {"generation": generation, "training": training, "log_prob": log_prob}
    peak_phase = max(phases, key=phases.get)
    peak = phases[peak_phase]
    headroom = gpu - peak
    return {
        "gpu_bytes": gpu,
        "actor": {key: value for key, value in actor.items() if key != "param_elems"},
        "critic": None if critic is None else {k: v for k, v in critic.items() if k != "param_elems"},
        "ref_params": ref_params,
        "activations": {
            "tokens_per_micro_batch": acts["tokens_per_micro_batch"],
            "layers_kept": acts["layers_kept"],
            "activations": acts["activations"],
            "logits": acts["logits"],
            "log_prob_tokens": acts["log_prob_tokens"],
            "log_prob_activations": acts["log_prob_activations"],
            "log_prob_logits": acts["log_prob_logits"],
            "gradient_checkpointing": settings.gradient_checkpointing,
            "formula": acts["formula"],
        },
        "rollout": {
            "reserved": reserved,
            "weights": generation_weight_bytes,
            "kv_cache": kv_cache,
            "kv_bytes_per_token": per_token,
            "kv_cache_tokens": kv_tokens,
            "sequences_in_cache": kv_tokens // settings.sequence_length,
            "sleeps_during_training": settings.free_cache_engine,
        },
        "phases": phases,
        "peak_phase": peak_phase,
        "peak_bytes": peak,
        "headroom_bytes": headroom,
        "min_headroom_bytes": int(settings.min_headroom_gib * GIB),
        "fits": headroom >= settings.min_headroom_gib * GIB and kv_cache > 0,
    }
