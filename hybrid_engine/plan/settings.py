"""Inputs of the plan besides the layouts: the cluster (``ClusterSpec``) and the run's settings (``PlanSettings``).

The recipes fill both from the Hydra config (recipes/check/plan.py); every field has a default so tests and scripts can
build them small.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DTYPE_BYTES", "FSDP_FAMILY", "STRATEGIES", "ClusterSpec", "PlanSettings", "dtype_bytes"]

STRATEGIES = ("fsdp", "fsdp2", "megatron", "veomni")
# engines that shard every parameter over the data-parallel ranks (VeOmni is FSDP2 with Ulysses and expert parallel)
FSDP_FAMILY = ("fsdp", "fsdp2", "veomni")
DTYPE_BYTES = {"bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "float32": 4, "fp32": 4, "float8": 1, "fp8": 1}

GIB = 1024**3


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[str(dtype).removeprefix("torch.")]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPE_BYTES)}") from None


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterSpec:
    """The GPUs a run gets. Bandwidths are per GPU and one direction (what one GPU can receive per second)."""

    nnodes: int = 1
    """Machines."""
    gpus_per_node: int = 8
    """GPUs per machine; ranks r and r' share a node when r // gpus_per_node == r' // gpus_per_node."""
    gpu: str = "H100-SXM-80GB"
    """GPU name, for the report."""
    memory_gib: float = 80.0
    """Memory of one GPU in GiB."""
    nvlink_GBps: float = 450.0
    """NVLink bandwidth inside a node, GB/s per GPU per direction (H100 SXM: 900 GB/s both ways)."""
    network_GBps: float = 50.0
    """Network bandwidth across nodes, GB/s per GPU per direction (one 400 Gb/s NIC per GPU)."""
    host_memory_gib: float | None = None
    """CPU memory of one machine in GiB, where offloaded states live; None = not known (not checked)."""

    @property
    def world_size(self) -> int:
        return self.nnodes * self.gpus_per_node

    @property
    def world_desc(self) -> str:
        """The parenthesis of layout errors: ``cluster.nnodes 2 * cluster.gpus_per_node 8``."""
        return f"cluster.nnodes {self.nnodes} * cluster.gpus_per_node {self.gpus_per_node}"

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    def to_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanSettings:
    """Everything the plan needs from a run's config besides layouts and cluster (verl key names in brackets)."""

    strategy: str = "fsdp2"
    """Training engine: fsdp, fsdp2, megatron or veomni [actor_rollout_ref.actor.strategy]."""
    param_offload: bool = False
    """Actor (and ref, critic) parameters and gradients live on CPU outside their compute [*.param_offload]."""
    optimizer_offload: bool = False
    """Optimizer states live on CPU outside the actor update [*.optimizer_offload]."""
    offload_policy: bool = False
    """FSDP2's CPUOffloadPolicy: the actor's (and critic's) fp32 params, grads and Adam states stay on the CPU, the
    optimizer steps there, the GPU holds only the layers being computed; verl then skips its own param and optimizer
    offload. fsdp2 only [actor.fsdp_config.offload_policy]."""
    optimizer_foreach: bool = True
    """torch AdamW's multi-tensor step, which takes one fp32 copy of the shard on the GPU as a temporary; False
    steps tensor by tensor [actor.optim.override_optimizer_config.foreach]."""
    dtype: str = "bfloat16"
    """Compute dtype of weights moved to the rollout engine and of activations."""
    max_prompt_length: int = 1024
    """Tokens [data.max_prompt_length]."""
    max_response_length: int = 1024
    """Tokens [data.max_response_length]."""
    ppo_max_token_len_per_gpu: int = 16384
    """Token budget of one actor micro-batch per GPU with dynamic batch size [actor.ppo_max_token_len_per_gpu]."""
    log_prob_max_token_len_per_gpu: int | None = None
    """Token budget of a log-prob micro-batch per GPU; None = ppo_max_token_len_per_gpu."""
    use_dynamic_bsz: bool = True
    """Micro-batches packed to the token budget instead of a fixed number of sequences [actor.use_dynamic_bsz]."""
    ppo_micro_batch_size_per_gpu: int = 1
    """Sequences per micro-batch when use_dynamic_bsz is False [actor.ppo_micro_batch_size_per_gpu]."""
    log_prob_micro_batch_size_per_gpu: int | None = None
    """Sequences per log-prob micro-batch when use_dynamic_bsz is False; None = ppo_micro_batch_size_per_gpu
    [rollout.log_prob_micro_batch_size_per_gpu, ref.log_prob_micro_batch_size_per_gpu: the larger]."""
    gradient_checkpointing: bool = True
    """Recompute each decoder layer in backward [model.enable_gradient_checkpointing]."""
    gpu_memory_utilization: float = 0.5
    """Fraction of each GPU's memory the rollout engine takes for its weights and KV cache [rollout.*]."""
    free_cache_engine: bool = True
    """The rollout engine frees its KV cache and weights (sleep mode) while the actor trains [rollout.*]."""
    has_critic: bool = False
    """A critic (same architecture as the actor) trains on the same GPUs (PPO with GAE; GRPO has none)."""
    has_ref: bool = True
    """A frozen reference policy for the KL term lives on the same GPUs."""
    rollout_n: int = 1
    """Responses per prompt [rollout.n]."""
    flash_attention: bool = True
    """Attention never materialises the seq x seq scores (flash-attn / sdpa); False adds 5*heads*seq per token."""
    min_headroom_gib: float = 2.0
    """Memory to keep free (CUDA context, NCCL buffers, fragmentation) for a plan to count as fitting."""
    rollout_engine: str = "vllm"
    """The rollout engine: vllm and sglang reserve gpu_memory_utilization of the GPU; hf holds nothing there
    [rollout.name]."""
    use_remove_padding: bool = True
    """Micro-batches packed without padding tokens; False pads each to its longest sequence
    [model.use_remove_padding]."""
    use_torch_compile: bool = True
    """verl compiles its entropy on the remove-padding path (fused: no (tokens, vocab) temporaries)
    [actor.use_torch_compile]."""
    log_prob_entropy: bool = True
    """The actor's log-prob pass computes the full-vocabulary entropy (verl's trainer asks for it); the ref's does
    not."""
    update_entropy: bool = False
    """The update computes the entropy too: an entropy bonus [actor.entropy_coeff != 0]."""
    mini_batch_sequences_per_gpu: int | None = None
    """Sequences one GPU trains on per optimizer step: ppo_mini_batch_size * rollout.n / dp; None = unknown. A dynamic
    update micro-batch never holds more."""
    rollout_sequences_per_gpu: int | None = None
    """Sequences one GPU scores per log-prob pass: train_batch_size * rollout.n / dp; None = unknown."""

    @property
    def policy_offload(self) -> bool:
        """CPUOffloadPolicy applies: verl's fsdp2 engine reads it, the other engines do not."""
        return self.offload_policy and self.strategy == "fsdp2"

    @property
    def offload(self) -> str:
        if self.policy_offload or (self.param_offload and self.optimizer_offload):
            return "full"  # offload/full.yaml turns all three on
        return "param" if self.param_offload else "optimizer" if self.optimizer_offload else "none"

    @property
    def sequence_length(self) -> int:
        return self.max_prompt_length + self.max_response_length

    @property
    def is_fsdp(self) -> bool:
        return self.strategy in FSDP_FAMILY

    def problems(self) -> list[str]:
        problems = []
        if self.strategy not in STRATEGIES:
            problems.append(f"strategy: unknown {self.strategy!r}; choose one of {list(STRATEGIES)}")
        if not 0 < self.gpu_memory_utilization <= 1:
            problems.append(f"rollout.gpu_memory_utilization: must be in (0, 1], got {self.gpu_memory_utilization}")
        try:
            dtype_bytes(self.dtype)
        except ValueError as error:
            problems.append(f"dtype: {error}")
        for key in ("max_prompt_length", "max_response_length", "ppo_max_token_len_per_gpu", "rollout_n"):
            if getattr(self, key) < 1:
                problems.append(f"{key}: must be positive, got {getattr(self, key)}")
        return problems

    def to_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}
