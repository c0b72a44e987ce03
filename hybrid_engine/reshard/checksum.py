"""A cheap, exact checksum of model weights, computed where the tensors are (on device), to check a weight sync.

Per tensor, three numbers over the tensor's bit patterns, taken row by row (dim 0; a 1-D tensor's rows are its
elements), the bits read as 32-bit words (a bf16/fp16 row of even length two values a word, float32 one value):

- ``sum``       the sum of every word, modulo 2**32;
- ``weighted``  the sum of each row's word sum times (its global row index + 1), modulo 2**32: rows in the wrong
                order (a wrong tensor-parallel interleave, a fused q/k/v put together wrongly) change it;
- ``nonfinite`` 1 when the tensor holds a NaN or an Inf (its sum is not finite), else 0.

Integer sums wrap around alike in any order, so the checksum is exact (no float tolerance) and the checksums of a
tensor's row shards add up (:func:`wrap` after adding) to the whole tensor's: each training rank sums its FSDP2
``Shard(0)`` rows (global row offsets from the DTensor), one all-reduce adds them, and the result is compared with
the checksum of the full tensor the generation side holds after the sync. The cost is two passes over the tensor
(an int32 row sum, a sum of the values), no copy of it. Pure torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

FIELDS = ("sum", "weighted", "nonfinite")
MASK = (1 << 32) - 1
_WORDS = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}


def wrap(sums: torch.Tensor) -> torch.Tensor:
    """Checksums added up (shards, an all-reduce) brought back to their modulo-2**32 form, in place."""
    sums[..., :2] &= MASK
    return sums


def _words(rows: torch.Tensor) -> torch.Tensor:
    """A ``[rows, n]`` tensor's bits as integer words: 32-bit where the row's bytes allow it."""
    size = rows.element_size()
    if size < 4 and rows.shape[1] * size % 4 == 0:
        return rows.view(torch.int32)
    return rows.view(_WORDS[size]) if rows.is_floating_point() else rows


def tensor_checksum(tensor: torch.Tensor, row_offset: int = 0) -> torch.Tensor:
    """The ``[sum, weighted, nonfinite]`` int64 checksum of ``tensor`` (rows ``row_offset..`` of a larger tensor
    when it is a row shard), on the tensor's device."""
    t = tensor.detach()
    t = (t.reshape(1) if t.dim() == 0 else t).contiguous()
    rows = t.reshape(t.shape[0], -1)
    words = _words(rows)
    accumulate = torch.int64 if words.dtype == torch.int64 else torch.int32  # int32 wraps: modulo 2**32
    row_sums = words.sum(dim=1, dtype=accumulate).to(torch.int64) & MASK
    index = torch.arange(row_offset + 1, row_offset + 1 + t.shape[0], device=t.device, dtype=torch.int64)
    if t.is_floating_point():
        # the sum in the tensor's own dtype (bf16 has float32's range); fp16's would overflow at 65504
        total = t.sum(dtype=torch.float32) if t.dtype == torch.float16 else t.sum()
        nonfinite = (~torch.isfinite(total)).to(torch.int64)
    else:
        nonfinite = row_sums.new_zeros(())
    return wrap(torch.stack([row_sums.sum(), ((row_sums * index) & MASK).sum(), nonfinite]))


def local_checksum(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor's checksum share on this rank: of its local rows for a DTensor sharded on dim 0 (``Shard(0)``),
    of the whole tensor otherwise (a replicated tensor: only rank 0 of its mesh counts it, see
    :func:`counts_here`)."""
    to_local = getattr(tensor, "to_local", None)
    if to_local is None:
        return tensor_checksum(tensor)
    # lazy: DTensor's internals, only for a DTensor (the pure-tensor paths never import them)
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    local = to_local()
    _, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
    if local.numel() == 0:
        return torch.zeros(3, dtype=torch.int64, device=local.device)
    return tensor_checksum(local, row_offset=int(offset[0]) if offset else 0)


def counts_here(tensor: torch.Tensor) -> bool:
    """Whether this rank's share of ``tensor`` is counted: always for a row-sharded DTensor, only on the mesh's
    rank 0 for a replicated one (its rows would be counted once per rank)."""
    placements = getattr(tensor, "placements", None)
    if placements is None:
        return True
    if any(getattr(p, "dim", None) == 0 for p in placements):
        return True
    return tensor.device_mesh.get_local_rank() == 0


def checksums(
    state: Mapping[str, torch.Tensor], names: Sequence[str] | None = None
) -> tuple[list[str], torch.Tensor]:
    """(names, ``[n, 3]`` int64 checksums) of full (or row-shard, see :func:`local_checksum`) tensors, stacked on
    the first tensor's device so that one all-reduce sums the shares of every rank (then :func:`wrap`).

    ``names`` fixes the rows (default: ``state``'s keys): every rank of an all-reduce must pass the same ones when
    the ranks hold different tensors (pipeline stages); a name this rank does not hold gets a row of zeros."""
    names = list(state) if names is None else list(names)
    if not names:
        return names, torch.zeros(0, 3, dtype=torch.int64)
    rows = []
    for name in names:
        tensor = state[name] if name in state else None  # read once: a mapping may build it on each read (a cast)
        rows.append(local_checksum(tensor) if tensor is not None and counts_here(tensor) else None)
    device = next(r.device for r in rows if r is not None) if any(r is not None for r in rows) else "cpu"
    rows = [torch.zeros(3, dtype=torch.int64, device=device) if r is None else r.to(device) for r in rows]
    return names, torch.stack(rows)


def first_mismatch(
    train: Mapping[str, tuple[int, int, int]], generation: Mapping[str, tuple[int, int, int]]
) -> str | None:
    """The first tensor whose checksums differ (or that one side lacks), described in one line; None when all
    agree."""
    for name, expected in train.items():
        got = generation.get(name)
        if got is None:
            return f"{name}: not on the generation side"
        if tuple(got) != tuple(expected):
            diff = ", ".join(f"{f} {a} != {b}" for f, a, b in zip(FIELDS, expected, got, strict=True) if a != b)
            return f"{name}: training and generation weights differ ({diff})"
    return None


def nonfinite(sums: Mapping[str, tuple[int, int, int]]) -> str | None:
    """The first tensor holding NaN/Inf values, in one line; None when every value is finite."""
    for name, (_, _, bad) in sums.items():
        if bad:
            return f"{name} holds NaN/Inf values"
    return None
