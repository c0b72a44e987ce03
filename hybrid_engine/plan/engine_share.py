"""The rollout engine's memory share and CUDA-graph sizes, sized to one step's batch instead of a fixed fraction.

verl's examples give vLLM 0.5-0.6 of every GPU (``gpu_memory_utilization``): its weights and a KV cache that, for a
1.5B model on an 80 GB card, holds ~1,650 sequences of 1,024 tokens while a step of 32 prompts x 5 samples needs 160.
vLLM re-allocates that whole cache each time it wakes from sleep mode (verl's weight sync), and captures a CUDA
graph for every decode batch size up to ``max_num_seqs``. A plan knows the batch, so both can fit the run:

    share  = (generation weights + (1 + KV_MARGIN) * sequences * sequence_length * KV bytes per token
              + ENGINE_WORKING_GIB) / GPU memory, rounded up to 0.01, at most MAX_SHARE (0.6)
    graphs = 1, 2, 4, then every 8 up to the sequences one generation replica runs at once

``sequences`` is one step's rollout batch per generation replica (prompts x samples / generation replicas), every
sequence at its longest (prompt + response). ``ENGINE_WORKING_GIB`` is vLLM's memory beside weights and KV cache:
its profiled forward pass of ``max_num_batched_tokens`` (8,192 in verl), the sampler's logits, the captured graphs,
NCCL and cuBLAS workspaces.
"""

from __future__ import annotations

import math

from hybrid_engine.plan.settings import GIB

__all__ = ["ENGINE_WORKING_GIB", "KV_MARGIN", "MAX_SHARE", "engine_share", "graph_sizes"]

ENGINE_WORKING_GIB = 4.0
KV_MARGIN = 0.2
MAX_SHARE = 0.6
"""Never more than verl's examples give the engine: a batch larger than that cache waits in vLLM's queue."""


def engine_share(*, weight_bytes: int, kv_bytes_per_token: int, sequences: int, sequence_length: int,
                 gpu_bytes: int) -> float:
    """The fraction of one GPU the engine needs for one step's sequences (see the module's formula), at most
    ``MAX_SHARE``."""
    kv = (1 + KV_MARGIN) * max(1, sequences) * sequence_length * kv_bytes_per_token
    need = weight_bytes + kv + ENGINE_WORKING_GIB * GIB
    return min(MAX_SHARE, math.ceil(need / gpu_bytes * 100) / 100)


def graph_sizes(sequences: int) -> list[int]:
    """Decode batch sizes to capture: 1, 2, 4 and every multiple of 8 up to ``sequences`` rounded up to 8."""
    top = max(8, -(-int(sequences) // 8) * 8)
    return [1, 2, 4, *range(8, top + 1, 8)]
