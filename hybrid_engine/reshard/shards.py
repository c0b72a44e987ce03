"""Training shards of one rank, as the resharder reads them: storage tensors plus a map from HF tensor boxes to rows.

A *box* is a region of a full HF tensor, one ``(lo, hi)`` per dimension. A rank's training shard is a dict of storage
tensors (Megatron names for Megatron-style shards, HF names for FSDP shards) and, for every HF tensor it holds part
of, the *segments* that say which box of the HF tensor sits at which rows of which storage tensor. Megatron's fused
tensors are where this matters: a rank's ``linear_qkv`` holds, query group after query group, its q heads of the group
then the group's k and v head; its ``linear_fc1`` holds its gate rows then its up rows. Reading q/k/v or gate/up back
out of those rows is the re-interleaving the 3D-HybridEngine needs when it concatenates fused shards on the TP dim.

Splits follow the planner (``hybrid_engine.plan.bytes``): TP slices are ``units_range`` (balanced, kv heads
replicated when there are fewer than TP ranks), FSDP2 ``Shard(0)`` follows ``torch.chunk``, pipeline stages follow
``stage_placement`` (a tied lm_head is a copy of the embedding on the last stage when pp > 1, held under the
embedding's name). These splits are a superset of Megatron-core's: Megatron needs heads and kv heads divisible by tp.

Weights come from a *source* ``source(name, shape, box) -> tensor``: ``state_dict_source`` slices a full state dict;
``synthetic_source`` computes deterministic pseudo-random values from each element's flat index, so a rank builds its
shard without ever holding the full model (and a test builds the reference the same way).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from hybrid_engine.groups import HybridGroups
from hybrid_engine.model_spec import ModelSpec, TensorSpec, units_range
from hybrid_engine.plan.bytes import stage_placement

__all__ = [
    "Box",
    "LocalShards",
    "Segment",
    "Source",
    "box_numel",
    "box_shape",
    "contains",
    "fsdp_box",
    "fsdp_shards",
    "fsdp_shards_from_state_dict",
    "full_box",
    "layout_segments",
    "megatron_layout",
    "megatron_shards",
    "narrow_box",
    "state_dict_source",
    "synthetic_source",
    "synthetic_tensor",
    "tp_box",
    "unique_tensors",
]

Box = tuple[tuple[int, int], ...]
"""A region of a full tensor: one (lo, hi) per dimension."""

Source = Callable[[str, tuple[int, ...], Box], torch.Tensor]
"""source(hf_name, full_shape, box) -> the values of that box (a tensor of box_shape(box))."""


# ---------------------------------------------------------------------------------------------------------------------
# boxes
# ---------------------------------------------------------------------------------------------------------------------


def full_box(shape: tuple[int, ...]) -> Box:
    return tuple((0, size) for size in shape)


def box_shape(box: Box) -> tuple[int, ...]:
    return tuple(hi - lo for lo, hi in box)


def box_numel(box: Box) -> int:
    out = 1
    for lo, hi in box:
        out *= hi - lo
    return out


def contains(outer: Box, inner: Box) -> bool:
    return all(o_lo <= i_lo and i_hi <= o_hi for (o_lo, o_hi), (i_lo, i_hi) in zip(outer, inner, strict=True))


def narrow_box(tensor: torch.Tensor, tensor_box: Box, box: Box) -> torch.Tensor:
    """The view of ``tensor`` (which holds ``tensor_box`` of some full tensor) that holds ``box``."""
    out = tensor
    for dim, ((t_lo, _), (lo, hi)) in enumerate(zip(tensor_box, box, strict=True)):
        if lo != t_lo or hi - lo != out.shape[dim]:
            out = out.narrow(dim, lo - t_lo, hi - lo)
    return out


def tp_box(tensor: TensorSpec, parts: int, rank: int) -> Box:
    """The box TP rank ``rank`` of ``parts`` holds of an HF tensor (balanced split; whole kv head when fewer)."""
    box = list(full_box(tensor.shape))
    if tensor.tp_dim is None or parts == 1:
        return tuple(box)
    if tensor.ep_dim is not None or len(tensor.tp_parts) != 1:
        raise NotImplementedError(
            f"{tensor.name}: partition {tensor.partition!r} (experts / several TP parts) is not resharded yet"
        )
    units, size = tensor.tp_parts[0]
    lo, hi = units_range(units, parts, rank)
    box[tensor.tp_dim] = (lo * size, hi * size)
    return tuple(box)


def fsdp_box(tensor: TensorSpec, world: int, rank: int) -> Box:
    """The rows FSDP2 ``Shard(0)`` gives ``rank`` of ``world`` (torch.chunk: ceil(rows/world) each; may be empty)."""
    rows = tensor.shape[0]
    size = -(-rows // world)
    start = min(rank * size, rows)
    return ((start, min(start + size, rows)), *full_box(tensor.shape[1:]))


def unique_tensors(spec: ModelSpec) -> list[TensorSpec]:
    """The model's tensors in state-dict order, a tied lm_head left out (it is the embedding)."""
    return [tensor for tensor in spec.tensors if tensor.tied_to is None]


