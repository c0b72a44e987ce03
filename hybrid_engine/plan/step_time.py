"""An estimate of one RL step's time for a layout: generation, log-prob passes, update and weight sync.

The layout search (``plan/solve.py``) ranks layouts by this number; it is a roofline estimate, not a measurement:
good for telling layouts apart, not for predicting a wall clock to the second. Per part, in seconds:

- generation: prefill of ``B = train_batch_size * rollout.n`` prompts (compute-bound: ``2 * N_active`` FLOPs per
  token over all GPUs), then ``max_response_length`` decode steps per wave of sequences. A wave is what one engine's
  KV cache holds (``kv_cache_tokens / (prompt + response)``, at most the engine's share of B and
  ``rollout.max_num_seqs``). One decode step costs
  the larger of reading the engine's weight shard and KV cache from HBM and its FLOPs, plus the TP all-reduces of
  the step (2 per layer, each paying a link latency). Responses are taken at full length (an upper estimate).
- log-prob: the old policy's log-probs, the reference's (when there is one) and the critic's values (when there is
  one): forward passes over ``B * (prompt + response)`` tokens.
- update: forward + backward (``6 * N_active`` FLOPs per token, ``8`` with gradient checkpointing) of the actor and
  the critic, times ``ppo_epochs``.
- weight sync: the resharding bytes of the scheme that runs over the link its groups span (``plan/bytes.py``).

Compute parts run at ``MFU`` of the GPU's dense bf16 peak, divided by the micro-batches' pipeline bubble
``1 + (pp - 1) / micro_batches`` (1F1B), plus per micro-batch a fixed launch cost; communication that the engines do
not overlap with compute is added: Megatron's TP all-reduces (or Ulysses all-to-alls, under FSDP), context-parallel
KV gathers, MoE all-to-alls, the data-parallel gradient reduce-scatter and parameter all-gather once per mini-batch;
FSDP's per-micro-batch parameter all-gathers and gradient reduce-scatters overlap compute (prefetch), so only the
larger of the two counts. Offloaded states cross PCIe once per phase that needs them. A collective over ``n`` ranks
moves ``(n - 1) / n`` of its buffer per GPU (ring) at the bandwidth of the slowest link its group spans: NVLink
inside a node, the network across nodes (``ClusterSpec.nvlink_GBps`` / ``network_GBps``).

GPU figures (dense bf16 TFLOPS, HBM GB/s) are the vendors' datasheet numbers (NVIDIA H100/H800/H200 SXM, A100 SXM
80GB), looked up by the cluster's GPU name; an unknown name takes the H100's and says so (``GpuFigures.assumed``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hybrid_engine.layout import InferLayout, TrainLayout
from hybrid_engine.model_spec import ModelSpec
from hybrid_engine.plan.settings import ClusterSpec, PlanSettings

__all__ = ["GpuFigures", "StepTime", "Workload", "active_params", "gpu_figures", "group_spans_nodes", "step_time"]

MFU = 0.4
"""fraction of the dense peak a well-sized training or log-prob micro-batch reaches"""
PREFILL_MFU = 0.5
DECODE_HBM_EFFICIENCY = 0.7
"""fraction of the HBM bandwidth a decode step's weight and KV reads reach"""
MICRO_BATCH_LAUNCH_S = 1.5e-4
"""fixed cost per decoder layer per micro-batch forward (kernel launches, synchronisation); backward: 2x"""
LINK_LATENCY_S = {"nvlink": 8e-6, "network": 25e-6}
"""latency of one small collective (decode all-reduces are latency-bound)"""
PCIE_GBPS = 25.0
"""host <-> GPU copies of offloaded states, GB/s per GPU (PCIe Gen5 x16 with pinned memory, shared by the node)"""
HOST_ADAM_BYTES_PER_ELEM = 28
"""bytes AdamW moves through host memory per fp32 element when it steps on the CPU (CPUOffloadPolicy): reads param,
grad, m, v; writes param, m, v"""
HOST_ADAM_GBPS = 20.0
"""host memory bandwidth one GPU's CPU step gets (an assumption, not measured)"""

_DATASHEETS = {  # name fragment: (dense bf16 TFLOPS, HBM GB/s)
    "h200": (989.0, 4800.0),
    "h100": (989.0, 3350.0),
    "h800": (989.0, 3350.0),
    "a100": (312.0, 2039.0),
}


