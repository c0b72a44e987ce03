"""A Megatron-core GPTModel's own parameters as the resharder's training shards, and their stream to rollout feeders.

``megatron_shards_from_state_dict`` wraps the parameters of one (pipeline stage, TP rank) of a GPTModel (megatron-core
``GPTModel.named_parameters()``: ``embedding.word_embeddings.weight``, ``decoder.layers.<local>.self_attention.
linear_qkv.weight``, ``output_layer.weight``, ...) as ``LocalShards(kind="megatron")`` without copying: the storage
tensors are the parameters (detached), the segments say which rows hold which box of which HF tensor, exactly as
``shards.megatron_layout`` lays them out (fused ``linear_qkv`` query group after query group, ``linear_fc1`` =
[gate; up], TP slices by ``units_range``, layers of the stage by ``stage_bounds``). Layer numbers are local to the
stage (megatron-core's ``TransformerBlock`` numbers its layers from 0 on every stage); the layernorms may be named as
TransformerEngine's layer spec fuses them (``linear_qkv.layer_norm_weight``, ``linear_fc1.layer_norm_weight``) or as
megatron-core's local spec keeps them (``input_layernorm.weight``, ``pre_mlp_layernorm.weight``). The vocabulary
Megatron pads (mbridge's ``make_vocab_size_divisible_by``) is taken at tp=1 only: the padding rows sit after the
segment; at tp > 1 Megatron's padded split is not ``units_range``'s and is refused.

``megatron_stream_to_feeders`` is ``executor.stream_to_feeders`` for such shards: scheme ``gather_to_feeders`` on
tp/pp/dp groups (megatron-core's default rank order ``tp-cp-ep-dp-pp``, ``layout.TrainLayout``); a feeder takes the
boxes its own shard lacks from the first rank holding them; at tp=pp=1 every rank holds the whole model and nothing
moves. What is refused (names, shapes, rank order, MoE experts, uneven pipeline stages) raises before any collective.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.distributed as dist

from hybrid_engine.groups import HybridGroups, hybrid_groups
from hybrid_engine.layout import InferLayout, TrainLayout
from hybrid_engine.model_spec import ModelSpec
from hybrid_engine.plan.bytes import stage_bounds
from hybrid_engine.reshard.checksum import ChecksumBatch, wrap
from hybrid_engine.reshard.exchange import Scheme
from hybrid_engine.reshard.executor import (
    DEFAULT_BUCKET_BYTES,
    ShardedWeights,
    feeder_ranks,
    feeder_resharder,
    feeder_stream,
    spec_of,
)
from hybrid_engine.reshard.shards import Box, LocalShards, layout_segments, megatron_layout, unique_tensors

__all__ = [
    "LOCAL_SPEC_NAMES",
    "MegatronRank",
    "MegatronShardedWeights",
    "megatron_checksums",
    "megatron_feeder_groups",
    "megatron_rollout_weight_stream",
    "megatron_shards_from_state_dict",
    "megatron_stream_to_feeders",
]

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")
LOCAL_SPEC_NAMES = {
    # megatron-core's local layer spec keeps the layernorms TransformerEngine's spec fuses into the next linear
    "input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
    "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight",
}
_VOCAB_KEYS = ("embedding.word_embeddings.weight", "output_layer.weight")


@dataclass(frozen=True, slots=True)
class MegatronRank:
    """Where one rank's GPTModel sits: TP size and rank, pipeline size and stage."""

    tp: int = 1
    tp_rank: int = 0
    pp: int = 1
    stage: int = 0


def _layout_key(name: str, layer_offset: int, layout: Mapping[str, list]) -> str:
    """The ``megatron_layout`` key of GPTModel parameter ``name`` (local layer number, either layer spec)."""
    match = _LAYER.match(name)
    key = name
    if match:
        key = f"decoder.layers.{int(match.group(1)) + layer_offset}.{name[match.end():]}"
    if key in layout:
        return key
    for local, fused in LOCAL_SPEC_NAMES.items():
        if key.endswith("." + local) and key[: -len(local)] + fused in layout:
            return key[: -len(local)] + fused
    raise KeyError(f"{name}: not a tensor of this stage's Megatron layout (the model spec does not know it)")


def _check_shape(key: str, value: torch.Tensor, parts: list[tuple[str, Box]], tp: int) -> None:
    """``value`` must be the rows the layout stacks under ``key``; a vocab tensor at tp=1 may carry padding rows."""
    rows = sum(box[0][1] - box[0][0] for _, box in parts)
    expected = (rows, *(hi - lo for lo, hi in parts[0][1][1:]))
    shape = tuple(value.shape)
    if shape == expected:
        return
    padded = key in _VOCAB_KEYS and shape[1:] == expected[1:] and shape[0] > rows
    if padded and tp == 1:
        return
    if padded:
        raise NotImplementedError(
            f"{key}: Megatron's padded vocabulary ({shape[0]} rows per rank for {tp} TP ranks) is not split as the "
            f"resharder splits the vocabulary; pad nothing (make_vocab_size_divisible_by) or use tp=1"
        )
    raise ValueError(f"{key}: shape {shape}, the Megatron layout says {expected}")