# ---------------------------------------------------------------------------------------------------------------------
# weight sources
# ---------------------------------------------------------------------------------------------------------------------

_MASK32 = 0xFFFFFFFF
_HASH_MUL_1 = 0x9E3779B1  # both < 2**32 and applied to values < 2**32: int64 never overflows
_HASH_MUL_2 = 0x2C1B3C6D


def _flat_index(shape: tuple[int, ...], box: Box) -> torch.Tensor:
    index = torch.zeros((), dtype=torch.int64)
    for dim, (lo, hi) in enumerate(box):
        stride = 1
        for size in shape[dim + 1 :]:
            stride *= size
        axis = torch.arange(lo, hi, dtype=torch.int64) * stride
        index = index.unsqueeze(-1) + axis
    return index


def synthetic_tensor(
    name: str, shape: tuple[int, ...], box: Box, *, seed: int = 0, dtype: torch.dtype = torch.float32, scale=0.05
) -> torch.Tensor:
    """Deterministic pseudo-random values of ``box`` of tensor ``name``: a 32-bit integer hash (two multiply-xorshift
    rounds, in int64 so nothing overflows) of each element's flat index plus a salt from (name, seed), mapped to
    [-scale/2, scale/2). Any box of any rank equals the full tensor's slice, bit for bit."""
    salt = zlib.crc32(f"{seed}:{name}".encode())
    out = torch.empty(box_shape(box), dtype=dtype)
    if out.numel() == 0:
        return out
    rows_per_chunk = max(1, (1 << 22) // max(1, box_numel(box[1:])))
    for row in range(box[0][0], box[0][1], rows_per_chunk):
        sub = ((row, min(row + rows_per_chunk, box[0][1])), *box[1:])
        h = _flat_index(shape, sub).add_(salt)
        h.mul_(_HASH_MUL_1).bitwise_and_(_MASK32)
        h.bitwise_xor_(h >> 15)
        h.mul_(_HASH_MUL_2).bitwise_and_(_MASK32)
        h.bitwise_xor_(h >> 12)
        values = h.to(torch.float32).mul_(scale / 2**32).sub_(scale / 2).to(dtype)
        out[row - box[0][0] : sub[0][1] - box[0][0]] = values
    return out


def synthetic_source(seed: int = 0, dtype: torch.dtype = torch.float32) -> Source:
    """A source of deterministic weights (see ``synthetic_tensor``); no rank ever builds a full tensor it lacks."""

    def source(name: str, shape: tuple[int, ...], box: Box) -> torch.Tensor:
        return synthetic_tensor(name, shape, box, seed=seed, dtype=dtype)

    return source


def state_dict_source(state_dict: Mapping[str, torch.Tensor]) -> Source:
    """A source that slices a full HF state dict (copies, so shards never alias the dict)."""

    def source(name: str, shape: tuple[int, ...], box: Box) -> torch.Tensor:
        tensor = state_dict[name]
        if tuple(tensor.shape) != tuple(shape):
            raise ValueError(f"{name}: state dict has shape {tuple(tensor.shape)}, the spec says {shape}")
        return narrow_box(tensor, full_box(shape), box).clone()

    return source


# ---------------------------------------------------------------------------------------------------------------------
# local shards
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Segment:
    """Rows ``offset .. offset + box rows`` of storage tensor ``key`` hold ``box`` of an HF tensor."""

    box: Box
    key: str
    offset: int


@dataclass(kw_only=True)
class LocalShards:
    """One rank's training shards: storage tensors and, per HF tensor name, the segments that hold parts of it."""

    kind: str
    """``megatron`` (TP/PP slices, fused qkv and gate_up) or ``fsdp`` (Shard(0) over all ranks)."""
    rank: int
    storage: dict[str, torch.Tensor]
    segments: dict[str, list[Segment]] = field(default_factory=dict)
    verified: set = field(default_factory=set, repr=False, compare=False)
    """(scheme token, rank) pairs whose layout check these shards passed."""

    def boxes(self, name: str) -> tuple[Box, ...]:
        """The non-empty boxes of ``name`` this rank holds (FSDP2 gives late ranks empty chunks of short tensors)."""
        return tuple(segment.box for segment in self.segments.get(name, ()) if box_numel(segment.box))

    def view(self, name: str, segment: Segment) -> torch.Tensor:
        rows = segment.box[0][1] - segment.box[0][0]
        storage = self.storage[segment.key]
        if segment.offset == 0 and rows == storage.shape[0]:
            return storage
        return storage.narrow(0, segment.offset, rows)

    def extract(self, name: str, box: Box) -> torch.Tensor:
        """A view of ``box`` of HF tensor ``name``; the box must lie inside one segment."""
        for segment in self.segments.get(name, ()):
            if contains(segment.box, box):
                return narrow_box(self.view(name, segment), segment.box, box)
        raise KeyError(f"rank {self.rank} holds no segment of {name} containing {box}")

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.storage.values())

    @property
    def dtype(self) -> torch.dtype:
        dtypes = {t.dtype for t in self.storage.values()}
        if len(dtypes) > 1:
            raise ValueError(f"rank {self.rank}: training shards mix dtypes {sorted(map(str, dtypes))}")
        return next(iter(dtypes)) if dtypes else torch.float32

    @property
    def device(self) -> torch.device:
        for tensor in self.storage.values():
            return tensor.device
        return torch.device("cpu")