@dataclass(frozen=True, slots=True)
class GpuFigures:
    tflops: float
    """dense bf16 peak, 10**12 FLOP/s"""
    hbm_GBps: float
    """HBM bandwidth, GB/s"""
    assumed: bool = False
    """True when the GPU's name is not in the table and the H100's figures stand in"""


def gpu_figures(name: str) -> GpuFigures:
    lowered = str(name).lower()
    for fragment, (tflops, hbm) in _DATASHEETS.items():
        if fragment in lowered:
            return GpuFigures(tflops, hbm)
    return GpuFigures(*_DATASHEETS["h100"], assumed=True)


@dataclass(frozen=True, kw_only=True, slots=True)
class Workload:
    """What one step processes, besides the PlanSettings' lengths and budgets."""

    train_batch_size: int
    """prompts per step [data.train_batch_size]"""
    ppo_mini_batch_size: int
    """prompts per optimizer step [actor.ppo_mini_batch_size]"""
    ppo_epochs: int = 1
    """passes over the batch per step [actor.ppo_epochs]"""
    max_num_seqs: int = 256
    """sequences one generation engine decodes at once, at most [rollout.max_num_seqs; verl 0.9.1's default]"""


@dataclass(frozen=True, slots=True)
class StepTime:
    generation: float
    log_prob: float
    update: float
    weight_sync: float

    @property
    def total(self) -> float:
        return self.generation + self.log_prob + self.update + self.weight_sync

    def parts(self) -> dict[str, float]:
        return {"generation": self.generation, "log_prob": self.log_prob, "update": self.update,
                "weight_sync": self.weight_sync}


def active_params(spec: ModelSpec) -> int:
    """Parameters one token passes through: all dense ones, ``num_experts_per_tok / num_experts`` of the experts."""
    arch = spec.arch
    total = spec.numel
    if not arch.is_moe:
        return total
    experts = sum(t.numel for t in spec.tensors if t.ep_dim is not None and t.tied_to is None)
    return total - experts + experts * arch.num_experts_per_tok // arch.num_experts


def group_spans_nodes(stride: int, size: int, gpus_per_node: int) -> bool:
    """Whether a group of ``size`` ranks ``stride`` apart (rank order) has members on two nodes."""
    if size <= 1:
        return False
    extent = stride * size
    if extent <= gpus_per_node:
        return gpus_per_node % extent != 0  # a group that does not tile the node straddles a boundary somewhere
    return True


def _link(cluster: ClusterSpec, spans: bool) -> tuple[float, str]:
    return (cluster.network_GBps if spans else cluster.nvlink_GBps) * 1e9, "network" if spans else "nvlink"


def _ring_s(buffer_bytes: float, ranks: int, bandwidth: float) -> float:
    return 0.0 if ranks <= 1 else buffer_bytes * (ranks - 1) / ranks / bandwidth


def _strides(train: TrainLayout) -> dict[str, int]:
    """Rank distance between neighbours of each axis in the training rank order (fastest axis first)."""
    sizes = {"tp": train.tp, "cp": train.cp, "dp": train.dp, "pp": train.pp}
    strides, stride = {}, 1
    for axis in train.axes:
        strides[axis] = stride
        stride *= sizes[axis]
    return strides


def _attention_flops_per_token(spec: ModelSpec, context: float) -> float:
    """QK^T and AV of one token against ``context`` earlier tokens, all layers (forward)."""
    arch = spec.arch
    return 4.0 * arch.num_hidden_layers * arch.num_attention_heads * arch.head_dim * context