def megatron_shards_from_state_dict(
    state_dict: Mapping[str, torch.Tensor],
    spec: ModelSpec,
    tp: int = 1,
    tp_rank: int = 0,
    pp: int = 1,
    stage: int = 0,
    *,
    rank: int = 0,
) -> LocalShards:
    """Wrap the parameters of a GPTModel (TP rank ``tp_rank`` of ``tp``, stage ``stage`` of ``pp``) without copying.

    ``state_dict``: Megatron name -> tensor (``GPTModel.named_parameters()``; TransformerEngine's ``_extra_state``
    entries are skipped). Every tensor the layout places on this (stage, TP rank) must be there with the layout's
    shape, and nothing else: KeyError / ValueError / NotImplementedError name the first that is not. ``rank``: the
    global rank the shards are given to the resharder as."""
    layers = spec.arch.num_hidden_layers
    if layers % pp:
        raise NotImplementedError(f"{layers} layers over {pp} pipeline stages: uneven stages are not modelled")
    layout = megatron_layout(spec, stage, pp, tp, tp_rank)
    offset = stage_bounds(layers, pp)[stage]
    storage: dict[str, torch.Tensor] = {}
    for name, value in state_dict.items():
        if name.endswith("_extra_state"):
            continue
        key = _layout_key(name, offset, layout)
        if key in storage:
            raise KeyError(f"{name}: a second tensor for {key}")
        _check_shape(key, value, layout[key], tp)
        storage[key] = value.detach()
    missing = [key for key in layout if key not in storage]
    if missing:
        raise KeyError(f"stage {stage}, TP rank {tp_rank}: the parameters lack {len(missing)} tensors: {missing[:5]}")
    return LocalShards(kind="megatron", rank=rank, storage=storage, segments=layout_segments(layout))