def _qkv_layout(arch, names: dict[str, TensorSpec], t: int, t_i: int) -> list[tuple[str, Box]]:
    """Megatron linear_qkv rows of TP rank t_i: for each query group, its q heads held here, then its k and v head."""
    q, k, v = names["q"], names["k"], names["v"]
    heads, kv = arch.num_attention_heads, arch.num_key_value_heads
    if heads % kv:
        raise NotImplementedError(f"{q.name}: {heads} heads are not a multiple of {kv} kv heads")
    per_group = heads // kv
    q_size, kv_size = q.shape[0] // heads, k.shape[0] // kv
    q_lo, q_hi = units_range(heads, t, t_i)
    k_lo, k_hi = units_range(kv, t, t_i)
    rest = full_box(q.shape[1:])
    out = []
    for group in range(min(q_lo // per_group, k_lo), max((q_hi - 1) // per_group, k_hi - 1) + 1):
        lo, hi = max(q_lo, group * per_group), min(q_hi, (group + 1) * per_group)
        if lo < hi:
            out.append((q.name, ((lo * q_size, hi * q_size), *rest)))
        if k_lo <= group < k_hi:
            out.append((k.name, ((group * kv_size, (group + 1) * kv_size), *full_box(k.shape[1:]))))
            out.append((v.name, ((group * kv_size, (group + 1) * kv_size), *full_box(v.shape[1:]))))
    return out


def megatron_layout(spec: ModelSpec, stage: int, pp: int, t: int, t_i: int) -> dict[str, list[tuple[str, Box]]]:
    """Storage of training (stage, TP rank t_i): Megatron name -> [(HF name, box), ...] in row order.

    Only the tensors of ``stage`` (``stage_placement``); the tied lm_head copy on the last stage is stored as
    ``output_layer.weight`` and holds the embedding's box under the embedding's name.
    """
    placed = stage_placement(spec, pp)[stage]
    arch = spec.arch
    fused: dict[str, dict[str, TensorSpec]] = {}
    out: dict[str, list[tuple[str, Box]]] = {}
    for key, tensor in placed.items():
        if tensor.ep_dim is not None:
            raise NotImplementedError(f"{tensor.name}: MoE experts are not resharded yet")
        storage = tensor.megatron_name or key
        module = tensor.name.rsplit(".", 2)[-2]
        if "linear_qkv" in storage and not storage.endswith("layer_norm_weight"):
            fused.setdefault(storage, {})[module[0]] = tensor
            out.setdefault(storage, [])
            continue
        if "linear_fc1" in storage and not storage.endswith("layer_norm_weight"):
            fused.setdefault(storage, {})[module.split("_")[0]] = tensor
            out.setdefault(storage, [])
            continue
        out[storage] = [(key, tp_box(tensor, t, t_i))]
    for storage, members in fused.items():
        if set(members) == {"q", "k", "v"}:
            out[storage] = _qkv_layout(arch, members, t, t_i)
        elif set(members) == {"gate", "up"}:
            out[storage] = [(members[m].name, tp_box(members[m], t, t_i)) for m in ("gate", "up")]
        else:
            raise NotImplementedError(f"{storage}: cannot fuse {sorted(members)}")
    return out


def layout_segments(layout: dict[str, list[tuple[str, Box]]]) -> dict[str, list[Segment]]:
    """HF name -> its segments, for storage tensors that stack each layout entry's boxes row after row."""
    segments: dict[str, list[Segment]] = {}
    for key, parts in layout.items():
        offset = 0
        for name, box in parts:
            segments.setdefault(name, []).append(Segment(box=box, key=key, offset=offset))
            offset += box[0][1] - box[0][0]
    return segments


def _build(kind: str, rank: int, layout: dict[str, list[tuple[str, Box]]], shapes, source: Source) -> LocalShards:
    storage: dict[str, torch.Tensor] = {}
    for key, parts in layout.items():
        pieces = [source(name, shapes[name], box) for name, box in parts]
        storage[key] = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=0)
    return LocalShards(kind=kind, rank=rank, storage=storage, segments=layout_segments(layout))


def megatron_shards(spec: ModelSpec, groups: HybridGroups, rank: int, source: Source) -> LocalShards:
    """The Megatron-style training shard of ``rank`` (its stage's tensors, TP-sliced, qkv and gate_up fused)."""
    if groups.fsdp:
        raise ValueError("megatron_shards needs a Megatron layout (tp/pp); these groups map FSDP shards")
    _, stage, t_i, _ = groups.train_coords(rank)
    layout = megatron_layout(spec, stage, groups.p, groups.t, t_i)
    return _build("megatron", rank, layout, spec.shapes(), source)


def fsdp_shards(spec: ModelSpec, world: int, rank: int, source: Source) -> LocalShards:
    """FSDP2 ``Shard(0)`` rows of every (untied) tensor on ``rank`` of ``world``, stored under HF names."""
    layout = {t.name: [(t.name, fsdp_box(t, world, rank))] for t in unique_tensors(spec)}
    return _build("fsdp", rank, layout, spec.shapes(), source)


def fsdp_shards_from_state_dict(state_dict: Mapping[str, torch.Tensor], spec: ModelSpec) -> LocalShards:
    """Wrap an FSDP2 module's ``state_dict()`` (DTensors with placement ``Shard(0)`` over a 1-D mesh) without copying.

    Names must be HF names (verl's ``convert_weight_keys`` output); a tied lm_head is skipped. Each local tensor must
    be the ``torch.chunk`` rows of its rank, which is what FSDP2 keeps (its padding is not part of ``to_local()``).
    """
    from torch.distributed.tensor import DTensor, Shard

    storage: dict[str, torch.Tensor] = {}
    segments: dict[str, list[Segment]] = {}
    rank = world = None
    meshes: dict[int, tuple[int, int]] = {}  # id(mesh) -> (rank, world): DeviceMesh.mesh is rebuilt on each read
    for tensor in unique_tensors(spec):
        if tensor.name not in state_dict:
            raise KeyError(f"state dict lacks {tensor.name} (has {len(state_dict)} keys)")
        value = state_dict[tensor.name]
        if not isinstance(value, DTensor):
            raise TypeError(f"{tensor.name}: expected a DTensor from an FSDP2 module, got {type(value).__name__}")
        if tuple(value.placements) != (Shard(0),):
            raise ValueError(f"{tensor.name}: placements {value.placements}, need (Shard(0),)")
        mesh = value.device_mesh
        if id(mesh) not in meshes:
            if mesh.ndim != 1 or mesh.mesh.tolist() != list(range(mesh.size())):
                raise ValueError(
                    f"{tensor.name}: FSDP mesh {mesh.mesh.tolist()} is not one dimension over ranks 0..N-1"
                )
            meshes[id(mesh)] = mesh.get_local_rank(), mesh.size()
        rank, world = meshes[id(mesh)]
        box = fsdp_box(tensor, world, rank)
        local = value.to_local()
        if tuple(local.shape) != box_shape(box):
            raise ValueError(f"{tensor.name}: local shape {tuple(local.shape)} != torch.chunk rows {box_shape(box)}")
        storage[tensor.name] = local.detach()
        segments[tensor.name] = [Segment(box=box, key=tensor.name, offset=0)]
    return LocalShards(kind="fsdp", rank=rank or 0, storage=storage, segments=segments)
