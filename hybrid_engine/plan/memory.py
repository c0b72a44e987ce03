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
  megatron master weights) on CPU outside the update; full  both. FSDP2's CPUOffloadPolicy (offload=full on fsdp2)
  instead keeps the fp32 params, grads and Adam states on the CPU in every phase and steps there: the GPU holds the
  layers being computed and each one's fp32 shard as it is copied in. Offloaded bytes fill the host's memory
  (``host``: per machine, checked against cluster.host_memory_gib when it is known). torch AdamW's foreach step takes
  one fp32 copy of the shard (off with optimizer_foreach=False).
Micro-batches: dynamic ones hold at most the token budget (verl makes ceil(tokens / budget) of them and balances
  them) and at most the pass's own tokens (the PPO mini-batch per GPU for the update, the rollout batch per GPU for
  the log-prob passes); fixed ones micro-batch sequences * (prompt + response), padded.
FSDP passes (``fsdp_pass_bytes``, measured on an H200: README, memory accuracy): bf16 logits, tokens * vocab * 2;
  verl's eager full-vocabulary entropy on padded micro-batches 12 B per entry more (compiled on the remove-padding
  path: nothing); padded: the real tokens' logits copied out, and in the update the padded logits' gradient
  (flash-attn's cross-entropy writes the packed gradient in place); kept layers (checkpointing: each layer's input;
  without: ``_layer_bytes_per_token`` per layer) and the final norm; the unsharded root parameters in the update. The
  update's peak is the larger of its pass and torch AdamW's step temporary (one fp32 copy of the shard).
Megatron (not measured yet): Korthikanti et al. 2022, 2-byte activations divided by tp, p micro-batches in flight
  on the first stage, fp32 logits twice in training divided by tp.
