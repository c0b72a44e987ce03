"""The resharding executor on torch.distributed: training shards in, this rank's generation weights out.

``Resharder(spec, groups, scheme)`` is built on every rank (collectively: it creates the process groups the scheme
needs, the same on all ranks). ``stream(shards)`` walks the model in buckets; for each bucket it runs the scheme's
steps (``exchange.Scheme``): generation tensors are views of the rank's own storage where they can be, else new
tensors with the rank's own part copied in (``program``: compiled once per bucket, step and storage layout, replayed
with one strided view per region and one batched copy per bucket); then one all-gather per group (into one flat
buffer whose own slot the rank packs in place, or straight into the generation tensor when the slots are its equal
slices; a broadcast when only one member contributes) and, where the plan has any, point-to-point sends; then it
yields ``(hf_name, tensor)`` and drops its references. Every rank must exhaust the stream, also a rank that yields
nothing (the collectives run inside it). ``load_into(shards, targets)`` is the same walk ending in one batched copy
per bucket into tensors the caller holds (an engine's own parameters).

Uneven contributions travel in equal padded slots (gloo has no uneven all-gather); ``stats.received_bytes`` counts
the payload (equal to the planner's bytes), ``stats.wire_bytes`` the padded slots. The backend is whatever
torch.distributed was initialised with: gloo on CPU tensors, NCCL on CUDA tensors.
"""

from __future__ import annotations

import json
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence

import torch
import torch.distributed as dist

from hybrid_engine.groups import HybridGroups, hybrid_groups
from hybrid_engine.layout import InferLayout, TrainLayout
from hybrid_engine.model_spec import ModelSpec
from hybrid_engine.reshard.exchange import Exchange, Gather, Scheme, make_buckets
from hybrid_engine.reshard.packing import pack_cells, unpack_cells
from hybrid_engine.reshard.program import BucketProgram, compile_bucket
from hybrid_engine.reshard.shards import LocalShards, box_shape, contains, fsdp_shards_from_state_dict, unique_tensors
from hybrid_engine.reshard.stats import MemoryTracker, PlannedBytes, ReshardStats, planned_bytes

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "Resharder",
    "ShardedWeights",
    "feeder_ranks",
    "feeder_resharder",
    "feeder_stream",
    "rollout_weight_stream",
    "spec_of",
    "stream_to_feeders",
]

DEFAULT_BUCKET_BYTES = 64 << 20
"""Full bytes of the tensors one bucket moves (a larger tensor is a bucket of its own)."""

_PROCESS_GROUPS: dict[tuple[int, ...], object] = {}
_FEEDER_RESHARDERS: dict[tuple, Resharder] = {}  # see feeder_resharder
_SPECS: dict[str, ModelSpec] = {}  # HF config (as JSON) -> its spec


def _all_gather_into(output: torch.Tensor, input_: torch.Tensor, group) -> None:
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(output, input_, group=group)


def _process_group(members: tuple[int, ...]):
    """The process group of ``members``; the world's is the default group."""
    if len(members) == dist.get_world_size():
        return None
    return _PROCESS_GROUPS[members]


def _create_process_groups(groups: Sequence[tuple[int, ...]]) -> None:
    """Create (once per process) the groups not yet made; every rank calls this with the same list."""
    world = dist.get_world_size()
    for members in groups:
        if len(members) in (1, world) or members in _PROCESS_GROUPS:
            continue
        _PROCESS_GROUPS[members] = dist.new_group(list(members))


