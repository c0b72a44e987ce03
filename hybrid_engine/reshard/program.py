"""The executor's copy program of one bucket and step: where each of the rank's generation tensors comes from, worked
out once per layout of the training storage and replayed on every switch with as few torch calls as it can.

A generation tensor is either a *view* of the rank's own storage (one ``as_strided`` call, or the storage tensor
itself) or a *new* tensor assembled from the rank's own parts. The parts of a new tensor that repeat at a fixed
stride (the q, k or v rows of Megatron's fused ``linear_qkv``, one block per query group) are fused into one strided
copy, and all copies of the bucket run as one ``torch._foreach_copy_`` call. Bit for bit what the per-part copies
gave (``packing.allocate_outputs``, which the single-process simulation still uses): the same elements, copied.

``run_into`` writes the same outputs straight into the caller's tensors (an engine's parameters) where a bucket needs
nothing from other ranks (world size 1, or a rank whose generation shard is its own): one ``copy_`` per view or
fused part, no new tensors, the storage read once and the targets written once. (One ``torch._foreach_copy_`` of
large contiguous tensors was slower than a ``copy_`` each on an H200: 10.8 against 8.1 ms for Qwen2-7B's 339
tensors, 2026-12-01, ``scripts/gpu/bench_handoff.py``; the batched call is kept for the small strided parts.)

A program checks, each time it runs, that every storage tensor it reads still has the shape and strides it was
compiled for, and says so (``matches``) rather than reading a wrong region.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from hybrid_engine.reshard.exchange import Scheme
from hybrid_engine.reshard.shards import Box, LocalShards, Segment, box_numel, box_shape, contains

__all__ = ["BucketProgram", "Region", "compile_bucket", "foreach_copy"]


@dataclass(frozen=True, slots=True)
class Region:
    """A strided region of a tensor: ``size``, ``stride`` and ``offset`` in elements after its own storage offset."""

    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int

    @staticmethod
    def of(view: torch.Tensor, base: torch.Tensor) -> Region:
        return Region(tuple(view.shape), tuple(view.stride()), view.storage_offset() - base.storage_offset())

    def on(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.as_strided(self.size, self.stride, tensor.storage_offset() + self.offset)


@dataclass(frozen=True, slots=True)
class _View:
    name: str
    key: str
    region: Region | None
    """None: the storage tensor itself."""


@dataclass(frozen=True, slots=True)
class _New:
    name: str
    shape: tuple[int, ...]
    copies: tuple[tuple[Region | None, str, Region], ...]
    """(region of the new tensor or None for all of it, storage key, region of the storage tensor)."""


@dataclass(frozen=True)
class BucketProgram:
    """The outputs of one (step, bucket) on one rank for one storage layout; ``run`` replays it."""

    rank: int
    ops: tuple[_View | _New, ...]
    segments: dict[str, list[Segment]]
    layout: tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...]
    """(storage key, shape, strides) of every storage tensor the program reads."""
    new_elements: int
    """Elements of the new tensors (times the element size: the bytes ``run`` allocates)."""
    copies: int
    """Copies per run (after fusing), all in one batched call."""
    output_elements: int
    """Elements of all outputs (views and new tensors)."""

    def matches(self, sources: LocalShards) -> bool:
        storage = sources.storage
        for key, shape, stride in self.layout:
            tensor = storage.get(key)
            if tensor is None or tensor.shape != shape or tensor.stride() != stride:
                return False
        return True

    def run(self, sources: LocalShards, dtype: torch.dtype, device) -> tuple[LocalShards, int]:
        """The outputs (views of ``sources`` or new tensors with the rank's own parts copied in) and the bytes
        allocated."""
        storage = sources.storage
        out: dict[str, torch.Tensor] = {}
        dsts: list[torch.Tensor] = []
        srcs: list[torch.Tensor] = []
        for op in self.ops:
            if type(op) is _View:
                tensor = storage[op.key]
                out[op.name] = tensor if op.region is None else op.region.on(tensor)
                continue
            tensor = torch.empty(op.shape, dtype=dtype, device=device)
            out[op.name] = tensor
            for dst, key, src in op.copies:
                dsts.append(tensor if dst is None else dst.on(tensor))
                srcs.append(src.on(storage[key]))
        if dsts:
            foreach_copy(dsts, srcs)
        nbytes = self.new_elements * dtype.itemsize
        outputs = LocalShards(kind="generation", rank=self.rank, storage=out, segments=dict(self.segments))
        return outputs, nbytes

    def run_into(self, sources: LocalShards, targets: Mapping[str, torch.Tensor]) -> None:
        """Write the outputs straight into ``targets`` (contiguous tensors of the outputs' shapes), one ``copy_`` per
        view or fused part: the training storage is read once, the targets written once, nothing is allocated. For a
        step whose outputs need nothing from other ranks."""
        storage = sources.storage
        for op in self.ops:
            target = targets[op.name]
            if type(op) is _View:
                tensor = storage[op.key]
                target.copy_(tensor if op.region is None else op.region.on(tensor))
                continue
            for dst, key, src in op.copies:
                (target if dst is None else dst.on(target)).copy_(src.on(storage[key]))


def foreach_copy(dsts: Sequence[torch.Tensor], srcs: Sequence[torch.Tensor]) -> None:
    """``dst.copy_(src)`` for each pair, in one call where torch has ``_foreach_copy_``."""
    copy = getattr(torch, "_foreach_copy_", None)
    if copy is not None:
        copy(list(dsts), list(srcs))
        return
    for dst, src in zip(dsts, srcs, strict=True):
        dst.copy_(src)


def compile_bucket(scheme: Scheme, step: int, rank: int, names: Sequence[str], sources: LocalShards) -> BucketProgram:
    """The program of ``names`` in ``step`` on ``rank``: a view when the target lies in one segment of the sources
    and that view is contiguous, else a new tensor with every intersecting segment's part copied in."""
    ops: list[_View | _New] = []
    segments_out: dict[str, list[Segment]] = {}
    used: dict[str, torch.Tensor] = {}
    new_elements = copies = elements = 0
    for name in names:
        target = scheme.target(step, rank, name)
        if target is None:
            continue
        segments_out[name] = [Segment(box=target, key=name, offset=0)]
        elements += box_numel(target)
        segments = sources.segments.get(name, ())
        inside = next((s for s in segments if contains(s.box, target)), None)
        if inside is not None:
            base = sources.storage[inside.key]
            view = _narrow(sources.view(name, inside), inside.box, target)
            if view.is_contiguous():
                used[inside.key] = base
                whole = view.shape == base.shape and view.storage_offset() == base.storage_offset()
                ops.append(_View(name, inside.key, None if whole else Region.of(view, base)))
                continue
        shape = box_shape(target)
        blank = torch.empty(shape, device="meta")
        parts = []
        for segment in segments:
            inter = _intersect(segment.box, target)
            if inter is None:
                continue
            base = sources.storage[segment.key]
            used[segment.key] = base
            src = Region.of(_narrow(sources.view(name, segment), segment.box, inter), base)
            dst = _narrow(blank, target, inter)
            parts.append((Region.of(dst, blank), segment.key, src))
        fused = _fuse(parts)
        copies += len(fused)
        new_elements += blank.numel()
        whole = Region(tuple(shape), tuple(blank.stride()), 0)
        ops.append(_New(name, tuple(shape), tuple((None if d == whole else d, k, s) for d, k, s in fused)))
    layout = tuple((key, tuple(t.shape), tuple(t.stride())) for key, t in used.items())
    return BucketProgram(rank, tuple(ops), segments_out, layout, new_elements, copies, elements)


def _fuse(parts: list[tuple[Region, str, Region]]) -> list[tuple[Region, str, Region]]:
    """Runs of copies of equal size and strides from one storage tensor whose source and destination offsets step
    evenly, joined into one copy with a leading dimension of that step (k copies -> one)."""
    out: list[tuple[Region, str, Region]] = []
    i = 0
    while i < len(parts):
        dst, key, src = parts[i]
        j = i + 1
        if j < len(parts):
            d_step = parts[j][0].offset - dst.offset
            s_step = parts[j][2].offset - src.offset
            while (
                j < len(parts)
                and parts[j][1] == key
                and parts[j][0].size == dst.size
                and parts[j][0].stride == dst.stride
                and parts[j][2].size == src.size
                and parts[j][2].stride == src.stride
                and parts[j][0].offset - dst.offset == (j - i) * d_step
                and parts[j][2].offset - src.offset == (j - i) * s_step
                and d_step > 0
                and s_step > 0
            ):
                j += 1
        if j - i == 1:
            out.append(parts[i])
        else:
            k = j - i
            out.append(
                (
                    Region((k, *dst.size), (d_step, *dst.stride), dst.offset),
                    key,
                    Region((k, *src.size), (s_step, *src.stride), src.offset),
                )
            )
        i = j
    return out


def _narrow(tensor: torch.Tensor, tensor_box: Box, box: Box) -> torch.Tensor:
    for dim, ((t_lo, t_hi), (lo, hi)) in enumerate(zip(tensor_box, box, strict=True)):
        if lo != t_lo or hi != t_hi:
            tensor = tensor.narrow(dim, lo - t_lo, hi - lo)
    return tensor


def _intersect(a: Box, b: Box) -> Box | None:
    box = tuple((max(a_lo, b_lo), min(a_hi, b_hi)) for (a_lo, a_hi), (b_lo, b_hi) in zip(a, b, strict=True))
    return box if all(lo < hi for lo, hi in box) else None