Rollout engine (vLLM/SGLang colocated): it takes gpu_memory_utilization of the GPU for its weights (the generation
  shard in ``dtype``) and KV cache (the pack's hf rollout instead keeps the whole model in fp32 on its replica's
  first GPU, awake in every phase, and frees generate's cache after each batch); KV bytes per token per GPU =
  layers of the generation stage * 2 * kv heads per TP rank (at least 1) * head_dim * dtype (MLA: (kv_lora_rank +
  qk_rope_head_dim) * dtype per layer, replicated).
  With free_cache_engine the engine sleeps during training (KV freed, weights offloaded), otherwise it stays.
Phases: generation = engine + resident states that are not offloaded; training = actor update with everything it
  needs + resident ref/critic + the engine unless it sleeps; log_prob = forward-only pass. fits = peak +
  min_headroom_gib <= GPU memory. The engine's share that works (``utilization_bounds``): at most what the GPU has
  beside the training side while the engine is awake, less the headroom; at least its weights and one sequence.
"""

from __future__ import annotations

import math

import numpy as np

from hybrid_engine.groups import HybridGroups
from hybrid_engine.model_spec import ModelSpec
from hybrid_engine.plan.bytes import expert_counts, fsdp_chunk, stage_bounds, stage_tables
from hybrid_engine.plan.settings import GIB, ClusterSpec, PlanSettings, dtype_bytes

__all__ = [
    "HOST_ROLLOUTS",
    "estimate_memory",
    "fsdp_pass_bytes",
    "kv_bytes_per_token",
    "micro_batch_tokens",
    "utilization_bounds",
]

HOST_ROLLOUTS = ("hf",)
"""Rollout engines without a reservation: the pack's HF-transformers server holds the whole model in fp32 on its
replica's first GPU (no share of the GPU to configure, nothing to sleep) and frees generate's cache after a batch."""
HOST_KV_TOKENS = 2**62
"""KV capacity reported for a host rollout: its cache is allocated per batch, not from a reservation."""
HOST_WEIGHT_BYTES = 4
"""Bytes per weight a host rollout keeps on the GPU: fp32, as the actor's weight stream hands them over."""


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
            "layer_shard": -(-_largest_layer_elems(spec) // groups.world_size) * 4,
            "optimizer_step": shard * 4,
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
        "layer_shard": 0,
        "optimizer_step": 0,  # Megatron's fused Adam (multi-tensor apply) steps without a shard-sized temporary
        "param_elems": dense_elems + expert_elems,
    }


ENTROPY_EAGER_BYTES = 12
"""Bytes per (token, vocabulary entry), beyond the logits, of verl's eager full-vocabulary entropy
(``verl_F.entropy_from_logits``: softmax, then logsumexp over the vocabulary): measured 14.0 B per entry in all, with
the 2-B logits, on an H200 at two micro-batch sizes (scripts/gpu/results/2026-12-01-h200-memory); CUDA's reductions
take fp32 copies of the whole (tokens, vocabulary) tensor (a CPU profile of the same code shows 6)."""


def _layer_bytes_per_token(arch, compute: int, seq: int, flash_attention: bool) -> int:
    """Bytes autograd keeps per token for one decoder layer (no recomputation), as HF's Llama/Qwen layers save them:
    two RMSNorms (each its fp32 input, the normalised and the weighted output), attention (q, k, v and the output,
    each held twice: by the projection or RoPE and by the attention kernel), the gated MLP (gate, up, act(gate),
    their product). Without flash attention the scores add 5 * heads * seq (Korthikanti et al. 2022)."""
    h = arch.hidden_size
    head_dim = arch.head_dim or h // arch.num_attention_heads
    q, kv = arch.num_attention_heads * head_dim, arch.num_key_value_heads * head_dim
    if arch.is_moe:
        inter = arch.moe_intermediate_size * (arch.num_experts_per_tok + arch.num_shared_experts)
        inter += arch.shared_expert_intermediate_size
    else:
        inter = arch.intermediate_size
    norms = 2 * (4 + 2 * compute) * h
    attention = compute * (4 * q + 4 * kv)
    scores = 0 if flash_attention else 5 * arch.num_attention_heads * seq
    return norms + attention + compute * 4 * inter + scores


def micro_batch_tokens(settings: PlanSettings) -> tuple[int, int]:
    """Tokens of the largest update and log-prob micro-batch per GPU (padded for fixed micro-batches).

    Dynamic: verl forms ceil(tokens / budget) micro-batches and balances them (``rearrange_micro_batches``), so the
    budget bounds the average; a pass never holds more than its sequences: the PPO mini-batch per GPU (update) or the
    rollout batch per GPU (log-prob), when known. Fixed: micro-batch sequences * (prompt + response)."""
    seq = settings.sequence_length
    if not settings.use_dynamic_bsz:
        update = settings.ppo_micro_batch_size_per_gpu * seq
        log_prob = (settings.log_prob_micro_batch_size_per_gpu or settings.ppo_micro_batch_size_per_gpu) * seq
        return update, log_prob
    update = settings.ppo_max_token_len_per_gpu
    log_prob = settings.log_prob_max_token_len_per_gpu or settings.ppo_max_token_len_per_gpu
    if settings.mini_batch_sequences_per_gpu:
        update = min(update, settings.mini_batch_sequences_per_gpu * seq)
    if settings.rollout_sequences_per_gpu:
        log_prob = min(log_prob, settings.rollout_sequences_per_gpu * seq)
    return update, log_prob


def fsdp_pass_bytes(spec: ModelSpec, settings: PlanSettings, tokens: int, real_tokens: int | None = None) -> dict:
    """Bytes one FSDP micro-batch of ``tokens`` (computed; ``real_tokens`` of them real, padding excluded) adds on top
    of the resident states, per pass, as verl 0.9.1's FSDP engine runs it:

    log_prob   the logits (tokens * vocab * dtype); the eager entropy (``ENTROPY_EAGER_BYTES`` per entry) unless the
               remove-padding path runs it compiled (``use_torch_compile``: fused, nothing extra); padded micro-batches
               copy the real tokens' logits out (``torch.cat``) once the entropy is done.
    update     the logits; padded: that copy and the padded logits' gradient (flash-attn's cross-entropy writes its
               gradient in place); the layers autograd keeps (checkpointing: each layer's input; else every layer's
               saved tensors) and the final norm's; the peak is the larger of the logits' moment and, with
               checkpointing, one layer recomputed; plus the unsharded root parameters (embedding, head, final norm).
    """
    arch = spec.arch
    compute = dtype_bytes(settings.dtype)
    real = tokens if real_tokens is None else real_tokens
    h, layers, vocab = arch.hidden_size, arch.num_hidden_layers, arch.vocab_size
    layer = _layer_bytes_per_token(arch, compute, settings.sequence_length, settings.flash_attention)
    logits = tokens * vocab * compute
    compiled = settings.use_remove_padding and settings.use_torch_compile
    entropy = 0 if compiled else tokens * vocab * ENTROPY_EAGER_BYTES
    copy = 0 if settings.use_remove_padding else real * vocab * compute
    padded_grad = 0 if settings.use_remove_padding else logits
    final_norm = tokens * (4 + 2 * compute) * h
    kept = tokens * (compute * h * layers if settings.gradient_checkpointing else layer * layers)
    update_entropy = (tokens * vocab * compute if compiled else entropy) if settings.update_entropy else 0
    at_logits = logits + copy + padded_grad + update_entropy + kept + final_norm
    recompute = kept + tokens * layer + final_norm if settings.gradient_checkpointing else 0
    root = sum(t.numel for t in spec.tensors if t.layer is None and t.tied_to is None) * compute
    return {
        "tokens": tokens,
        "real_tokens": real,
        "logits": logits,
        "layers_kept": kept,
        "log_prob": logits + (max(entropy, copy) if settings.log_prob_entropy else copy),
        "log_prob_no_entropy": logits + copy,
        "update": max(at_logits, recompute) + root,
        "update_logits": logits + copy + padded_grad + update_entropy,
        "formula": "tokens * (vocab * dtype [+ padded copy, grad] + kept layers + final norm) + root params",
    }


def _activations(spec: ModelSpec, groups: HybridGroups, settings: PlanSettings, fsdp: bool) -> dict[str, int]:
    tokens, log_prob_tokens = micro_batch_tokens(settings)
    if fsdp:
        update = fsdp_pass_bytes(spec, settings, tokens)
        log_prob = fsdp_pass_bytes(spec, settings, log_prob_tokens)
        return {
            "tokens_per_micro_batch": tokens,
            "layers_kept": spec.arch.num_hidden_layers,
            "activations": update["update"] - update["update_logits"],
            "logits": update["update_logits"],
            "log_prob_tokens": log_prob_tokens,
            "log_prob_activations": 0,
            "log_prob_logits": log_prob["log_prob"],
            "log_prob_ref_logits": log_prob["log_prob_no_entropy"],
            "formula": update["formula"],
        }
    return _megatron_activations(spec, groups, settings, tokens, log_prob_tokens)


def _megatron_activations(spec, groups, settings, tokens: int, log_prob_tokens: int) -> dict[str, int]:
    """Megatron (not measured on a GPU yet): Korthikanti et al. 2022 with 2-byte activations divided by tp (sequence
    parallel), the layers of p in-flight micro-batches on the first stage (1F1B); fp32 logits, twice in training."""
    arch = spec.arch
    h, layers, vocab = arch.hidden_size, arch.num_hidden_layers, arch.vocab_size
    seq = settings.sequence_length
    attention_scores = 0 if settings.flash_attention else 5 * arch.num_attention_heads * seq
    full_layer = 34 * h + attention_scores
    tp, p = groups.train.tp, groups.train.pp
    layers_kept = math.ceil(layers / p) * p
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
        "log_prob_ref_logits": log_prob_tokens * vocab * 4 // tp,
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

    host_rollout = settings.rollout_engine in HOST_ROLLOUTS
    if host_rollout:
        generation_weight_bytes = spec.numel * HOST_WEIGHT_BYTES  # the whole model, unsharded (tied tensors once)
        reserved = generation_weight_bytes
    else:
        reserved = int(settings.gpu_memory_utilization * gpu)
    sleeps = settings.free_cache_engine and not host_rollout  # the hf server never sleeps
    kv_cache = reserved - generation_weight_bytes
    per_token = kv_bytes_per_token(spec, groups.t_g, groups.p_g, compute)
    if host_rollout:
        kv_cache, kv_tokens = 0, HOST_KV_TOKENS
    else:
        kv_tokens = max(kv_cache, 0) // per_token if per_token else 0

    policy = settings.policy_offload

    def resident(state: dict[str, int] | None) -> int:
        """What a trained model keeps on the GPU outside its own update."""
        if state is None or policy:
            return 0
        kept = 0
        if not settings.param_offload:
            kept += state["params"] + (0 if fsdp else state["grads"])  # FSDP frees grads after the step
        if not settings.optimizer_offload:
            kept += state["optimizer"] + state["master_weights"]
        return kept

    ref_offloaded = settings.param_offload or policy
    ref_resident = 0 if ref_offloaded else ref_params
    generation = reserved + resident(actor) + resident(critic) + ref_resident
    # CPUOffloadPolicy copies each layer's fp32 shard in before its all-gather; the step runs on the CPU
    copied_in = actor["layer_shard"] if policy else 0
    backward = actor["unsharded_layers"] + copied_in + acts["activations"] + acts["logits"]
    step = 0 if policy or not settings.optimizer_foreach else actor["optimizer_step"]
    training = (
        (0 if policy else _state_bytes(actor))
        + max(backward, step)  # the pass's peak, or AdamW's step after it
        + resident(critic)
        + ref_resident
        + (0 if sleeps else reserved)
    )
    log_prob = (
        resident(actor)
        + (actor["params"] if settings.param_offload and not policy else 0)
        + actor["unsharded_layers"]
        + copied_in
        + acts["log_prob_activations"]
        + acts["log_prob_logits"]
        + resident(critic)
        + ref_resident
        + (0 if sleeps else reserved)
    )
    phases = {"generation": generation, "training": training, "log_prob": log_prob}
    host = _host_bytes(actor, critic, ref_params if ref_offloaded else 0, settings, cluster)
    peak_phase = max(phases, key=phases.get)
    peak = phases[peak_phase]
    headroom = gpu - peak
    min_headroom = int(settings.min_headroom_gib * GIB)
    gpu_fits = headroom >= min_headroom and (kv_cache > 0 or host_rollout)
    # what the GPU holds beside the engine while the engine is awake (a sleeping engine wakes for generation only)
    awake_phases = ("generation",) if sleeps else tuple(phases)
    beside_engine = max(phases[name] - reserved for name in awake_phases)
    share = utilization_bounds(
        gpu=gpu,
        min_headroom=min_headroom,
        beside_engine=beside_engine,
        engine_floor=generation_weight_bytes + settings.sequence_length * per_token,
        configured=settings.gpu_memory_utilization,
        host_rollout=host_rollout,
    )
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
            "log_prob_ref_logits": acts["log_prob_ref_logits"],
            "gradient_checkpointing": settings.gradient_checkpointing,
            "formula": acts["formula"],
        },
        "rollout": {
            "engine": settings.rollout_engine,
            "reserved": reserved,
            "weights": generation_weight_bytes,
            "kv_cache": kv_cache,
            "kv_bytes_per_token": per_token,
            "kv_cache_tokens": kv_tokens,
            "sequences_in_cache": kv_tokens // settings.sequence_length,
            "sleeps_during_training": sleeps,
            "gpu_memory_utilization": share,
        },
        "phases": phases,
        "training_parts": {"pass": backward, "optimizer_step": actor["optimizer_step"]},
        "peak_phase": peak_phase,
        "peak_bytes": peak,
        "headroom_bytes": headroom,
        "min_headroom_bytes": min_headroom,
        "host": host,
        "gpu_fits": gpu_fits,
        "fits": gpu_fits and host["fits"] is not False,
    }