def _generation_s(spec, infer: InferLayout, cluster: ClusterSpec, settings: PlanSettings, gpu: GpuFigures,
                  sequences: int, weight_bytes: int, kv_bytes_per_token: int, kv_tokens: int, max_num_seqs: int
                  ) -> float:
    arch, prompt, response = spec.arch, settings.max_prompt_length, settings.max_response_length
    n_active = active_params(spec)
    flops = gpu.tflops * 1e12
    prefill = sequences * prompt * (2 * n_active + _attention_flops_per_token(spec, prompt / 2))
    prefill_s = prefill / (cluster.world_size * flops * PREFILL_MFU)
    engines = max(infer.dp, 1)
    per_engine = math.ceil(sequences / engines)
    wave = max(1, min(per_engine, max_num_seqs, kv_tokens // max(prompt + response, 1)))
    waves = math.ceil(per_engine / wave)
    engine_gpus = infer.tp * infer.pp
    context = prompt + response / 2
    read = weight_bytes + wave * context * kv_bytes_per_token
    memory_s = read / (gpu.hbm_GBps * 1e9 * DECODE_HBM_EFFICIENCY)
    compute_s = wave * (2 * n_active + _attention_flops_per_token(spec, context)) / (engine_gpus * flops * MFU)
    comm_s = 0.0
    if infer.tp > 1:
        spans = infer.tp > cluster.gpus_per_node
        bandwidth, link = _link(cluster, spans)
        per_allreduce = 2 * _ring_s(wave * arch.hidden_size * 2, infer.tp, bandwidth) + LINK_LATENCY_S[link]
        comm_s = 2 * arch.num_hidden_layers / infer.pp * per_allreduce
    return prefill_s + waves * response * (max(memory_s, compute_s) + comm_s)


def _pass_s(spec, train: TrainLayout, cluster: ClusterSpec, settings: PlanSettings, gpu: GpuFigures,
            tokens: int, micro_tokens: int, fsdp: bool, backward: bool, param_bytes: int) -> float:
    """One pass (forward, or forward + backward) of one model over ``tokens`` tokens of the step; ``param_bytes``:
    the GPU's parameter shard in the compute dtype (FSDP gathers the whole model from them)."""
    arch = spec.arch
    seq = settings.sequence_length
    n_active = active_params(spec)
    per_token = 2 * n_active + _attention_flops_per_token(spec, seq / 2)
    factor = (4 if settings.gradient_checkpointing else 3) if backward else 1
    compute_s = tokens * per_token * factor / (cluster.world_size * gpu.tflops * 1e12 * MFU)
    replica_tokens = tokens / (train.dp * train.cp)  # tokens one model replica (its tp * pp * cp ranks) handles
    micro = max(1, math.ceil(replica_tokens / max(micro_tokens * train.cp, 1)))
    compute_s *= 1 + (train.pp - 1) / micro
    launch_s = micro * arch.num_hidden_layers / train.pp * MICRO_BATCH_LAUNCH_S * (3 if backward else 1)
    strides = _strides(train)
    directions = 2 if backward else 1
    comm_s = 0.0
    layers = arch.num_hidden_layers / train.pp
    if train.tp > 1:  # Megatron sequence parallel: all-gather + reduce-scatter around attention and MLP
        bandwidth, _ = _link(cluster, group_spans_nodes(strides["tp"], train.tp, cluster.gpus_per_node))
        comm_s += directions * 2 * layers * _ring_s(2 * replica_tokens * arch.hidden_size * 2, train.tp, bandwidth)
    if train.cp > 1:
        bandwidth, _ = _link(cluster, group_spans_nodes(strides["cp"], train.cp, cluster.gpus_per_node))
        if fsdp:  # Ulysses: 4 all-to-alls of the activations per layer
            buffer = 4 * replica_tokens / train.cp * arch.hidden_size * 2
        else:  # Megatron CP: all-gather of K and V per layer
            kv_width = (arch.kv_lora_rank + arch.qk_rope_head_dim) if arch.is_mla else \
                2 * arch.num_key_value_heads * arch.head_dim
            buffer = replica_tokens * kv_width * 2 / max(train.tp, 1)
        comm_s += directions * layers * _ring_s(buffer, train.cp, bandwidth)
    if arch.is_moe and train.ep > 1:  # dispatch and combine all-to-alls of every MoE layer
        stride = strides["tp"] * train.tp if not fsdp else 1
        bandwidth, _ = _link(cluster, group_spans_nodes(stride, train.ep, cluster.gpus_per_node))
        gpu_tokens = replica_tokens / max(train.tp, 1)
        moe_layers = len(arch.moe_layers) / train.pp
        comm_s += directions * 2 * moe_layers * _ring_s(
            gpu_tokens * arch.num_experts_per_tok * arch.hidden_size * 2, train.ep, bandwidth)
    if fsdp:  # per micro-batch: all-gather the bf16 parameters (forward, again in backward), reduce-scatter the
        # gradients in fp32 (twice the bytes)
        bandwidth, _ = _link(cluster, cluster.world_size > cluster.gpus_per_node)
        full_bytes = param_bytes * cluster.world_size
        gathers = (2 if backward else 1) * micro * _ring_s(full_bytes, cluster.world_size, bandwidth)
        scatters = micro * _ring_s(2 * full_bytes, cluster.world_size, bandwidth) if backward else 0.0
        return max(compute_s, gathers + scatters) + launch_s + comm_s
    return compute_s + launch_s + comm_s


def _dp_sync_s(train: TrainLayout, cluster: ClusterSpec, param_elems: int) -> float:
    """Megatron's distributed optimizer, per mini-batch: reduce-scatter fp32 grads, all-gather bf16 params."""
    ranks = train.dp * train.cp
    strides = _strides(train)
    stride = min(strides["dp"], strides["cp"]) if train.cp > 1 else strides["dp"]
    bandwidth, _ = _link(cluster, group_spans_nodes(stride, ranks, cluster.gpus_per_node))
    return _ring_s(param_elems * 6, ranks, bandwidth)


def step_time(spec: ModelSpec, train: TrainLayout, infer: InferLayout, cluster: ClusterSpec, settings: PlanSettings,
              workload: Workload, memory: dict, sync_s: float, gpu: GpuFigures | None = None) -> StepTime:
    """The step's time parts for a planned layout. ``memory``: ``estimate_memory``'s breakdown of this layout and
    settings (its rollout KV capacity and per-GPU states); ``sync_s``: the weight-sync time of the scheme that runs."""
    gpu = gpu or gpu_figures(cluster.gpu)
    fsdp = settings.is_fsdp
    sequences = workload.train_batch_size * settings.rollout_n
    tokens = sequences * settings.sequence_length
    rollout = memory["rollout"]
    generation = _generation_s(spec, infer, cluster, settings, gpu, sequences, rollout["weights"],
                               rollout["kv_bytes_per_token"], rollout["kv_cache_tokens"], workload.max_num_seqs)
    actor = memory["actor"]
    param_bytes = actor["params"] // 2 if fsdp else actor["params"]  # FSDP holds fp32: the bf16 gather is half
    acts = memory["activations"]
    forwards = 1 + int(settings.has_ref) + int(settings.has_critic)
    log_prob = forwards * _pass_s(spec, train, cluster, settings, gpu, tokens, acts["log_prob_tokens"], fsdp, False,
                                  param_bytes)
    models = 1 + int(settings.has_critic)
    per_update = _pass_s(spec, train, cluster, settings, gpu, tokens, acts["tokens_per_micro_batch"], fsdp, True,
                         param_bytes)
    mini_batches = max(1, workload.train_batch_size // workload.ppo_mini_batch_size)
    if not fsdp:
        per_update += mini_batches * _dp_sync_s(train, cluster, actor["params"] // 2)
    update = models * workload.ppo_epochs * per_update
    pcie = PCIE_GBPS * 1e9
    if settings.policy_offload:  # every micro-batch copies the fp32 shards in (twice in the update: forward and
        # backward) and the grads out; AdamW steps on the CPU once a mini-batch
        world_tokens = tokens // max(train.dp * train.cp, 1)
        log_prob += forwards * -(-world_tokens // max(acts["log_prob_tokens"], 1)) * actor["params"] / pcie
        update_micro = workload.ppo_epochs * -(-world_tokens // max(acts["tokens_per_micro_batch"], 1))
        update += models * update_micro * (2 * actor["params"] + actor["grads"]) / pcie
        update += models * workload.ppo_epochs * mini_batches * HOST_ADAM_BYTES_PER_ELEM * (actor["params"] // 4) / (
            HOST_ADAM_GBPS * 1e9)
        return StepTime(generation=generation, log_prob=log_prob, update=update, weight_sync=sync_s)
    if settings.param_offload:  # onto the GPU for the log-prob passes and the update, grads back
        log_prob += forwards * actor["params"] / pcie
        update += models * (actor["params"] + actor["grads"]) * 2 / pcie
    if settings.optimizer_offload:  # optimizer states (and master weights) onto the GPU and back for the update
        update += models * 2 * (actor["optimizer"] + actor["master_weights"]) / pcie
    return StepTime(generation=generation, log_prob=log_prob, update=update, weight_sync=sync_s)
