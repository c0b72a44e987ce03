"""Instrumentation of a resharding run, under the planner's names, and the planner's numbers to set beside it.

Bytes are counted at the collectives: ``received_bytes`` is the payload a rank takes from others, cell by cell (its
own shard never counts, nor padding), which the planner predicts exactly; ``wire_bytes`` adds what padding to equal
all-gather slots costs. Memory: ``peak_extra_bytes`` is the peak of the live buffers the executor allocated itself
(receive buffers, send buffers, generation tensors it had to build rather than view); on CUDA ``peak_cuda_bytes`` is
``torch.cuda.max_memory_allocated`` above its value at the start.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hybrid_engine.groups import HybridGroups
from hybrid_engine.model_spec import ModelSpec
from hybrid_engine.plan.bytes import compute_bytes, received_by_tensor
from hybrid_engine.plan.settings import ClusterSpec

__all__ = ["MemoryTracker", "PhaseStats", "PlannedBytes", "ReshardStats", "planned_bytes"]


@dataclass
class PhaseStats:
    """One phase of a scheme (the planner's phase name) on one rank."""

    name: str
    received_bytes: int = 0
    """Payload received from other ranks (planner's count)."""
    wire_bytes: int = 0
    """Bytes the collectives delivered to this rank from others, padding included."""
    pack_s: float = 0.0
    """Copying cells out of the sources into send buffers."""
    comm_s: float = 0.0
    """Inside collectives."""
    unpack_s: float = 0.0
    """Copying received cells into the generation tensors."""
    assemble_s: float = 0.0
    """Allocating generation tensors and copying the rank's own part in."""
    all_gathers: int = 0
    in_place_gathers: int = 0
    """All-gathers that wrote straight into the generation tensor (no buffer)."""
    broadcasts: int = 0
    p2p_rounds: int = 0
    """Rounds of point-to-point sends (one batch of isend/irecv per bucket and step)."""
    p2p_messages: int = 0
    """isend + irecv operations this rank posted."""

    @property
    def seconds(self) -> float:
        return self.pack_s + self.comm_s + self.unpack_s + self.assemble_s

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "received_bytes": self.received_bytes,
            "wire_bytes": self.wire_bytes,
            "seconds": self.seconds,
            "pack_s": self.pack_s,
            "comm_s": self.comm_s,
            "unpack_s": self.unpack_s,
            "assemble_s": self.assemble_s,
            "collectives": {
                "all_gather": self.all_gathers,
                "in_place": self.in_place_gathers,
                "broadcast": self.broadcasts,
                "p2p_rounds": self.p2p_rounds,
                "p2p_messages": self.p2p_messages,
            },
        }


@dataclass
class ReshardStats:
    """One rank's measurements of one resharding run (one pass over the weights)."""

    scheme: str
    rank: int
    received_bytes: int = 0
    wire_bytes: int = 0
    by_tensor: dict[str, int] = field(default_factory=dict)
    """Bytes received per HF tensor (tensors that received nothing are absent)."""
    phases: dict[str, PhaseStats] = field(default_factory=dict)
    seconds: float = 0.0
    """Wall time spent inside the executor (time the consumer spends between yields is not counted)."""
    plan_s: float = 0.0
    """Part of ``seconds`` spent computing the exchange plan (cached after the first run)."""
    peak_extra_bytes: int = 0
    peak_cuda_bytes: int | None = None
    generation_bytes: int = 0
    """Bytes of the generation tensors yielded (the rank's generation shard)."""
    buckets: int = 0
    tensors: int = 0
    planned: PlannedBytes | None = None
    """The planner's bytes for this rank, where the caller asked for them beside the measurement."""

    def phase(self, name: str) -> PhaseStats:
        if name not in self.phases:
            self.phases[name] = PhaseStats(name=name)
        return self.phases[name]

    def add_received(self, phase: str, by_tensor: dict[str, int], element_size: int) -> None:
        stats = self.phase(phase)
        for name, elements in by_tensor.items():
            nbytes = elements * element_size
            self.by_tensor[name] = self.by_tensor.get(name, 0) + nbytes
            stats.received_bytes += nbytes
            self.received_bytes += nbytes

    def add_wire(self, phase: str, nbytes: int) -> None:
        self.phase(phase).wire_bytes += nbytes
        self.wire_bytes += nbytes

    def to_dict(self) -> dict:
        return {
            "scheme": self.scheme,
            "rank": self.rank,
            "received_bytes": self.received_bytes,
            "wire_bytes": self.wire_bytes,
            "seconds": self.seconds,
            "plan_s": self.plan_s,
            "peak_extra_bytes": self.peak_extra_bytes,
            "peak_cuda_bytes": self.peak_cuda_bytes,
            "generation_bytes": self.generation_bytes,
            "buckets": self.buckets,
            "tensors": self.tensors,
            "phases": [phase.to_dict() for phase in self.phases.values()],
        }