def _state_bytes(state: dict[str, int]) -> int:
    """A trained model's whole state: params, grads, master weights and optimizer states."""
    return state["params"] + state["grads"] + state["master_weights"] + state["optimizer"]


HOST_HEADROOM_GIB = 16.0
"""CPU memory per machine kept beside the offloaded states: Ray, the Python workers, vLLM's process and the pinned
staging buffers (an allowance, not measured)."""


def _host_bytes(actor: dict, critic: dict | None, ref_params: int, settings: PlanSettings,
                cluster: ClusterSpec) -> dict:
    """What offload puts in one machine's CPU memory: per GPU, the actor's (and critic's) offloaded states and the
    offloaded ref, times the GPUs of a machine; whether it fits ``cluster.host_memory_gib`` (None: not known)."""

    def offloaded(state: dict | None) -> int:
        if state is None:
            return 0
        if settings.policy_offload:
            return _state_bytes(state)
        return ((state["params"] if settings.param_offload else 0)
                + (state["optimizer"] + state["master_weights"] if settings.optimizer_offload else 0))

    per_gpu = offloaded(actor) + offloaded(critic) + ref_params
    per_node = per_gpu * cluster.gpus_per_node
    fits = None
    if cluster.host_memory_gib is not None:
        fits = per_node + HOST_HEADROOM_GIB * GIB <= cluster.host_memory_gib * GIB
    return {"per_gpu": per_gpu, "per_node": per_node, "headroom_gib": HOST_HEADROOM_GIB,
            "memory_gib": cluster.host_memory_gib, "fits": fits}


