"""Bytes each GPU receives when the actor switches from its training layout to its generation layout.

Byte counting (the resharding executor counts at its collectives and must find these exact numbers):

    received(rank) = bytes of the rank's TARGET that the rank does not already hold in its training shard.

Every distinct byte a rank needs and lacks arrives exactly once; its own shard is never counted, nor are copies of a
replicated tensor (a norm, a router) it already holds. Elements are counted from the real tensor shapes (tied lm_head
once; padding never) and multiplied by the bytes of ``dtype``. Targets per scheme:

- ``hybridflow`` (3D-HybridEngine, Megatron-style training shards): the generation shard, i.e. for generation stage
  pi and generation TP rank tau, every tensor of training stages pi*k_p .. pi*k_p+k_p-1 sliced as TP rank tau of t_g.
  It is the union of the micro-DP group's training shards (the balanced split below composes), so one all-gather
  over distinct pieces per micro-DP group moves it; with infer.ep < train.ep a second gather over
  ``expert_gather_group`` adds the experts of the wider generation EP shard.
- ``tp_group_gather`` (HybridFlow-V; verl's Megatron path): the full model. Phases: all-gather inside the training
  TP (and EP) group of the rank's stage, then broadcast of the other stages' tensors across the pipeline. What a
  rank receives does not depend on the generation layout at all (verl's engines slice what they need from the full
  model), so this is also the count for a layout the HybridFlow scheme cannot take (``placement="verl"`` groups,
  e.g. generation TP above training TP): there it is the scheme that runs.
- ``full_gather`` (DeepSpeed-Chat; verl FSDP ``full_tensor()``): the full model, from training shards that are FSDP2
  ``Shard(0)`` over all N ranks (whatever the training layout; this is the paper's (N-1)/N M reference).
- ``fsdp_to_tp`` (zero-redundancy FSDP -> TP t_g): the generation shard of generation TP rank tau = rank // (N/t_g),
  from FSDP2 ``Shard(0)`` training shards. Column-parallel slices are unions of N/t_g consecutive shards (one
  all-gather among those ranks when dim 0 divides N); row-parallel slices, replicated tensors and experts come in an
  all-to-all from the ranks holding their rows.

Splits. TP splits a tensor's ``tp_dim`` by units (heads for attention, rows otherwise) with the balanced rule
``[floor(r*n/T), floor((r+1)*n/T))`` (``model_spec.units_range``); fewer units than ranks (GQA kv heads) replicate
one unit per rank. EP splits experts the same way. FSDP2 ``Shard(0)`` follows ``torch.chunk``: ceil(n/N) rows per
rank until the rows run out (later ranks may hold nothing). Pipeline stages take layers ``[floor(s*L/p),
floor((s+1)*L/p))``; the embedding sits on the first stage, the final norm and lm_head on the last (a tied lm_head is
a copy of the embedding on the last stage when p > 1).

Under verl's placement (``HybridGroups.placement == "verl"``) the schemes are ``tp_group_gather`` and ``full_gather``
(Megatron) or ``full_gather`` (FSDP); ``generation_shard_peak`` gives the generation weights each GPU then holds.

Times are bandwidth-bound estimates: for each phase the largest per-GPU bytes over the bandwidth of the link its
groups span (NVLink when every group stays inside a node, the network otherwise), phases in sequence, no latency.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache

import numpy as np

from hybrid_engine.groups import HybridGroups
from hybrid_engine.model_spec import ModelSpec, TensorSpec, units_range
from hybrid_engine.plan.settings import ClusterSpec

__all__ = [
    "SCHEMES",
    "PhaseBytes",
    "SchemeBytes",
    "compute_bytes",
    "expert_counts",
    "fraction_text",
    "fsdp_chunk",
    "generation_shard_peak",
    "received_by_tensor",
    "stage_bounds",
    "stage_placement",
]

SCHEMES = {
    "hybridflow": ("(d_g-1)/(t*p) * M", "micro-DP all-gather (3D-HybridEngine)"),
    "tp_group_gather": ("(t*p-1)/(t*p) * M", "TP-group gather per stage + pipeline broadcast (verl Megatron)"),
    "full_gather": ("(N-1)/N * M", "every GPU gathers the full model from FSDP shards (verl FSDP full_tensor)"),
    "fsdp_to_tp": ("(N/t_g-1)/N * M col.", "FSDP Shard(0) -> generation TP t_g, zero redundancy"),
}


@dataclass(frozen=True, kw_only=True, slots=True)
class PhaseBytes:
    name: str
    link: str
    """nvlink or network."""
    max_bytes: int
    seconds: float


@dataclass(kw_only=True)
class SchemeBytes:
    """Per-GPU received bytes of one resharding scheme."""

    scheme: str
    received: np.ndarray = field(repr=False)
    """Bytes received by each rank (index = rank)."""
    model_bytes: int
    peak_param_bytes: int
    """Largest parameter bytes one GPU holds for generation at once (Table 2's last column)."""
    phases: list[PhaseBytes]

    @property
    def max(self) -> int:
        return int(self.received.max())

    @property
    def min(self) -> int:
        return int(self.received.min())

    @property
    def total(self) -> int:
        return int(self.received.sum())

    @property
    def time_s(self) -> float:
        return sum(phase.seconds for phase in self.phases)

    @property
    def fraction(self) -> Fraction:
        """max received / M as an exact fraction."""
        return Fraction(self.max, self.model_bytes) if self.model_bytes else Fraction(0)

    def to_dict(self) -> dict:
        formula, description = SCHEMES[self.scheme]
        return {
            "description": description,
            "table2_formula": formula,
            "per_gpu_received_bytes": {"max": self.max, "min": self.min, "mean": float(self.received.mean())},
            "per_gpu_fraction_of_model": fraction_text(self.fraction),
            "total_received_bytes": self.total,
            "peak_param_bytes": self.peak_param_bytes,
            "time_s": self.time_s,
            "phases": [
                {"name": p.name, "link": p.link, "max_bytes": p.max_bytes, "seconds": p.seconds} for p in self.phases
            ],
        }


def fraction_text(value: Fraction, max_denominator: int = 4096) -> str:
    """``7/32 M`` when exact with a small denominator, else ``0.2188 M``."""
    if value == 0:
        return "0 M"
    if value.denominator <= max_denominator:
        return f"{value.numerator}/{value.denominator} M" if value.denominator != 1 else f"{value.numerator} M"
    return f"{float(value):.4f} M"


# ---------------------------------------------------------------------------------------------------------------------
# placement
# ---------------------------------------------------------------------------------------------------------------------


def stage_bounds(num_layers: int, stages: int) -> list[int]:
    """First layer of each stage (and the end): stage s holds layers [b[s], b[s+1])."""
    return [s * num_layers // stages for s in range(stages + 1)]


def stage_placement(spec: ModelSpec, stages: int) -> list[dict[str, TensorSpec]]:
    """Tensors of each pipeline stage keyed by their unique name (a tied lm_head copy keys as the embedding)."""
    bounds = stage_bounds(spec.arch.num_hidden_layers, stages)
    layer_stage = {}
    for s in range(stages):
        for layer in range(bounds[s], bounds[s + 1]):
            layer_stage[layer] = s
    placed: list[dict[str, TensorSpec]] = [{} for _ in range(stages)]
    for tensor in spec.tensors:
        if tensor.layer is not None:
            placed[layer_stage[tensor.layer]][tensor.name] = tensor
        elif tensor.tied_to is not None:
            if stages > 1:
                placed[-1][tensor.tied_to] = tensor
        elif tensor.name == "model.embed_tokens.weight":
            placed[0][tensor.name] = tensor
        else:
            placed[-1][tensor.name] = tensor
    return placed


def fsdp_chunk(rows: int, world: int, ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """FSDP2 Shard(0) rows of each rank as [start, stop) arrays (torch.chunk: ceil(rows/world) per rank)."""
    size = -(-rows // world)
    start = np.minimum(ranks * size, rows)
    stop = np.minimum(start + size, rows)
    return start, stop


# ---------------------------------------------------------------------------------------------------------------------
# per-tensor element counts (cached by the tensor's shape and split, so 61 identical layers cost one)
# ---------------------------------------------------------------------------------------------------------------------


def _signature(tensor: TensorSpec) -> tuple:
    return (tensor.shape, tensor.tp_dim, tensor.tp_parts, tensor.ep_dim)


@lru_cache(maxsize=4096)
def _slice_table(signature: tuple, t: int, t_g: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(own[t_i], overlap[t_i], gen[tau]) elements along all experts, for one tensor signature.

    own: what training TP rank t_i of t holds; gen: what generation TP rank tau of t_g needs; overlap: the part of
    own inside the gen shard of tau = t_i // (t/t_g) (HybridFlow's mapping; zeros when t_g does not divide t).
    """
    shape, tp_dim, parts, _ = signature
    numel = int(np.prod(shape, dtype=np.int64))
    k_t = t // t_g if t % t_g == 0 else 0
    if tp_dim is None:
        full = np.full(t, numel, dtype=np.int64)
        return full, full, np.full(t_g, numel, dtype=np.int64)
    per_unit_elems = numel // shape[tp_dim]
    own, overlap, gen = np.zeros(t, np.int64), np.zeros(t, np.int64), np.zeros(t_g, np.int64)
    for units, size in parts:
        for tau in range(t_g):
            lo, hi = units_range(units, t_g, tau)
            gen[tau] += (hi - lo) * size
        for t_i in range(t):
            lo, hi = units_range(units, t, t_i)
            own[t_i] += (hi - lo) * size
            if k_t:
                g_lo, g_hi = units_range(units, t_g, t_i // k_t)
                overlap[t_i] += max(0, min(hi, g_hi) - max(lo, g_lo)) * size
    return own * per_unit_elems, overlap * per_unit_elems, gen * per_unit_elems


def _experts(tensor: TensorSpec) -> int:
    return tensor.shape[tensor.ep_dim] if tensor.ep_dim is not None else 0


def expert_counts(experts: int, parts: int) -> np.ndarray:
    return np.array([hi - lo for lo, hi in (units_range(experts, parts, r) for r in range(parts))], dtype=np.int64)


# ---------------------------------------------------------------------------------------------------------------------
# schemes
# ---------------------------------------------------------------------------------------------------------------------


def _link(spans: bool) -> str:
    return "network" if spans else "nvlink"


def _phase(name: str, spans: bool, values: np.ndarray, cluster: ClusterSpec) -> PhaseBytes:
    link = _link(spans)
    bandwidth = cluster.network_GBps if spans else cluster.nvlink_GBps
    max_bytes = int(values.max()) if values.size else 0
    return PhaseBytes(name=name, link=link, max_bytes=max_bytes, seconds=max_bytes / (bandwidth * 1e9))


def _spans(members: np.ndarray, gpus_per_node: int) -> bool:
    """members: (groups, size) ranks; True when any group has ranks on two nodes."""
    nodes = members // gpus_per_node
    return bool(np.any(nodes.min(axis=1) != nodes.max(axis=1)))


def compute_bytes(
    spec: ModelSpec, groups: HybridGroups, cluster: ClusterSpec, dtype_size: int, schemes: list[str] | None = None
) -> dict[str, SchemeBytes]:
    """Per-GPU received bytes of each applicable scheme (Megatron layouts: hybridflow, tp_group_gather, full_gather;
    FSDP layouts: fsdp_to_tp, full_gather)."""
    if schemes is None:
        if groups.fsdp:
            schemes = ["fsdp_to_tp", "full_gather"] if groups.hybridflow else ["full_gather"]
        else:
            schemes = ["hybridflow", "tp_group_gather", "full_gather"] if groups.hybridflow else [
                "tp_group_gather", "full_gather"]
    needs_mapping = {"hybridflow", "fsdp_to_tp"} & set(schemes)
    if needs_mapping and not groups.hybridflow:
        raise ValueError(f"{sorted(needs_mapping)} need HybridFlow's placement; these groups have verl's")
    out = {}
    model_elems = sum(t.numel for t in spec.tensors if t.tied_to is None)
    for scheme in schemes:
        if scheme == "full_gather":
            out[scheme] = _full_gather(spec, groups, cluster, dtype_size, model_elems)
        elif scheme == "fsdp_to_tp":
            out[scheme] = _fsdp_to_tp(spec, groups, cluster, dtype_size, model_elems)
        elif scheme in ("hybridflow", "tp_group_gather"):
            out[scheme] = _megatron_scheme(scheme, spec, groups, cluster, dtype_size, model_elems)
        else:
            raise ValueError(f"unknown scheme {scheme!r}; choose from {list(SCHEMES)}")
    return out


@dataclass(kw_only=True)
class _StageTables:
    """Elements per (stage, TP rank) of the training shards and per (gen stage, gen TP rank) of generation shards.

    ``*_d``: dense tensors (all of them); ``*_e``: expert tensors, per expert (multiply by the experts held).
    """

    own_d: np.ndarray
    own_e: np.ndarray
    ovl_d: np.ndarray
    ovl_e: np.ndarray
    gen_d: np.ndarray
    gen_e: np.ndarray
    stage_full_d: np.ndarray
    stage_full_e: np.ndarray
    experts: int


def stage_tables(spec: ModelSpec, groups: HybridGroups) -> _StageTables:
    """Training and generation shard sizes (elements) for Megatron-style (t, p) -> (t_g, p_g).

    Generation stages are placed on their own (``stage_placement(spec, p_g)``): with p_g | p that is exactly the
    union of training stages pi*k_p .. pi*k_p+k_p-1, and it stays right when p_g does not divide p.
    """
    t, p, t_g, p_g = groups.t, groups.p, groups.t_g, groups.p_g
    placed = stage_placement(spec, p)
    own_d, own_e = np.zeros((p, t), np.int64), np.zeros((p, t), np.int64)
    ovl_d, ovl_e = np.zeros((p, t), np.int64), np.zeros((p, t), np.int64)
    gen_d, gen_e = np.zeros((p_g, t_g), np.int64), np.zeros((p_g, t_g), np.int64)
    full_d, full_e = np.zeros(p, np.int64), np.zeros(p, np.int64)
    experts = 0
    for s, tensors in enumerate(placed):
        for tensor in tensors.values():
            own, ovl, _ = _slice_table(_signature(tensor), t, t_g)
            n_exp = _experts(tensor)
            if n_exp:
                experts = n_exp
                own_e[s] += own // n_exp
                ovl_e[s] += ovl // n_exp
                full_e[s] += tensor.numel // n_exp
            else:
                own_d[s] += own
                ovl_d[s] += ovl
                full_d[s] += tensor.numel
    for pi, needed in enumerate(stage_placement(spec, p_g)):
        for tensor in needed.values():
            _, _, gen = _slice_table(_signature(tensor), t, t_g)
            n_exp = _experts(tensor)
            if n_exp:
                gen_e[pi] += gen // n_exp
            else:
                gen_d[pi] += gen
    return _StageTables(
        own_d=own_d,
        own_e=own_e,
        ovl_d=ovl_d,
        ovl_e=ovl_e,
        gen_d=gen_d,
        gen_e=gen_e,
        stage_full_d=full_d,
        stage_full_e=full_e,
        experts=experts,
    )


def _megatron_scheme(
    scheme: str, spec: ModelSpec, groups: HybridGroups, cluster: ClusterSpec, dtype_size: int, model_elems: int
) -> SchemeBytes:
    tables = stage_tables(spec, groups)
    a = groups.arrays
    stage, tp, ep = a["stage"], a["tp"], a["ep"]
    experts = tables.experts
    own_count = expert_counts(experts, groups.ep)[ep] if experts else np.zeros_like(ep)
    own = tables.own_d[stage, tp] + tables.own_e[stage, tp] * own_count
    gpn = cluster.gpus_per_node
    if scheme == "hybridflow":
        gen_ep = ep // groups.k_e
        gen_count = expert_counts(experts, groups.ep_g)[gen_ep] if experts else np.zeros_like(ep)
        pi, tau = a["gen_pp"], a["gen_tp"]
        gen = tables.gen_d[pi, tau] + tables.gen_e[pi, tau] * gen_count
        overlap = tables.ovl_d[stage, tp] + tables.ovl_e[stage, tp] * own_count
        received = (gen - overlap) * dtype_size
        expert_part = tables.gen_e[pi, tau] * (gen_count - own_count) * dtype_size
        phases = [
            _phase("micro-DP all-gather", groups.spans_nodes("micro_dp", gpn) > 0, received - expert_part, cluster)
        ]
        if groups.k_e > 1:
            first = (ep // groups.k_e) * groups.k_e
            members = groups.rank_of(
                a["edp"][:, None] * groups.ep + first[:, None] + np.arange(groups.k_e)[None, :],
                stage[:, None],
                tp[:, None],
            )
            phases.append(_phase("expert all-gather", _spans(np.asarray(members), gpn), expert_part, cluster))
        peak = int(gen.max()) * dtype_size
    else:  # tp_group_gather
        full_experts = experts
        stage_full = tables.stage_full_d[stage] + tables.stage_full_e[stage] * full_experts
        received = (model_elems - own) * dtype_size
        within = (stage_full - own) * dtype_size
        tp_members = groups.rank_of(a["data"][:, None], stage[:, None], np.arange(groups.t)[None, :])
        spans_within = _spans(np.asarray(tp_members), gpn)
        if groups.ep > 1:
            edp = a["edp"]
            ep_members = groups.rank_of(
                edp[:, None] * groups.ep + np.arange(groups.ep)[None, :], stage[:, None], tp[:, None]
            )
            spans_within = spans_within or _spans(np.asarray(ep_members), gpn)
        pp_members = groups.rank_of(a["data"][:, None], np.arange(groups.p)[None, :], tp[:, None])
        phases = [
            _phase("TP/EP all-gather in stage", spans_within, within, cluster),
            _phase("pipeline broadcast", _spans(np.asarray(pp_members), gpn), received - within, cluster),
        ]
        peak = model_elems * dtype_size
    return SchemeBytes(
        scheme=scheme,
        received=received,
        model_bytes=model_elems * dtype_size,
        peak_param_bytes=peak,
        phases=phases,
    )


def generation_shard_peak(spec: ModelSpec, groups: HybridGroups, dtype_size: int) -> int:
    """The largest generation shard one GPU holds, in bytes: its generation stage's tensors sliced as its generation
    TP rank (experts: the fullest generation EP rank's share). Equal to hybridflow's ``peak_param_bytes``; for any
    placement (verl's too), since it depends on the generation layout only."""
    if groups.fsdp:  # the whole model sliced by t_g (FSDP runs generate with infer.pp = 1)
        need = np.zeros(groups.t_g, np.int64)
        for signature, count in _unique_tensors(spec).items():
            need += _slice_table(signature, groups.t_g, groups.t_g)[2] * count
        return int(need.max()) * dtype_size
    tables = stage_tables(spec, groups)
    most = int(expert_counts(tables.experts, groups.ep_g).max()) if tables.experts else 0
    return int((tables.gen_d + tables.gen_e * most).max()) * dtype_size


def _unique_tensors(spec: ModelSpec) -> dict[tuple, int]:
    """Distinct tensor signatures with their multiplicity (tied copies excluded)."""
    counts: dict[tuple, int] = {}
    for tensor in spec.tensors:
        if tensor.tied_to is None:
            counts[_signature(tensor)] = counts.get(_signature(tensor), 0) + 1
    return counts


def _full_gather(
    spec: ModelSpec, groups: HybridGroups, cluster: ClusterSpec, dtype_size: int, model_elems: int
) -> SchemeBytes:
    world = groups.world_size
    ranks = np.arange(world, dtype=np.int64)
    own = np.zeros(world, np.int64)
    for (shape, *_), count in _unique_tensors(spec).items():
        start, stop = fsdp_chunk(shape[0], world, ranks)
        own += (stop - start) * (int(np.prod(shape[1:], dtype=np.int64)) * count)
    received = (model_elems - own) * dtype_size
    phase = _phase("all-gather over all ranks", cluster.nnodes > 1 and world > cluster.gpus_per_node, received, cluster)
    return SchemeBytes(
        scheme="full_gather",
        received=received,
        model_bytes=model_elems * dtype_size,
        peak_param_bytes=model_elems * dtype_size,
        phases=[phase],
    )


def _fsdp_to_tp(
    spec: ModelSpec, groups: HybridGroups, cluster: ClusterSpec, dtype_size: int, model_elems: int
) -> SchemeBytes:
    world, t_g = groups.world_size, groups.t_g
    k_t = world // t_g
    ranks = np.arange(world, dtype=np.int64)
    tau = ranks // k_t
    need = np.zeros(world, np.int64)
    gather_part = np.zeros(world, np.int64)  # column-parallel tensors: the micro-group all-gather
    other_part = np.zeros(world, np.int64)  # row-parallel, replicated, experts: the all-to-all
    for signature, count in _unique_tensors(spec).items():
        shape, tp_dim, parts, _ = signature
        rows = shape[0]
        row_elems = int(np.prod(shape[1:], dtype=np.int64))
        start, stop = fsdp_chunk(rows, world, ranks)
        _, _, gen = _slice_table(signature, t_g, t_g)  # gen[tau] for t = t_g: own == gen
        needed = gen[tau]
        if tp_dim == 0:
            held = np.zeros(world, np.int64)
            offset = 0
            for units, size in parts:
                bounds = np.array([units_range(units, t_g, r) for r in range(t_g)], dtype=np.int64)
                lo = offset + bounds[tau, 0] * size
                hi = offset + bounds[tau, 1] * size
                held += np.maximum(0, np.minimum(hi, stop) - np.maximum(lo, start))
                offset += units * size
            held *= row_elems
            gather_part += (needed - held) * count
        else:
            held = (stop - start) * (needed // rows)
            other_part += (needed - held) * count
        need += needed * count
    received = (gather_part + other_part) * dtype_size
    micro_members = ranks.reshape(-1, k_t)
    phases = [
        _phase(
            "column all-gather (N/t_g ranks)",
            _spans(micro_members, cluster.gpus_per_node),
            gather_part * dtype_size,
            cluster,
        ),
        _phase(
            "row/replicated all-to-all",
            cluster.nnodes > 1 and world > cluster.gpus_per_node,
            other_part * dtype_size,
            cluster,
        ),
    ]
    return SchemeBytes(
        scheme="fsdp_to_tp",
        received=received,
        model_bytes=model_elems * dtype_size,
        peak_param_bytes=int(need.max()) * dtype_size,
        phases=phases,
    )


def received_by_tensor(
    spec: ModelSpec, groups: HybridGroups, rank: int, scheme: str, dtype_size: int
) -> dict[str, int]:
    """Bytes ``rank`` receives per tensor under ``scheme`` (unique names; a tied lm_head counts as the embedding).

    The sum over tensors equals ``compute_bytes(...)[scheme].received[rank]``; a resharding executor can compare
    its collectives with this tensor by tensor.
    """
    data, stage, tp, ep = groups.train_coords(rank)
    out: dict[str, int] = {}
    if scheme in ("full_gather", "fsdp_to_tp"):
        world, ranks = groups.world_size, np.array([rank])
        tau = rank // (world // groups.t_g)
        for tensor in spec.tensors:
            if tensor.tied_to is not None:
                continue
            start, stop = (int(v[0]) for v in fsdp_chunk(tensor.shape[0], world, ranks))
            row_elems = tensor.numel // tensor.shape[0]
            if scheme == "full_gather":
                out[tensor.name] = (tensor.numel - (stop - start) * row_elems) * dtype_size
                continue
            needed = int(_slice_table(_signature(tensor), groups.t_g, groups.t_g)[2][tau])
            if tensor.tp_dim == 0:
                held, offset = 0, 0
                for units, size in tensor.tp_parts:
                    lo, hi = units_range(units, groups.t_g, tau)
                    held += max(0, min(offset + hi * size, stop) - max(offset + lo * size, start))
                    offset += units * size
                held *= row_elems
            else:
                held = (stop - start) * (needed // tensor.shape[0])
            out[tensor.name] = (needed - held) * dtype_size
        return out
    placed = stage_placement(spec, groups.p)
    own_stage = placed[stage]
    if scheme == "tp_group_gather":
        for tensor in spec.tensors:
            if tensor.tied_to is not None:
                continue
            held = 0
            if tensor.name in own_stage:
                x = own_stage[tensor.name]
                held = int(_slice_table(_signature(x), groups.t, groups.t_g)[0][tp])
                if x.ep_dim is not None:
                    held = held // x.shape[x.ep_dim] * int(expert_counts(x.shape[x.ep_dim], groups.ep)[ep])
            out[tensor.name] = (tensor.numel - held) * dtype_size
        return out
    if scheme != "hybridflow":
        raise ValueError(f"unknown scheme {scheme!r}; choose from {list(SCHEMES)}")
    if not groups.hybridflow:
        raise ValueError("hybridflow needs HybridFlow's placement; these groups have verl's")
    tau, pi = tp // groups.k_t, stage // groups.k_p
    needed: dict[str, TensorSpec] = {}
    for s in range(pi * groups.k_p, (pi + 1) * groups.k_p):
        needed.update(placed[s])
    for key, tensor in needed.items():
        own, overlap, gen = _slice_table(_signature(tensor), groups.t, groups.t_g)
        need, have = int(gen[tau]), int(overlap[tp]) if key in own_stage else 0
        if tensor.ep_dim is not None:
            experts = tensor.shape[tensor.ep_dim]
            need = need // experts * int(expert_counts(experts, groups.ep_g)[ep // groups.k_e])
            have = have // experts * int(expert_counts(experts, groups.ep)[ep])
        out[key] = (need - have) * dtype_size
    return out
