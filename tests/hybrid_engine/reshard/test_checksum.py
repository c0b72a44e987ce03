"""The weight-sync checksum: exact, row shards add up to the whole tensor, wrong row orders and NaNs are seen."""

from __future__ import annotations

import numpy as np
import torch

from hybrid_engine.reshard.checksum import checksum_rows, checksums, first_mismatch, nonfinite, tensor_checksum, wrap


def _wrapping_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return wrap(a + b)  # as an all-reduce's sum, then wrap


def test_row_shards_add_up_to_the_whole_tensor_exactly():
    torch.manual_seed(0)
    for dtype, cols in ((torch.float32, 7), (torch.bfloat16, 6), (torch.bfloat16, 7), (torch.float16, 8)):
        full = torch.randn(13, cols).to(dtype)  # bf16 rows of 6: 32-bit words; of 7: 16-bit ones
        shards = torch.tensor_split(full, 4)  # uneven, like FSDP2's Shard(0) of 13 rows on 4 ranks
        offset, total = 0, torch.zeros(3, dtype=torch.int64)
        for shard in shards:
            total = _wrapping_add(total, tensor_checksum(shard, row_offset=offset))
            offset += shard.shape[0]
        assert torch.equal(total, tensor_checksum(full)), (dtype, cols)


def _reference(tensor: torch.Tensor, row_offset: int) -> tuple[int, int, int]:
    """The module docstring's definition, in Python integers over numpy's view of the bytes: each row's bytes as
    signed little-endian words (32-bit where the row's bytes allow it, else the element's width), summed; the
    weighted sum by global row index + 1; 1 when a value is NaN or Inf."""
    t = tensor.reshape(1) if tensor.dim() == 0 else tensor
    rows = t.reshape(t.shape[0], -1)
    raw = rows.contiguous().view(torch.uint8).numpy()  # [rows, bytes]
    size = t.element_size()
    word = 4 if size < 4 and raw.shape[1] % 4 == 0 else size
    kind = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}[word]
    row_sums = [int(np.ascontiguousarray(row).view(kind).astype(object).sum()) % 2**32 for row in raw]
    weighted = sum(value * (row_offset + 1 + r) for r, value in enumerate(row_sums)) % 2**32
    bad = int(t.is_floating_point() and not bool(torch.isfinite(t.float()).all()))
    return sum(row_sums) % 2**32, weighted, bad


def test_a_batch_of_tensors_of_every_kind_matches_the_definition():
    torch.manual_seed(3)
    batch = [
        (torch.randn(13, 7).to(torch.bfloat16), 0),  # rows of 14 bytes: 16-bit words
        (torch.randn(13, 6).to(torch.bfloat16), 5),  # 12 bytes: 32-bit words, two values each
        (torch.randn(5).to(torch.float16), 3),  # 1-D: each value a row
        (torch.randn(3, 4, 5), 0),  # rows of 20 floats
        (torch.tensor(2.5), 0),  # 0-dim
        (torch.arange(-4, 6), 11),  # int64 buffer: 64-bit words
        (torch.randn(4, 3).double(), 2),
        (torch.tensor([[1.0, float("inf")], [0.5, 2.0]]).to(torch.bfloat16), 0),
        (torch.randint(-100, 100, (7, 3), dtype=torch.int8), 4),
        (torch.randn(300, 33).to(torch.bfloat16) * 1e4, 1_000_000),  # a shard deep in a large tensor
    ]
    got = checksum_rows([tensor for tensor, _ in batch], [offset for _, offset in batch])
    assert got.shape == (len(batch), 3) and got.dtype == torch.int64
    for row, (tensor, offset) in zip(got.tolist(), batch, strict=True):
        assert tuple(row) == _reference(tensor, offset), (tensor.dtype, tuple(tensor.shape), offset)
        assert tuple(tensor_checksum(tensor, row_offset=offset).tolist()) == tuple(row)


def test_swapped_rows_a_changed_bit_and_nans_are_seen():
    torch.manual_seed(1)
    full = torch.randn(8, 4)
    swapped = full[[1, 0, *range(2, 8)]]  # a wrong interleave: the same values, rows in another order
    base, other = tensor_checksum(full), tensor_checksum(swapped)
    assert base[0] == other[0] and base[1] != other[1]
    nudged = full.clone()
    nudged[5, 2] = torch.nextafter(nudged[5, 2], torch.tensor(float("inf")))  # one bit of one value
    assert not torch.equal(tensor_checksum(nudged), base)
    poisoned = full.clone()
    poisoned[0, :3] = float("nan")
    assert int(tensor_checksum(poisoned)[2]) == 1 and int(base[2]) == 0
    assert int(tensor_checksum(torch.tensor([1.0, float("inf")]))[2]) == 1


def test_mismatch_and_nonfinite_name_the_tensor():
    state = {"a.weight": torch.ones(3, 2), "b.bias": torch.arange(4.0), "step": torch.tensor(2.0)}
    names, sums = checksums(state)
    assert names == list(state) and sums.shape == (3, 3) and sums.dtype == torch.int64
    train = {n: tuple(row) for n, row in zip(names, sums.tolist(), strict=True)}
    assert first_mismatch(train, dict(train)) is None and nonfinite(train) is None
    changed = dict(train, **{"b.bias": (train["b.bias"][0], train["b.bias"][1] + 1, 0)})
    assert first_mismatch(train, changed) == (
        f"b.bias: training and generation weights differ (weighted {train['b.bias'][1]} != "
        f"{train['b.bias'][1] + 1})")
    assert first_mismatch(train, {"a.weight": train["a.weight"]}) == "b.bias: not on the generation side"
    assert nonfinite({**train, "a.weight": (0, 0, 1)}) == "a.weight holds NaN/Inf values"


def test_checksums_over_fixed_names_give_every_rank_the_same_rows():
    # pipeline stages hold different tensors: with the same names every rank all-reduces a [names, 3] tensor of
    # one shape, and a tensor held on one stage only is counted once (zeros elsewhere)
    torch.manual_seed(2)
    first = {"a": torch.randn(4, 2), "b": torch.randn(3)}
    second = {"c": torch.randn(5, 2)}
    names = ["a", "b", "c"]
    _, rows_first = checksums(first, names)
    _, rows_second = checksums(second, names)
    assert rows_first.shape == rows_second.shape == (3, 3)
    assert torch.equal(rows_first[2], torch.zeros(3, dtype=torch.int64))
    total = wrap(rows_first + rows_second)
    for index, name in enumerate(names):
        assert torch.equal(total[index], tensor_checksum({**first, **second}[name]))
