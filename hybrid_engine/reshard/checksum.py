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
the checksum of the full tensor the generation side holds after the sync. The cost is two passes over each tensor
(a row sum of its words, a sum of its values), no copy of it; the rest is a few operations over all the tensors of a
sync together (:class:`ChecksumBatch`). Pure torch.
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
    return checksum_rows([tensor], [row_offset])[0]


def _passes(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A tensor's two passes: its rows' word sums (int64: the same modulo 2**32 as any wider or wrapping sum) and,
    for a floating tensor, the sum of its values in its own dtype (bf16 has float32's range; fp16's would overflow at
    65504, so fp16 sums in float32)."""
    t = tensor.detach()
    t = (t.reshape(1) if t.dim() == 0 else t).contiguous()
    row_sums = _words(t.reshape(t.shape[0], -1)).sum(dim=1, dtype=torch.int64)
    if not t.is_floating_point():
        return row_sums, None
    return row_sums, t.sum(dtype=torch.float32) if t.dtype == torch.float16 else t.sum()


class ChecksumBatch:
    """Checksums taken a tensor at a time, as tensors pass (a stream, a model's parameters), and finished together:
    each tensor costs its two passes (:func:`_passes`), and the row weights, the sums per tensor and the finiteness
    flags are a few operations for all of them instead of a dozen a tensor (a model's 300-odd tensors: ~4,000 kernel
    launches fewer). The tensors themselves are not kept."""

    def __init__(self) -> None:
        self._passes: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        self._offsets: list[int] = []

    def add(self, tensor: torch.Tensor, row_offset: int = 0) -> None:
        """Take ``tensor``'s passes (rows ``row_offset..`` of a larger tensor when it is a row shard; not empty)."""
        self._passes.append(_passes(tensor))
        self._offsets.append(row_offset)

    def result(self) -> torch.Tensor:
        """``[n, 3]`` int64, one row a tensor in the order added, on the first tensor's device: each row what
        :func:`tensor_checksum` gives for that tensor (all on one device)."""
        passes, n = self._passes, len(self._passes)
        device = passes[0][0].device
        lengths = [row_sums.numel() for row_sums, _ in passes]
        rows = torch.cat([row_sums for row_sums, _ in passes]) & MASK
        # each row's global index + 1: row r of tensor i is at position start_i + r of ``rows``
        starts = [0]
        for length in lengths[:-1]:
            starts.append(starts[-1] + length)
        base = torch.tensor([offset + 1 - start for offset, start in zip(self._offsets, starts, strict=True)],
                            device=device)
        segment = torch.repeat_interleave(
            torch.arange(n, device=device), torch.tensor(lengths, device=device), output_size=len(rows)
        )
        weighted = (rows * (torch.arange(len(rows), device=device) + base[segment])) & MASK
        # per-tensor sums from running sums (exact: fewer than 2**31 rows of values below 2**32)
        ends = torch.tensor([start + length - 1 for start, length in zip(starts, lengths, strict=True)],
                            device=device)
        sums = torch.stack([rows.cumsum(0)[ends], weighted.cumsum(0)[ends]], dim=1)
        sums[1:] -= sums[:-1].clone()
        flags = torch.zeros(n, dtype=torch.int64, device=device)
        by_dtype: dict[torch.dtype, list[int]] = {}
        for index, (_, total) in enumerate(passes):
            if total is not None:
                by_dtype.setdefault(total.dtype, []).append(index)
        for indices in by_dtype.values():
            totals = torch.stack([passes[index][1] for index in indices])
            flags[torch.tensor(indices, device=device)] = (~torch.isfinite(totals)).to(torch.int64)
        return wrap(torch.cat([sums, flags[:, None]], dim=1))


def checksum_rows(tensors: Sequence[torch.Tensor], row_offsets: Sequence[int] | None = None) -> torch.Tensor:
    """``[n, 3]`` int64: :func:`tensor_checksum` of each tensor (all on one device, none empty), batched
    (:class:`ChecksumBatch`)."""
    batch = ChecksumBatch()
    for tensor, offset in zip(tensors, row_offsets if row_offsets is not None else [0] * len(tensors), strict=True):
        batch.add(tensor, offset)
    return batch.result()


def local_rows(tensor: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(the rows this rank holds, the global index of the first): a DTensor sharded on dim 0 (``Shard(0)``) gives its
    local rows; a plain tensor, or a replicated one (only rank 0 of its mesh counts it, see :func:`counts_here`),
    all of it."""
    to_local = getattr(tensor, "to_local", None)
    if to_local is None:
        return tensor, 0
    # lazy: DTensor's internals, only for a DTensor (the pure-tensor paths never import them)
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    _, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
    return to_local(), int(offset[0]) if offset else 0


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
    """(names, ``[n, 3]`` int64 checksums) of full (or row-shard, see :func:`local_rows`) tensors, on the first
    tensor's device so that one all-reduce sums the shares of every rank (then :func:`wrap`); batched per device
    (:func:`checksum_rows`).

    ``names`` fixes the rows (default: ``state``'s keys): every rank of an all-reduce must pass the same ones when
    the ranks hold different tensors (pipeline stages); a name this rank does not hold gets a row of zeros."""
    names = list(state) if names is None else list(names)
    if not names:
        return names, torch.zeros(0, 3, dtype=torch.int64)
    held: dict[torch.device, list[tuple[int, torch.Tensor, int]]] = {}
    for index, name in enumerate(names):
        tensor = state[name] if name in state else None  # read once: a mapping may build it on each read (a cast)
        if tensor is None or not counts_here(tensor):
            continue
        local, offset = local_rows(tensor)
        if local.numel():
            held.setdefault(local.device, []).append((index, local, offset))
    device = next(iter(held), None) or "cpu"
    out = torch.zeros(len(names), 3, dtype=torch.int64, device=device)
    for rows in held.values():
        sums = checksum_rows([local for _, local, _ in rows], [offset for _, _, offset in rows])
        out[torch.tensor([index for index, _, _ in rows], device=device)] = sums.to(device)
    return names, out


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
