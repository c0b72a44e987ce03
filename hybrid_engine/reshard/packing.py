"""The local copies around the collectives, shared by the torch.distributed executor (``executor``) and the
single-process simulation (``simulation``): cells packed from a rank's sources into a flat buffer, cells unpacked from
a flat buffer into the generation outputs, and the outputs themselves (views of the rank's own storage where they can
be, else new tensors with the rank's own part copied in).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from hybrid_engine.reshard.exchange import Cell, Scheme
from hybrid_engine.reshard.shards import Box, LocalShards, Segment, box_shape, contains

__all__ = ["allocate_outputs", "pack_cells", "unpack_cells"]


def pack_cells(flat: torch.Tensor, cells: Sequence[Cell], sources: LocalShards) -> None:
    """Copy ``cells`` from ``sources`` one after the other into the 1-D ``flat``."""
    offset = 0
    for cell in cells:
        n = cell.numel
        flat.narrow(0, offset, n).view(box_shape(cell.box)).copy_(sources.extract(cell.name, cell.box))
        offset += n


def unpack_cells(flat: torch.Tensor, cells: Sequence[Cell], outputs: LocalShards, me: int) -> dict[str, int]:
    """Copy ``cells`` (laid out one after the other in ``flat``) into ``outputs`` where ``me`` receives them.
    Returns elements received per tensor."""
    offset, received = 0, {}
    for cell in cells:
        n = cell.numel
        if me in cell.receivers:
            outputs.extract(cell.name, cell.box).copy_(flat.narrow(0, offset, n).view(box_shape(cell.box)))
            received[cell.name] = received.get(cell.name, 0) + n
        offset += n
    return received


def allocate_outputs(
    scheme: Scheme,
    step: int,
    rank: int,
    names: Iterable[str],
    sources: LocalShards,
    dtype,
    device,
    programs: dict | None = None,
) -> tuple[LocalShards, int]:
    """The rank's output tensors of ``step`` for ``names``: a view of its own storage when the target lies in one of
    its segments (and the view is contiguous), else a new tensor with the rank's own part copied in.
    Returns the outputs and the bytes newly allocated.

    ``programs``: a dict the caller keeps between switches. The box arithmetic of a bucket (which segment, which
    narrows, which copies) depends only on the step, the rank, the names and the sources' segments; it is worked out
    once per such key and replayed after, leaving only the views, allocations and copies themselves."""
    names = tuple(names)
    if programs is None:
        return _run_program(_compile(scheme, step, rank, names, sources), rank, names, sources, dtype, device)
    key = (step, rank, names, tuple(tuple(sources.segments.get(name, ())) for name in names))
    program = programs.get(key)
    if program is None:
        program = programs[key] = _compile(scheme, step, rank, names, sources)
    return _run_program(program, rank, names, sources, dtype, device)


def _narrows(tensor_box: Box, box: Box) -> tuple[tuple[int, int, int], ...]:
    """``narrow_box`` as (dim, start, length) steps."""
    return tuple(
        (dim, lo - t_lo, hi - lo)
        for dim, ((t_lo, t_hi), (lo, hi)) in enumerate(zip(tensor_box, box, strict=True))
        if lo != t_lo or hi != t_hi
    )


def _apply(tensor: torch.Tensor, narrows) -> torch.Tensor:
    for dim, start, length in narrows:
        tensor = tensor.narrow(dim, start, length)
    return tensor


def _compile(scheme: Scheme, step: int, rank: int, names: tuple[str, ...], sources: LocalShards) -> list:
    """Per name: None (not a target), ``("view", target, segment index, narrows)`` or
    ``("new", target, shape, ((segment index, source narrows, output narrows), ...))``."""
    program = []
    for name in names:
        target = scheme.target(step, rank, name)
        if target is None:
            program.append(None)
            continue
        segments = sources.segments.get(name, ())
        inside = next((i for i, segment in enumerate(segments) if contains(segment.box, target)), None)
        if inside is not None:
            narrows = _narrows(segments[inside].box, target)
            view = _apply(sources.view(name, segments[inside]), narrows)
            if view.is_contiguous():
                program.append(("view", target, inside, narrows))
                continue
        copies = []
        for index, segment in enumerate(segments):
            inter = _intersect(segment.box, target)
            if inter is not None:
                copies.append((index, _narrows(segment.box, inter), _narrows(target, inter)))
        program.append(("new", target, box_shape(target), tuple(copies)))
    return program


def _run_program(program: list, rank: int, names: tuple[str, ...], sources: LocalShards, dtype, device):
    outputs = LocalShards(kind="generation", rank=rank, storage={}, segments={})
    allocated = 0
    for name, op in zip(names, program, strict=True):
        if op is None:
            continue
        segments = sources.segments.get(name, ())
        if op[0] == "view":
            tensor = _apply(sources.view(name, segments[op[2]]), op[3])
            if not tensor.is_contiguous():  # storage strides differ from the compiled sources': copy after all
                tensor = tensor.contiguous()
                allocated += tensor.numel() * tensor.element_size()
        else:
            tensor = torch.empty(op[2], dtype=dtype, device=device)
            allocated += tensor.numel() * tensor.element_size()
            for index, source_narrows, output_narrows in op[3]:
                _apply(tensor, output_narrows).copy_(_apply(sources.view(name, segments[index]), source_narrows))
        outputs.storage[name] = tensor
        outputs.segments[name] = [Segment(box=op[1], key=name, offset=0)]
    return outputs, allocated


def _intersect(a: Box, b: Box) -> Box | None:
    box = tuple((max(a_lo, b_lo), min(a_hi, b_hi)) for (a_lo, a_hi), (b_lo, b_hi) in zip(a, b, strict=True))
    return box if all(lo < hi for lo, hi in box) else None
