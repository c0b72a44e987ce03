"""What moves where: the exchange plan of one resharding scheme, computed alike on every rank with no communication.

A scheme is a list of *steps* (the planner's phases). In a step every rank *holds* some boxes of each HF tensor and
*targets* one box (or nothing). For one group of ranks and one bucket of tensors the plan cuts each tensor into
*cells* along every box edge of every member; a cell that some member targets and does not hold moves once from an
*owner* (a member holding it) to exactly those *receivers*. So every byte a rank receives is a byte it needs and lacks,
received once: the planner's count (``hybrid_engine.plan.bytes``), by construction.

Cells whose receivers are all the other members of a group of the owner's chain go into that group's **all-gather**
(one per group and bucket; a single contributor makes it a broadcast). The rest (copies of replicated tensors or of
kv heads that several members hold, the tied embedding for middle pipeline stages, FSDP rows outside a rank's
micro-DP group, row-parallel FSDP slices) travel **point to point**, each sender sending each receiver only what it
lacks (an all-to-all made of isend/irecv, so a cell that several ranks need is never copied once per receiver, and a
cell that is a contiguous block on both sides is sent from and received into place). Where several members hold a
cell, each receiver takes it from the first holder in its narrowest group that has one.

Schemes (names as in the planner):

- ``hybridflow``: one step, "micro-DP all-gather" over the micro-DP group, from Megatron-style shards; targets are
  the generation shards (stages of generation stage pi, TP slice tau of t_g). With k_p > 1 the chain starts with the
  k_t members of the rank's own stage, where each stage completes its own copy of the tied embedding.
- ``tp_group_gather``: "TP/EP all-gather in stage" over the training TP group (target: the full tensors of the
  rank's stage), then "pipeline broadcast" over the pipeline group (target: the full model).
- ``full_gather``: "all-gather over all ranks", from FSDP ``Shard(0)`` shards; target: the full model.
- ``fsdp_to_tp``: from FSDP shards, "column all-gather (N/t_g ranks)" for tensors split on dim 0 (chain: the N/t_g
  consecutive ranks of a generation TP rank, then the world), then "row/replicated all-to-all" for the rest.
- ``gather_to_feeders``: only the listed feeder ranks target the full model (a rollout server's feeder); the others
  receive nothing. From FSDP shards (FSDP groups) or Megatron-style shards (tp/pp/dp groups: a feeder takes what
  its own shard lacks from the first rank holding it). Not a planner scheme: from FSDP shards a feeder receives
  full_gather's bytes, the rest 0.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

from hybrid_engine.groups import HybridGroups
from hybrid_engine.model_spec import ModelSpec, TensorSpec
from hybrid_engine.plan.bytes import stage_placement
from hybrid_engine.reshard.shards import (
    Box,
    LocalShards,
    box_numel,
    contains,
    fsdp_box,
    full_box,
    megatron_layout,
    tp_box,
    unique_tensors,
)

__all__ = [
    "SCHEME_NAMES",
    "Cell",
    "Exchange",
    "Gather",
    "Scheme",
    "Step",
    "make_buckets",
]

SCHEME_NAMES = ("hybridflow", "tp_group_gather", "full_gather", "fsdp_to_tp", "gather_to_feeders")

Group = tuple[int, ...]
_SCHEME_TOKENS = itertools.count()


@dataclass(frozen=True, slots=True)
class Cell:
    """A box of one HF tensor that moves from ``owner`` to each of ``receivers`` (global ranks)."""

    name: str
    box: Box
    owner: int
    receivers: tuple[int, ...]

    @property
    def numel(self) -> int:
        return box_numel(self.box)


@dataclass(frozen=True)
class Gather:
    """One all-gather: ``members`` (sorted global ranks) and, per member, the cells it contributes, in order."""

    members: Group
    cells: tuple[tuple[Cell, ...], ...]

    @cached_property
    def lengths(self) -> tuple[int, ...]:
        return tuple(sum(cell.numel for cell in cells) for cells in self.cells)

    @property
    def single_source(self) -> int | None:
        """The member index of the only contributor, when there is exactly one (the gather is then a broadcast)."""
        nonzero = [i for i, length in enumerate(self.lengths) if length]
        return nonzero[0] if len(nonzero) == 1 else None


@dataclass(frozen=True)
class Exchange:
    """The moves of one step, one bucket, one widest group: all-gathers inside subgroups, then point-to-point sends
    (together an all-to-all)."""

    phase: str
    group: Group
    names: tuple[str, ...]
    gathers: tuple[Gather, ...]
    p2p: tuple[Cell, ...]
    """Cells sent point to point (isend/irecv) from owner to each receiver, in this order."""

    def gathers_of(self, rank: int) -> list[Gather]:
        return [gather for gather in self.gathers if rank in gather.members]


@dataclass(frozen=True)
class Step:
    phase: str
    """The planner's phase name."""
    source: str
    """``shards`` (the training shards) or ``previous`` (the previous step's outputs)."""
    final: bool
    """Whether this step's outputs are yielded."""
    names: frozenset[str] | None = None
    """Tensors this step moves (None: all)."""


