"""Simulation: every rank in one process, the collectives replaced by copies (for 32-rank layouts in a test).

``simulate`` runs a scheme with the executor's exchange plan (``exchange``), packing, unpacking and outputs
(``packing``); the all-gathers and all-to-alls become copies between the ranks' buffers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hybrid_engine.reshard.exchange import Scheme, make_buckets
from hybrid_engine.reshard.packing import allocate_outputs, pack_cells, unpack_cells
from hybrid_engine.reshard.shards import LocalShards

__all__ = ["SimulationResult", "simulate"]


@dataclass
class SimulationResult:
    outputs: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    """rank -> HF name -> generation tensor."""
    received: dict[int, dict[str, int]] = field(default_factory=dict)
    """rank -> HF name -> elements received."""
    by_phase: dict[int, dict[str, int]] = field(default_factory=dict)
    """rank -> phase -> elements received."""


def simulate(scheme: Scheme, shards: dict[int, LocalShards], bucket_bytes: int | None = None) -> SimulationResult:
    """Run ``scheme`` for all ranks in this process with the executor's plan, packing and unpacking; the all-gathers
    and all-to-alls become copies between the ranks' buffers."""
    ranks = sorted(shards)
    if ranks != list(range(scheme.world)):
        raise ValueError(f"simulate needs the shards of every rank 0..{scheme.world - 1}")
    dtype = shards[0].dtype
    result = SimulationResult(
        outputs={r: {} for r in ranks}, received={r: {} for r in ranks}, by_phase={r: {} for r in ranks}
    )
    element_size = torch.empty((), dtype=dtype).element_size()
    for bucket in make_buckets(scheme.spec, bucket_bytes, element_size, scheme.pipeline_stages):
        previous = dict(shards)
        for step_index, step in enumerate(scheme.steps):
            sources = shards if step.source == "shards" else previous
            outputs = {r: allocate_outputs(scheme, step_index, r, bucket, sources[r], dtype, "cpu")[0] for r in ranks}
            done: set[tuple] = set()
            for r in ranks:
                exchange = scheme.exchange(step_index, r, bucket)
                if exchange.group in done:
                    continue
                done.add(exchange.group)
                for gather in exchange.gathers:
                    flats = []
                    for member, cells in zip(gather.members, gather.cells, strict=True):
                        flat = torch.empty(sum(c.numel for c in cells), dtype=dtype)
                        pack_cells(flat, cells, sources[member])
                        flats.append(flat)
                    for me in gather.members:
                        for flat, cells in zip(flats, gather.cells, strict=True):
                            _count(result, me, step.phase, unpack_cells(flat, cells, outputs[me], me))
                for cell in exchange.p2p:
                    flat = torch.empty(cell.numel, dtype=dtype)
                    pack_cells(flat, [cell], sources[cell.owner])
                    for me in cell.receivers:
                        _count(result, me, step.phase, unpack_cells(flat, [cell], outputs[me], me))
            for r in ranks:
                if step.final:
                    result.outputs[r].update(outputs[r].storage)
            previous = outputs
    return result


def _count(result: SimulationResult, rank: int, phase: str, received: dict[str, int]) -> None:
    for name, n in received.items():
        result.received[rank][name] = result.received[rank].get(name, 0) + n
        result.by_phase[rank][phase] = result.by_phase[rank].get(phase, 0) + n