class MemoryTracker:
    """Live bytes of the buffers the executor allocates, and their peak; CUDA's allocator peak on a GPU."""

    def __init__(self, device: torch.device):
        self.live = 0
        self.peak = 0
        self.cuda = device.type == "cuda"
        self._cuda_base = 0
        if self.cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            self._cuda_base = torch.cuda.memory_allocated(device)
        self.device = device

    def alloc(self, nbytes: int) -> None:
        self.live += nbytes
        self.peak = max(self.peak, self.live)

    def free(self, nbytes: int) -> None:
        self.live -= nbytes

    def cuda_peak(self) -> int | None:
        if not self.cuda:
            return None
        return torch.cuda.max_memory_allocated(self.device) - self._cuda_base


@dataclass(frozen=True)
class PlannedBytes:
    """The planner's prediction for one rank of one scheme."""

    scheme: str
    received: int
    """Bytes this rank receives."""
    by_tensor: dict[str, int]
    """Per HF tensor (unique names; zero entries included)."""
    phase_max: dict[str, int]
    """Per phase: the largest bytes any rank receives (``PhaseBytes.max_bytes``)."""
    received_all: tuple[int, ...]
    """Bytes every rank receives (index = rank)."""
    model_bytes: int
    peak_param_bytes: int


def planned_bytes(
    spec: ModelSpec,
    groups: HybridGroups,
    scheme: str,
    rank: int,
    dtype_size: int,
    feeders: tuple[int, ...] | None = None,
) -> PlannedBytes:
    """What ``hybrid_engine.plan.bytes`` says ``rank`` receives under ``scheme``. ``gather_to_feeders`` (not a planner
    scheme) is, on the feeder ranks, full_gather's count from FSDP shards and tp_group_gather's from Megatron-style
    shards (both: the full model minus the rank's own shard), and 0 elsewhere."""
    cluster = ClusterSpec(nnodes=1, gpus_per_node=groups.world_size)
    planner_scheme = scheme
    if scheme == "gather_to_feeders":
        planner_scheme = "full_gather" if groups.fsdp else "tp_group_gather"
    planned = compute_bytes(spec, groups, cluster, dtype_size, [planner_scheme])[planner_scheme]
    received_all = [int(x) for x in planned.received]
    by_tensor = received_by_tensor(spec, groups, rank, planner_scheme, dtype_size)
    phase_max = {phase.name: phase.max_bytes for phase in planned.phases}
    if scheme == "gather_to_feeders":
        feeders = tuple(feeders or ())
        received_all = [value if r in feeders else 0 for r, value in enumerate(received_all)]
        if rank not in feeders:
            by_tensor = dict.fromkeys(by_tensor, 0)
        phase_max = {"gather to rollout feeders": max(received_all)}
    return PlannedBytes(
        scheme=scheme,
        received=received_all[rank],
        by_tensor=by_tensor,
        phase_max=phase_max,
        received_all=tuple(received_all),
        model_bytes=planned.model_bytes,
        peak_param_bytes=planned.peak_param_bytes,
    )