class Scheme:
    """Who holds and who targets which box in each step of ``name`` on (``spec``, ``groups``). Pure; cached."""

    def __init__(self, name: str, spec: ModelSpec, groups: HybridGroups, feeders: Sequence[int] | None = None):
        if name not in SCHEME_NAMES:
            raise ValueError(f"unknown resharding scheme {name!r}; choose from {list(SCHEME_NAMES)}")
        if name in ("hybridflow", "tp_group_gather") and groups.fsdp:
            raise ValueError(f"{name} reshards Megatron-style (tp/pp) shards; these groups are FSDP (use fsdp_to_tp)")
        if name == "fsdp_to_tp" and not groups.fsdp:
            raise ValueError("fsdp_to_tp needs FSDP groups (hybrid_groups(..., fsdp=True))")
        if name == "gather_to_feeders" and not feeders:
            raise ValueError("gather_to_feeders needs the feeder ranks")
        self.name, self.spec, self.groups = name, spec, groups
        self.world = groups.world_size
        self.feeders = frozenset(feeders or ())
        self.tensors: dict[str, TensorSpec] = {t.name: t for t in unique_tensors(spec)}
        self.order = [t.name for t in unique_tensors(spec)]
        self._plans: dict[tuple, Exchange] = {}
        self._targets: dict[tuple[int, int, str], Box | None] = {}
        self._chains: dict[tuple[int, int], tuple[Group, ...]] = {}
        self._gen_names: dict[int, frozenset[str]] = {}
        self._token = next(_SCHEME_TOKENS)  # unlike id(), never reused by a later scheme
        self._megatron: dict[tuple[int, int], dict[str, tuple[Box, ...]]] = {}
        if name == "hybridflow":
            self.steps = [Step(phase="micro-DP all-gather", source="shards", final=True)]
        elif name == "tp_group_gather":
            self.steps = [
                Step(phase="TP/EP all-gather in stage", source="shards", final=False),
                Step(phase="pipeline broadcast", source="previous", final=True),
            ]
        elif name == "full_gather":
            self.steps = [Step(phase="all-gather over all ranks", source="shards", final=True)]
        elif name == "gather_to_feeders":
            self.steps = [Step(phase="gather to rollout feeders", source="shards", final=True)]
        else:
            column = frozenset(n for n, t in self.tensors.items() if t.tp_dim == 0)
            self.steps = [
                Step(phase="column all-gather (N/t_g ranks)", source="shards", final=True, names=column),
                Step(
                    phase="row/replicated all-to-all",
                    source="shards",
                    final=True,
                    names=frozenset(self.tensors) - column,
                ),
            ]

    @property
    def pipeline_stages(self) -> int:
        """Pipeline stages of the training shards (1 for FSDP shards): buckets interleave them."""
        return self.groups.p if self.source_kind == "megatron" else 1

    # -- sources -------------------------------------------------------------------------------------------------------
    @property
    def source_kind(self) -> str:
        """``megatron`` (tp/pp slices, fused qkv and gate_up) or ``fsdp`` (Shard(0)); ``gather_to_feeders`` takes
        either, as its groups say."""
        if self.name == "gather_to_feeders":
            return "fsdp" if self.groups.fsdp else "megatron"
        return "megatron" if self.name in ("hybridflow", "tp_group_gather") else "fsdp"

    @cached_property
    def _placed(self) -> list[dict[str, TensorSpec]]:
        return stage_placement(self.spec, self.groups.p)

    def _megatron_boxes(self, rank: int) -> dict[str, tuple[Box, ...]]:
        _, stage, t_i, _ = self.groups.train_coords(rank)
        key = (stage, t_i)
        if key not in self._megatron:
            boxes: dict[str, list[Box]] = {}
            for parts in megatron_layout(self.spec, stage, self.groups.p, self.groups.t, t_i).values():
                for name, box in parts:
                    boxes.setdefault(name, []).append(box)
            self._megatron[key] = {name: tuple(b) for name, b in boxes.items()}
        return self._megatron[key]

    def shard_boxes(self, rank: int, name: str) -> tuple[Box, ...]:
        """The boxes of ``name`` that ``rank``'s training shards hold."""
        if self.source_kind == "megatron":
            return self._megatron_boxes(rank).get(name, ())
        box = fsdp_box(self.tensors[name], self.world, rank)
        return (box,) if box_numel(box) else ()

    def check_shards(self, rank: int, shards: LocalShards) -> None:
        """Raise ValueError unless ``shards`` hold exactly what this scheme's layout says ``rank`` holds. A shards
        object that passed is not checked again by this scheme (replace its segments and it is a new layout: build a
        new LocalShards instead)."""
        if (self._token, rank) in shards.verified:
            return
        kind = self.source_kind
        if shards.kind != kind:
            raise ValueError(f"{self.name} reshards {kind} training shards, got {shards.kind} shards")
        for name in self.order:
            expected = self.shard_boxes(rank, name)
            if shards.boxes(name) != expected:
                raise ValueError(
                    f"rank {rank}: shards hold {name} as {shards.boxes(name)}, the {kind} layout says {expected}"
                )
        shards.verified.add((self._token, rank))

    # -- per step ------------------------------------------------------------------------------------------------------
    def holds(self, step: int, rank: int, name: str) -> tuple[Box, ...]:
        if self.steps[step].source == "shards":
            return self.shard_boxes(rank, name)
        previous = self.target(step - 1, rank, name)
        return (previous,) if previous is not None else ()

    def target(self, step: int, rank: int, name: str) -> Box | None:
        """The box ``rank`` has of ``name`` after ``step`` (None: it does not take part in ``name``). Memoised: the
        executor asks for every tensor on every switch."""
        key = (step, rank, name)
        if key not in self._targets:
            self._targets[key] = self._target(step, rank, name)
        return self._targets[key]

    def _target(self, step: int, rank: int, name: str) -> Box | None:
        names = self.steps[step].names
        if names is not None and name not in names:
            return None
        tensor, groups = self.tensors[name], self.groups
        if self.name == "hybridflow":
            _, stage, t_i, _ = groups.train_coords(rank)
            if name not in self._gen_stage_names(stage // groups.k_p):
                return None
            return tp_box(tensor, groups.t_g, t_i // groups.k_t)
        if self.name == "tp_group_gather" and step == 0:
            _, stage, _, _ = groups.train_coords(rank)
            return full_box(tensor.shape) if name in self._placed[stage] else None
        if self.name == "fsdp_to_tp":
            return tp_box(tensor, groups.t_g, rank // (self.world // groups.t_g))
        if self.name == "gather_to_feeders" and rank not in self.feeders:
            return None
        return full_box(tensor.shape)

    def _gen_stage_names(self, pi: int) -> frozenset[str]:
        if pi not in self._gen_names:
            k_p = self.groups.k_p
            self._gen_names[pi] = frozenset(key for s in range(pi * k_p, (pi + 1) * k_p) for key in self._placed[s])
        return self._gen_names[pi]

    def final_names(self, rank: int) -> list[str]:
        """HF names ``rank`` yields, in model order."""
        return [n for n in self.order if any(s.final and self.target(i, rank, n) for i, s in enumerate(self.steps))]

    def chain(self, step: int, rank: int) -> tuple[Group, ...]:
        """Groups of ``rank`` in ``step``, narrowest first; the last is where the all-to-all runs. Memoised: the
        executor asks for it per bucket on every switch."""
        key = (step, rank)
        if key not in self._chains:
            self._chains[key] = self._chain(step, rank)
        return self._chains[key]

    def _chain(self, step: int, rank: int) -> tuple[Group, ...]:
        groups, world = self.groups, tuple(range(self.world))
        if self.name == "hybridflow":
            micro = tuple(sorted(groups.micro_dp_group(rank)))
            if groups.k_p == 1 or groups.k_t == 1:
                return (micro,)
            data, stage, t_i, _ = groups.train_coords(rank)
            first = t_i - t_i % groups.k_t
            stage_part = tuple(sorted(int(groups.rank_of(data, stage, first + j)) for j in range(groups.k_t)))
            return (stage_part, micro)
        if self.name == "tp_group_gather":
            data, stage, t_i, _ = groups.train_coords(rank)
            if step == 0:
                return (tuple(sorted(int(groups.rank_of(data, stage, j)) for j in range(groups.t))),)
            return (tuple(sorted(int(groups.rank_of(data, s, t_i)) for s in range(groups.p))),)
        if self.name == "fsdp_to_tp" and step == 0:
            micro = tuple(sorted(groups.micro_dp_group(rank)))
            return (micro, world) if micro != world else (world,)
        return (world,)

    def all_groups(self) -> list[Group]:
        """Every group any step uses (process groups to create), in a fixed order."""
        seen: dict[Group, None] = {}
        for step in range(len(self.steps)):
            for rank in range(self.world):
                for group in self.chain(step, rank):
                    seen.setdefault(group, None)
        return list(seen)

    # -- the plan ------------------------------------------------------------------------------------------------------
    def exchange(self, step: int, rank: int, names: Sequence[str]) -> Exchange:
        """The exchange of ``rank``'s widest group in ``step`` for tensors ``names`` (cached per group)."""
        group = self.chain(step, rank)[-1]
        key = (step, group, tuple(names))
        if key not in self._plans:
            self._plans[key] = self._plan(step, group, tuple(names))
        return self._plans[key]

    def _plan(self, step: int, group: Group, names: tuple[str, ...]) -> Exchange:
        chains = {member: self.chain(step, member) for member in group}
        for member, chain in chains.items():
            if chain[-1] != group:
                raise AssertionError(f"rank {member}'s widest group {chain[-1]} != {group}")
        gather_cells: dict[Group, dict[int, list[Cell]]] = {}
        p2p: list[Cell] = []
        moved: list[str] = []
        for name in names:
            cells = self._cells(step, group, name, chains)
            if cells is None:
                continue
            moved.append(name)
            for cell in cells:
                receivers = set(cell.receivers)
                for candidate in chains[cell.owner]:
                    if receivers == set(candidate) - {cell.owner}:
                        gather_cells.setdefault(candidate, {}).setdefault(cell.owner, []).append(cell)
                        break
                else:
                    p2p.append(cell)
        gathers = tuple(
            Gather(members=g, cells=tuple(tuple(by_owner.get(m, ())) for m in g))
            for g, by_owner in sorted(gather_cells.items())
        )
        return Exchange(phase=self.steps[step].phase, group=group, names=tuple(moved), gathers=gathers, p2p=tuple(p2p))

    def _cells(self, step: int, group: Group, name: str, chains: dict[int, tuple[Group, ...]]) -> list[Cell] | None:
        """Cells of ``name`` that move inside ``group`` ([] when nothing moves; None when no member targets it).

        Where several members hold a cell, each receiver takes it from the first holder in its narrowest group that
        has one (the tied embedding's two copies under pp > 1 then feed one all-gather per stage instead of one
        sender feeding everybody)."""
        targets = {m: self.target(step, m, name) for m in group}
        if all(box is None for box in targets.values()):
            return None
        holds = {m: self.holds(step, m, name) for m in group}
        shape = self.tensors[name].shape
        cuts = [{0, size} for size in shape]
        for boxes in list(holds.values()) + [[b] for b in targets.values() if b is not None]:
            for box in boxes:
                for dim, (lo, hi) in enumerate(box):
                    cuts[dim].update((lo, hi))
        intervals = [list(zip(sorted(c)[:-1], sorted(c)[1:], strict=True)) for c in cuts]
        cells: list[Cell] = []
        for box in _product(intervals):
            needers = [m for m, target in targets.items() if target is not None and contains(target, box)]
            if not needers:
                continue
            holders = [m for m in group if any(contains(held, box) for held in holds[m])]
            receivers = tuple(m for m in needers if m not in holders)
            if not receivers:
                continue
            if not holders:
                raise AssertionError(f"{self.name}: no rank of group {group} holds {name}{box}, needed by {receivers}")
            by_owner: dict[int, list[int]] = {}
            for receiver in receivers:
                owner = holders[0]
                for candidate in chains[receiver]:
                    near = [h for h in holders if h in candidate]
                    if near:
                        owner = near[0]
                        break
                by_owner.setdefault(owner, []).append(receiver)
            for owner in sorted(by_owner):
                cells.append(Cell(name=name, box=box, owner=owner, receivers=tuple(by_owner[owner])))
        return _merge_rows(cells, holds)


def _product(intervals: list[list[tuple[int, int]]]) -> Iterable[Box]:
    if not intervals:
        yield ()
        return
    for first in intervals[0]:
        for rest in _product(intervals[1:]):
            yield (first, *rest)


def _merge_rows(cells: list[Cell], holds: dict[int, tuple[Box, ...]]) -> list[Cell]:
    """Join cells that touch along dim 0 with the same columns, owner and receivers, inside one box the owner holds
    (fewer, larger copies; a cell must stay inside one segment of the owner's storage)."""
    out: list[Cell] = []
    for cell in sorted(cells, key=lambda c: (c.box[1:], c.owner, c.receivers, c.box[0])):
        last = out[-1] if out else None
        if (
            last is not None
            and last.owner == cell.owner
            and last.receivers == cell.receivers
            and last.box[1:] == cell.box[1:]
            and last.box[0][1] == cell.box[0][0]
        ):
            merged = ((last.box[0][0], cell.box[0][1]), *cell.box[1:])
            if any(contains(held, merged) for held in holds[cell.owner]):
                out[-1] = Cell(last.name, merged, cell.owner, cell.receivers)
                continue
        out.append(cell)
    return out


def make_buckets(spec: ModelSpec, bucket_bytes: int | None, dtype_size: int, stages: int = 1) -> list[tuple[str, ...]]:
    """Runs of the model's (untied) tensors whose full bytes add up to at most ``bucket_bytes``; a larger tensor is a
    bucket of its own. ``None`` or 0: one bucket.

    With ``stages`` > 1 (pipeline-parallel training shards) the stages are interleaved by their share of bytes, so
    each bucket carries a similar slice of every stage and the members of a group spanning stages contribute alike
    (an all-gather pads every slot to the largest contribution).
    """
    tensors = unique_tensors(spec)
    if stages > 1:
        stage_of: dict[str, int] = {}
        for stage, placed in enumerate(stage_placement(spec, stages)):
            for key in placed:
                stage_of.setdefault(key, stage)
        # position of a tensor = share of its stage's decoder-layer bytes before it (embedding first, the rest last)
        totals = [0] * stages
        for tensor in tensors:
            if tensor.layer is not None:
                totals[stage_of[tensor.name]] += tensor.numel
        position, done = {}, [0] * stages
        for tensor in tensors:
            stage = stage_of[tensor.name]
            if tensor.layer is None:
                position[tensor.name] = (-1.0 if "embed" in tensor.name else 2.0, stage)
                continue
            position[tensor.name] = (done[stage] / max(totals[stage], 1), stage)
            done[stage] += tensor.numel
        tensors = sorted(tensors, key=lambda t: position[t.name])
    buckets: list[list[str]] = [[]]
    size = 0
    for tensor in tensors:
        nbytes = tensor.numel * dtype_size
        if bucket_bytes and buckets[-1] and size + nbytes > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(tensor.name)
        size += nbytes
    return [tuple(b) for b in buckets if b]