class Resharder:
    """Streams one rank's generation weights out of its training shards under ``scheme`` (see ``exchange``).

    ``bucket_bytes``: full bytes of the tensors moved per round (None or 0: the whole model in one round); the
    executor's extra memory is about the generation share of one bucket plus its receive buffer.
    """

    def __init__(
        self,
        spec: ModelSpec,
        groups: HybridGroups,
        scheme: str,
        *,
        rank: int | None = None,
        bucket_bytes: int | None = DEFAULT_BUCKET_BYTES,
        feeders: Sequence[int] | None = None,
    ):
        if not dist.is_initialized():
            raise RuntimeError("Resharder needs torch.distributed to be initialised (gloo on CPU, nccl on GPU)")
        if dist.get_world_size() != groups.world_size:
            raise ValueError(f"layouts have {groups.world_size} ranks, torch.distributed has {dist.get_world_size()}")
        self.spec, self.groups = spec, groups
        self.scheme = Scheme(scheme, spec, groups, feeders)
        self.rank = dist.get_rank() if rank is None else rank
        self.bucket_bytes = bucket_bytes
        self.stats: ReshardStats | None = None
        self._p2p_cache: dict[int, tuple] = {}
        self._buckets: dict[int, list[tuple[str, ...]]] = {}  # element size -> buckets
        self._programs: dict[tuple, BucketProgram] = {}  # per (element size, bucket, step, layout token)
        self._layouts: dict[int, tuple[weakref.ref, int]] = {}  # id(shards) -> (the shards, layout token)
        self._signatures: dict[tuple, int] = {}  # segments of a layout -> its token
        self._shapes: dict[str, tuple[int, ...]] | None = None
        _create_process_groups(self.scheme.all_groups())

    @property
    def name(self) -> str:
        return self.scheme.name

    def target_box(self, name: str):
        """Where the tensor yielded as ``name`` sits in the full HF tensor (one (lo, hi) per dim)."""
        for step in reversed(range(len(self.scheme.steps))):
            box = self.scheme.target(step, self.rank, name)
            if box is not None:
                return box
        return None

    def planned(self, dtype_size: int) -> PlannedBytes:
        return planned_bytes(
            self.spec, self.groups, self.scheme.name, self.rank, dtype_size, tuple(sorted(self.scheme.feeders))
        )

    def reshard(self, shards: LocalShards) -> dict[str, torch.Tensor]:
        """All generation tensors at once (the stream, collected)."""
        return dict(self.stream(shards))

    # -- the stream ----------------------------------------------------------------------------------------------------
    def stream(self, shards: LocalShards) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(hf_name, generation tensor)`` bucket by bucket; see the module docstring."""
        for items in self._bucket_stream(shards):
            items.reverse()
            while items:
                yield items.pop()

    def load_into(self, shards: LocalShards, targets: Mapping[str, torch.Tensor]) -> None:
        """Copy this rank's generation tensors into ``targets`` (HF name -> a contiguous tensor of the generation
        shard's shape, such as an engine's own parameters): the hand-off into an engine whose weights are in reach.
        A bucket that needs nothing from other ranks is copied straight from the training storage into the targets
        (``BucketProgram.run_into``: no new tensors); the others are streamed and copied in. Names, shapes or
        layouts that differ from the generation shard's raise before anything moves."""
        self._check_targets(targets)
        with torch.no_grad():
            for items in self._bucket_stream(shards, targets):
                for name, tensor in items:
                    targets[name].copy_(tensor)

    def _check_targets(self, targets: Mapping[str, torch.Tensor]) -> None:
        expected = self._final_shapes()
        missing = sorted(set(expected) - set(targets))
        if missing:
            raise KeyError(f"rank {self.rank}: the targets lack {len(missing)} generation tensors: {missing[:5]}")
        wrong = [(n, tuple(targets[n].shape), s) for n, s in expected.items() if tuple(targets[n].shape) != s]
        if wrong:
            raise ValueError(f"rank {self.rank}: target shapes differ (name, target, generation shard): {wrong[:3]}")
        strided = [n for n in expected if not targets[n].is_contiguous()]
        if strided:
            raise ValueError(f"rank {self.rank}: targets must be contiguous; these are not: {strided[:3]}")

    def _final_shapes(self) -> dict[str, tuple[int, ...]]:
        if self._shapes is None:
            self._shapes = {name: box_shape(self.target_box(name)) for name in self.scheme.final_names(self.rank)}
        return self._shapes

    def _bucket_stream(
        self, shards: LocalShards, targets: Mapping[str, torch.Tensor] | None = None
    ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """The generation tensors of each bucket, as a list, after the bucket's collectives. With ``targets``, a
        bucket of a one-step scheme that needs no collective on this rank is written into them instead (and its
        list is empty)."""
        direct = targets is not None and len(self.scheme.steps) == 1
        self._check(shards)
        dtype, device = shards.dtype, shards.device
        element_size = dtype.itemsize
        stats = ReshardStats(scheme=self.scheme.name, rank=self.rank)
        self.stats = stats
        for step in self.scheme.steps:
            stats.phase(step.phase)
        memory = MemoryTracker(device)
        started = time.perf_counter()
        if element_size not in self._buckets:
            self._buckets[element_size] = make_buckets(
                self.spec, self.bucket_bytes, element_size, self.scheme.pipeline_stages
            )
        buckets = self._buckets[element_size]
        layout = self._layout_token(shards)
        stats.buckets = len(buckets)
        for number, bucket in enumerate(buckets):
            allocated = 0
            final: dict[str, torch.Tensor] = {}
            previous = shards
            for index, step in enumerate(self.scheme.steps):
                sources = shards if step.source == "shards" else previous
                tic = time.perf_counter()
                exchange = self.scheme.exchange(index, self.rank, bucket)
                toc = time.perf_counter()
                stats.plan_s += toc - tic
                program = self._program((element_size, number, index, layout), index, bucket, sources)
                if direct and not exchange.p2p and not exchange.gathers_of(self.rank):
                    program.run_into(sources, targets)
                    stats.generation_bytes += program.output_elements * element_size
                    stats.tensors += len(program.ops)
                    stats.phase(step.phase).assemble_s += time.perf_counter() - toc
                    outputs = None
                    break
                outputs, nbytes = program.run(sources, dtype, device)
                memory.alloc(nbytes)
                allocated += nbytes
                stats.phase(step.phase).assemble_s += time.perf_counter() - toc
                for gather in exchange.gathers_of(self.rank):
                    self._gather(gather, step.phase, sources, outputs, stats, memory, dtype, device)
                if exchange.p2p:
                    self._point_to_point(exchange, step.phase, sources, outputs, stats, memory, dtype, device)
                if step.final:
                    final.update(outputs.storage)
                previous = outputs
            items = [(name, final.pop(name)) for name in bucket if name in final]
            for _, tensor in items:
                stats.generation_bytes += tensor.numel() * element_size
            stats.tensors += len(items)
            stats.seconds += time.perf_counter() - started
            del final, previous, outputs
            yield items
            started = time.perf_counter()
            memory.free(allocated)
        stats.seconds += time.perf_counter() - started
        stats.peak_extra_bytes = memory.peak
        stats.peak_cuda_bytes = memory.cuda_peak()

    def _layout_token(self, shards: LocalShards) -> int:
        """A number for the storage layout of ``shards`` (its segments), worked out once per shards object."""
        entry = self._layouts.get(id(shards))
        if entry is not None and entry[0]() is shards:
            return entry[1]
        signature = tuple((name, tuple(segments)) for name, segments in shards.segments.items())
        token = self._signatures.setdefault(signature, len(self._signatures))
        if len(self._layouts) > 64:  # shards objects of earlier switches, gone
            self._layouts = {key: value for key, value in self._layouts.items() if value[0]() is not None}
        self._layouts[id(shards)] = (weakref.ref(shards), token)
        return token

    def _program(self, key: tuple, step: int, bucket: tuple[str, ...], sources: LocalShards) -> BucketProgram:
        """The compiled outputs of (step, bucket) for this layout; compiled again if the storage's strides moved."""
        program = self._programs.get(key)
        if program is None or not program.matches(sources):
            program = self._programs[key] = compile_bucket(self.scheme, step, self.rank, bucket, sources)
        return program

    def _check(self, shards: LocalShards) -> None:
        if shards.rank != self.rank:
            raise ValueError(f"shards of rank {shards.rank} given to the resharder of rank {self.rank}")
        self.scheme.check_shards(self.rank, shards)

    def _sync(self, device: torch.device) -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def _gather(self, gather: Gather, phase, sources, outputs, stats: ReshardStats, memory, dtype, device) -> None:
        # dtype and device come from the training shards: a step's sources may hold no tensor of this bucket
        timing = stats.phase(phase)
        me = gather.members.index(self.rank)
        lengths = gather.lengths
        group = _process_group(gather.members)
        element_size = torch.empty((), dtype=dtype).element_size()
        single = gather.single_source
        tic = time.perf_counter()
        direct = self._direct_output(gather, me, outputs) if single is None else None
        if direct is not None:
            # the all-gather writes straight into the generation tensor, whose own slot already holds this rank's
            # shard: no buffer, no unpacking (the paper's in-place all-gather)
            width = lengths[0]
            timing.all_gathers += 1
            timing.in_place_gathers += 1
            self._sync(device)
            toc = time.perf_counter()
            timing.pack_s += toc - tic
            _all_gather_into(direct, direct.narrow(0, me * width, width), group)
            self._sync(device)
            timing.comm_s += time.perf_counter() - toc
            stats.add_wire(phase, width * (len(gather.members) - 1) * element_size)
            received = {}
            for i, cells in enumerate(gather.cells):
                if i != me:
                    received[cells[0].name] = received.get(cells[0].name, 0) + cells[0].numel
            stats.add_received(phase, received, element_size)
            return
        if single is not None:
            buffer = torch.empty(lengths[single], dtype=dtype, device=device)
            if me == single:
                pack_cells(buffer, gather.cells[me], sources)
            slots = {single: buffer}
        else:
            width = max(lengths)
            buffer = torch.empty(width * len(gather.members), dtype=dtype, device=device)
            pack_cells(buffer.narrow(0, me * width, lengths[me]), gather.cells[me], sources)
            slots = {i: buffer.narrow(0, i * width, lengths[i]) for i in range(len(gather.members))}
        nbytes = buffer.numel() * element_size
        memory.alloc(nbytes)
        self._sync(device)
        toc = time.perf_counter()
        timing.pack_s += toc - tic
        if single is not None:
            dist.broadcast(buffer, src=gather.members[single], group=group)
            timing.broadcasts += 1
            wire = 0 if me == single else lengths[single]
        else:
            _all_gather_into(buffer, buffer.narrow(0, me * width, width), group)
            timing.all_gathers += 1
            wire = width * (len(gather.members) - 1)
        self._sync(device)
        tic = time.perf_counter()
        timing.comm_s += tic - toc
        stats.add_wire(phase, wire * element_size)
        for i, flat in slots.items():
            if i != me:
                stats.add_received(phase, unpack_cells(flat, gather.cells[i], outputs, self.rank), element_size)
        self._sync(device)
        timing.unpack_s += time.perf_counter() - tic
        del buffer, slots
        memory.free(nbytes)

    def _direct_output(self, gather: Gather, me: int, outputs: LocalShards) -> torch.Tensor | None:
        """The flat generation tensor when member i's one cell is exactly its i-th equal slice (else None)."""
        lengths = gather.lengths
        if len(set(lengths)) != 1 or any(len(cells) != 1 for cells in gather.cells):
            return None
        name = gather.cells[0][0].name
        if any(cells[0].name != name for cells in gather.cells) or name not in outputs.storage:
            return None
        target = outputs.segments[name][0].box
        row = 1
        for lo, hi in target[1:]:
            row *= hi - lo
        for i, cells in enumerate(gather.cells):
            box = cells[0].box
            if box[1:] != target[1:] or not contains(target, box) or (box[0][0] - target[0][0]) * row != i * lengths[0]:
                return None
        tensor = outputs.storage[name]
        if tensor.numel() != lengths[0] * len(gather.members) or not tensor.is_contiguous():
            return None
        return tensor.view(-1)

    def _p2p_plan(self, exchange: Exchange) -> tuple[list, list]:
        key = id(exchange)
        if key not in self._p2p_cache:
            sends = [c for c in exchange.p2p if c.owner == self.rank]
            recvs = [c for c in exchange.p2p if self.rank in c.receivers]
            self._p2p_cache[key] = (exchange, sends, recvs)  # the exchange is kept so its id stays unique
        return self._p2p_cache[key][1:]

    def _point_to_point(self, exchange: Exchange, phase, sources, outputs, stats, memory, dtype, device) -> None:
        """Each owned cell goes to each of its receivers by isend; each missing cell comes by irecv. A cell that is a
        contiguous block of the source is sent from place; one that is contiguous in the output lands in place."""
        timing = stats.phase(phase)
        element_size = torch.empty((), dtype=dtype).element_size()
        sends, recvs = self._p2p_plan(exchange)
        tic = time.perf_counter()
        ops, landing, extra = [], [], 0
        for cell in sends:
            view = sources.extract(cell.name, cell.box)
            if not view.is_contiguous():
                view = view.contiguous()
                extra += view.numel() * element_size
            ops += [dist.P2POp(dist.isend, view, receiver) for receiver in cell.receivers]
        received: dict[str, int] = {}
        for cell in recvs:
            region = outputs.extract(cell.name, cell.box)
            if region.is_contiguous():
                buffer = region
            else:
                buffer = torch.empty(region.shape, dtype=dtype, device=device)
                extra += buffer.numel() * element_size
                landing.append((region, buffer))
            ops.append(dist.P2POp(dist.irecv, buffer, cell.owner))
            received[cell.name] = received.get(cell.name, 0) + cell.numel
        memory.alloc(extra)
        self._sync(device)
        toc = time.perf_counter()
        timing.pack_s += toc - tic
        if ops:
            for request in dist.batch_isend_irecv(ops):
                request.wait()
        timing.p2p_rounds += 1
        timing.p2p_messages += len(ops)
        self._sync(device)
        tic = time.perf_counter()
        timing.comm_s += tic - toc
        for region, buffer in landing:
            region.copy_(buffer)
        stats.add_received(phase, received, element_size)
        stats.add_wire(phase, sum(received.values()) * element_size)
        self._sync(device)
        timing.unpack_s += time.perf_counter() - tic
        del ops, landing
        memory.free(extra)


def stream_to_feeders(
    state_dict: Mapping[str, torch.Tensor],
    spec: ModelSpec,
    feeders: Sequence[int],
    *,
    bucket_bytes: int | None = DEFAULT_BUCKET_BYTES,
    stats_out: list | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Full HF tensors on the ``feeders`` ranks only, from an FSDP2 module's ``state_dict()`` (DTensors, Shard(0)).

    The weight hand-off of a rollout that one rank per replica feeds (the CPU ``hf`` rollout): instead of every rank
    all-gathering every tensor (``full_tensor()``), each rank sends its rows to the feeders in one all-to-all per
    bucket. Every rank must exhaust the iterator; non-feeders yield nothing. ``stats_out`` gets the ReshardStats.
    Needs no new process group (runs on the default group), so ranks may call it at any time together.

    Everything that can refuse the state dict (names the spec does not know, placements other than ``Shard(0)`` on a
    1-D mesh over all ranks, local shapes) is checked here, before any collective: a caller can fall back to its own
    path on ``ValueError``/``KeyError``/``TypeError``/``NotImplementedError`` and no rank is left waiting. The checks
    see the same global shapes and placements on every rank, so every rank decides alike.
    """
    world = dist.get_world_size()
    known = {tensor.name for tensor in unique_tensors(spec)}
    tied = {"lm_head.weight"} if spec.arch.tie_word_embeddings else set()
    unknown = sorted(set(state_dict) - known - tied)
    if unknown:
        raise KeyError(f"the state dict has tensors the model spec does not: {unknown[:5]}")
    shards = fsdp_shards_from_state_dict(state_dict, spec)
    if any(tensor.device_mesh.size() != world for tensor in state_dict.values()):  # all DTensors after the check
        raise ValueError(f"the FSDP mesh does not span the {world} ranks of the default process group")
    groups = hybrid_groups(TrainLayout(dp=world), InferLayout(tp=1).resolve(world), fsdp=True)
    resharder = feeder_resharder(spec, groups, tuple(feeders), bucket_bytes)
    return feeder_stream(resharder, shards, stats_out)


def feeder_stream(
    resharder: Resharder, shards: LocalShards, stats_out: list | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """``resharder.stream(shards)``, then the ReshardStats (with the planner's bytes) appended to ``stats_out``."""
    yield from resharder.stream(shards)
    if stats_out is not None:
        stats = resharder.stats
        stats.planned = resharder.planned(torch.empty((), dtype=shards.dtype).element_size())
        stats_out.append(stats)


def feeder_resharder(
    spec: ModelSpec, groups: HybridGroups, feeders: tuple[int, ...], bucket_bytes: int | None
) -> Resharder:
    """One ``gather_to_feeders`` resharder per (model, training groups, rank, feeders, bucket), kept between weight
    syncs: its buckets, exchange plans and copy programs are worked out on the first sync only. ``groups``: FSDP
    groups (``fsdp=True``) for FSDP2 shards, Megatron groups (tp/pp/dp) for Megatron-style shards."""
    key = (spec, groups, dist.get_rank(), feeders, bucket_bytes)
    resharder = _FEEDER_RESHARDERS.get(key)
    if resharder is None:
        if len(_FEEDER_RESHARDERS) >= 4:
            _FEEDER_RESHARDERS.pop(next(iter(_FEEDER_RESHARDERS)))
        resharder = Resharder(spec, groups, "gather_to_feeders", feeders=feeders, bucket_bytes=bucket_bytes)
        _FEEDER_RESHARDERS[key] = resharder
    return resharder


def spec_of(hf_config: Mapping) -> ModelSpec:
    """The model spec of an HF config dict, built once per distinct config."""
    key = json.dumps(dict(hf_config), sort_keys=True, default=str)
    if key not in _SPECS:
        from hybrid_engine.model_spec import arch_from_config, build_spec

        _SPECS[key] = build_spec(arch_from_config(dict(hf_config), str(hf_config.get("_name_or_path") or "actor")))
    return _SPECS[key]


def feeder_ranks(world_size: int, rollout_world_size: int) -> list[int]:
    """The first rank of each rollout replica (``rollout_rank == 0``): the ranks that feed a rollout server."""
    if rollout_world_size < 1 or world_size % rollout_world_size:
        raise ValueError(f"rollout world size {rollout_world_size} must divide the world size {world_size}")
    return list(range(0, world_size, rollout_world_size))


def rollout_weight_stream(
    state_dict: Mapping[str, torch.Tensor],
    *,
    rollout_world_size: int,
    hf_config: Mapping | None = None,
    spec: ModelSpec | None = None,
    bucket_bytes: int | None = DEFAULT_BUCKET_BYTES,
    stats_out: list | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """The weight hand-off of verl's colocated rollout, through the resharder: ``stream_to_feeders`` with the first
    rank of every rollout replica as feeder. ``hf_config``: the model's config dict (``hf_config.to_dict()``), or give
    ``spec``. Every rank must exhaust the iterator (the collectives run inside it)."""
    if spec is None:
        if hf_config is None:
            raise ValueError("rollout_weight_stream needs hf_config or spec")
        spec = spec_of(hf_config)
    feeders = feeder_ranks(dist.get_world_size(), rollout_world_size)
    return stream_to_feeders(state_dict, spec, feeders, bucket_bytes=bucket_bytes, stats_out=stats_out)


class ShardedWeights:
    """verl's per-tensor weight iterable with the FSDP2 state dict kept beside it.

    Iterating it is verl's own path (``fallback``: every rank all-gathers every tensor with ``full_tensor()``); a
    rollout that knows this class calls ``rollout_weight_stream(weights.state_dict, hf_config=weights.hf_config,
    ...)`` instead and never touches ``fallback`` (a lazy generator: nothing is gathered unless it is iterated).
    """

    def __init__(self, state_dict: Mapping[str, torch.Tensor], fallback, hf_config: Mapping | None = None):
        self.state_dict = state_dict
        self.fallback = fallback
        self.hf_config = hf_config

    def __iter__(self):
        return iter(self.fallback)