def utilization_bounds(*, gpu: int, min_headroom: int, beside_engine: int, engine_floor: int, configured: float,
                       host_rollout: bool) -> dict:
    """The rollout engine's share of the GPU (``gpu_memory_utilization``) that works: at most what the GPU has left
    beside what the training side holds while the engine is awake (sleeping engine: the resident states during
    generation, when it wakes and re-takes its share; awake engine: the larger training or log-prob pass) and the
    headroom; at least its generation weights and one sequence's KV cache. vLLM refuses to start (or to wake) when
    the free memory is below its share: the wake-up OOM of colocated runs."""
    if host_rollout:
        return {"configured": configured, "max": None, "min": None, "ok": True,
                "why": "HF transformers: the whole model in fp32 on the replica's first GPU, no reservation"}
    most = math.floor((gpu - min_headroom - beside_engine) / gpu * 100) / 100
    least = math.ceil(engine_floor / gpu * 100) / 100
    return {
        "configured": configured,
        "max": most,
        "min": least,
        "ok": least <= configured <= most,
        "beside_engine_bytes": beside_engine,
        "why": f"(GPU {gpu / GIB:.1f} GiB - headroom {min_headroom / GIB:.1f} - training side while the engine is "
        f"awake {beside_engine / GIB:.1f}) / GPU = {most:.2f} at most; (generation weights + one sequence's KV "
        f"{engine_floor / GIB:.2f} GiB) / GPU = {least:.2f} at least",
    }