def megatron_feeder_groups(world: int, tp: int, pp: int) -> HybridGroups:
    """The training groups of Megatron-style shards over ``world`` ranks (dp = world / (tp * pp)), megatron-core's
    default rank order; the generation side is one tp=1 replica per rank (feeders take the full model)."""
    if tp < 1 or pp < 1 or world % (tp * pp):
        raise ValueError(f"tp({tp}) * pp({pp}) must divide the world size {world}")
    train = TrainLayout(tp=tp, pp=pp, dp=world // (tp * pp))
    return hybrid_groups(train, InferLayout(tp=1).resolve(world), fsdp=False, placement="auto")


def _check_place(groups: HybridGroups, rank: int, where: MegatronRank) -> None:
    """ValueError unless ``rank`` sits at ``where`` in megatron-core's default rank order."""
    _, stage, tp_rank, _ = groups.train_coords(rank)
    if (stage, tp_rank) != (where.stage, where.tp_rank):
        raise ValueError(
            f"rank {rank} is (stage {where.stage}, TP rank {where.tp_rank}); megatron-core's default order "
            f"tp-cp-ep-dp-pp puts it at (stage {stage}, TP rank {tp_rank})"
        )


def megatron_stream_to_feeders(
    state_dict: Mapping[str, torch.Tensor],
    spec: ModelSpec,
    feeders: Sequence[int],
    where: MegatronRank,
    *,
    bucket_bytes: int | None = DEFAULT_BUCKET_BYTES,
    stats_out: list | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Full HF tensors on the ``feeders`` ranks only (q/k/v out of ``linear_qkv``, gate/up out of ``linear_fc1``),
    from each rank's GPTModel parameters (``where``: this rank's place). Every rank must exhaust the iterator;
    non-feeders yield nothing. Everything that can refuse is checked here, before any collective (see the module
    docstring); the rank-order check is this rank's own: a caller with tp*pp > 1 should agree on the outcome."""
    world, rank = dist.get_world_size(), dist.get_rank()
    groups = megatron_feeder_groups(world, where.tp, where.pp)
    _check_place(groups, rank, where)
    shards = megatron_shards_from_state_dict(
        state_dict, spec, where.tp, where.tp_rank, where.pp, where.stage, rank=rank
    )
    shards.dtype  # noqa: B018  (raises ValueError where the parameters mix dtypes)
    resharder = feeder_resharder(spec, groups, tuple(feeders), bucket_bytes)
    resharder.scheme.check_shards(rank, shards)
    return feeder_stream(resharder, shards, stats_out)


@lru_cache(maxsize=16)
def _first_holder_boxes(spec: ModelSpec, groups: HybridGroups, rank: int) -> dict[str, set[Box]]:
    """Boxes ``rank`` holds that no lower rank holds (each box of the model is counted on exactly one rank)."""
    scheme = Scheme("gather_to_feeders", spec, groups, feeders=(0,))
    out: dict[str, set[Box]] = {}
    for tensor in unique_tensors(spec):
        lower = {box for other in range(rank) for box in scheme.shard_boxes(other, tensor.name)}
        out[tensor.name] = set(scheme.shard_boxes(rank, tensor.name)) - lower
    return out


@lru_cache(maxsize=16)
def _misaligned_split(spec: ModelSpec, groups: HybridGroups, element_size: int) -> str | None:
    """A box of any rank that splits rows off the checksum's 32-bit words (``checksum._words``: a row of 2-byte
    values is read two values a word), or None. Decided over all ranks, so every rank decides alike."""
    scheme = Scheme("gather_to_feeders", spec, groups, feeders=(0,))
    for tensor in unique_tensors(spec):
        for rank in range(groups.world_size):
            for box in scheme.shard_boxes(rank, tensor.name):
                if all(lo == 0 and hi == size for (lo, hi), size in zip(box[1:], tensor.shape[1:], strict=True)):
                    continue
                if any((lo * element_size) % 4 or (hi * element_size) % 4 for lo, hi in box[1:]):
                    return f"{tensor.name}: the TP slice {box} of rank {rank} splits the checksum's 32-bit words"
    return None


def megatron_checksums(
    shards: LocalShards, spec: ModelSpec, groups: HybridGroups
) -> tuple[list[str], torch.Tensor]:
    """(HF names, ``[n, 3]`` checksums) of the boxes this rank is the first holder of: summed over all ranks (one
    all-reduce, then ``checksum.wrap``) they are the full tensors' checksums (``checksum.tensor_checksum``).
    NotImplementedError, alike on every rank, where a TP slice splits the checksum's words."""
    problem = _misaligned_split(spec, groups, shards.dtype.itemsize)
    if problem:
        raise NotImplementedError(problem)
    counted = _first_holder_boxes(spec, groups, shards.rank)
    names = [tensor.name for tensor in unique_tensors(spec)]
    if not names:
        return names, torch.zeros(0, 3, dtype=torch.int64)
    batch, owners = ChecksumBatch(), []  # one row a counted segment, and the name's index it adds to
    for index, name in enumerate(names):
        for segment in shards.segments.get(name, ()):
            if segment.box in counted[name]:
                batch.add(shards.view(name, segment), row_offset=segment.box[0][0])
                owners.append(index)
    out = torch.zeros(len(names), 3, dtype=torch.int64, device=shards.device)
    if owners:
        out.index_add_(0, torch.tensor(owners, device=shards.device), batch.result())
    return names, wrap(out)


class MegatronShardedWeights(ShardedWeights):
    """verl's per-tensor weight iterable with the GPTModel's parameters (Megatron names, nothing copied) and this
    rank's place beside it; iterating it is verl's own path (``fallback``)."""

    def __init__(self, state_dict, fallback, hf_config: Mapping | None, where: MegatronRank):
        super().__init__(state_dict, fallback, hf_config)
        self.where = where

    def shards(self, spec: ModelSpec) -> LocalShards:
        """The parameters as this rank's training shards (raises as ``megatron_stream_to_feeders`` would)."""
        world, rank = _world_and_rank()
        _check_place(megatron_feeder_groups(world, self.where.tp, self.where.pp), rank, self.where)
        where = self.where
        shards = megatron_shards_from_state_dict(
            self.state_dict, spec, where.tp, where.tp_rank, where.pp, where.stage, rank=rank
        )
        shards.dtype  # noqa: B018  (raises ValueError where the parameters mix dtypes)
        return shards

    def groups(self) -> HybridGroups:
        return megatron_feeder_groups(_world_and_rank()[0], self.where.tp, self.where.pp)


def _world_and_rank() -> tuple[int, int]:
    if not dist.is_initialized():
        return 1, 0
    return dist.get_world_size(), dist.get_rank()


def megatron_rollout_weight_stream(
    weights: MegatronShardedWeights,
    *,
    rollout_world_size: int,
    spec: ModelSpec | None = None,
    bucket_bytes: int | None = DEFAULT_BUCKET_BYTES,
    stats_out: list | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """``executor.rollout_weight_stream`` for Megatron weights: the first rank of every rollout replica feeds."""
    if spec is None:
        if weights.hf_config is None:
            raise ValueError("megatron_rollout_weight_stream needs the weights' hf_config or a spec")
        spec = spec_of(weights.hf_config)
    feeders = feeder_ranks(dist.get_world_size(), rollout_world_size)
    return megatron_stream_to_feeders(
        weights.state_dict, spec, feeders, weights.where, bucket_bytes=bucket_bytes, stats_out=stats_out
    )
