"""The 3D-HybridEngine's process groups (HybridFlow, EuroSys 2025, section 5), from rank coordinates.

Training uses p stages x t tensor shards x d replicas (N = p*t*d; context parallelism is folded into d, because
cp ranks hold the same weights). Generation uses p_g | p and t_g | t. With k_t = t/t_g and k_p = p/p_g the micro-DP
size is d_g = k_t*k_p. For a rank with training coordinates (d_i, p_i, t_i):

- generation TP rank  tau = t_i // k_t,   generation PP rank  pi = p_i // k_p,
- micro-DP rank       mu  = (p_i % k_p) * k_t + (t_i % k_t),
- micro-DP group      fixed (d_i, pi, tau): k_p consecutive stages x k_t consecutive TP ranks,
- generation TP group fixed (d_i, pi, mu), generation PP group fixed (d_i, tau, mu),
- generation engine   fixed (d_i, mu): its t_g*p_g ranks; engine index d_i*d_g + mu.

One all-gather in every micro-DP group turns each rank's training shard into its generation shard: training
stages pi*k_p .. pi*k_p+k_p-1 and training TP slices tau*k_t .. tau*k_t+k_t-1 concatenated on each tensor's TP dim.

FSDP training (tp = pp = 1, strategy fsdp/fsdp2) shards every tensor's dim 0 over all N ranks. It is mapped as
t = N: k_t = N/t_g consecutive ranks form a micro-DP group (their shards' union is one generation TP slice of a
column-parallel tensor) and generation TP rank tau = rank // k_t. Row-parallel tensors need an all-to-all instead
(see plan/bytes.py for the bytes).

Experts: micro-DP members share their data index, hence their expert-parallel rank. When infer.ep < train.ep a
second all-gather over ``expert_gather_group`` (same t_i, p_i and expert-data rank, ep ranks e with the same
e // (train.ep / infer.ep)) collects the experts of the wider generation EP shard.

verl's placement. Where the scheme does not apply (t_g does not divide t, p_g does not divide p, infer.ep does not
divide train.ep: ``layout.hybridflow_problems``), verl 0.9.1 still runs the layout (its Megatron "diff TP" example:
train tp2 pp2, generate tp4) and syncs weights its own way, the whole model gathered on every rank. Groups built
with ``placement="verl"`` describe that run: generation engines on consecutive ranks, TP fastest then PP
(``RolloutReplica`` takes ranks ``[e*t_g*p_g, (e+1)*t_g*p_g)``, vLLM numbers them ``pi*t_g + tau``), so
tau = rank % t_g, pi = rank // t_g % p_g, engine = rank // (t_g*p_g); there are no micro-DP groups (k_t = k_p =
d_g = 0, micro_dp = -1).

Everything per rank is O(1); whole-world arrays use numpy (no O(N^2) enumeration), so 4096 ranks are cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from hybrid_engine.layout import InferLayout, LayoutError, TrainLayout, check_compatible, hybridflow_problems

__all__ = ["PLACEMENTS", "HybridGroups", "RankInfo", "hybrid_groups"]

PLACEMENTS = ("hybridflow", "verl")
"""How generation ranks sit on training ranks: HybridFlow's micro-DP mapping (the pack's resharder), or verl's."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RankInfo:
    """Where one rank sits in training and in generation."""

    rank: int
    data: int
    """Training data index d_i (dp and cp folded: cp_i + cp*dp_i)."""
    stage: int
    """Training pipeline stage p_i."""
    tp: int
    """Training TP rank t_i (FSDP: the dim-0 shard index = rank)."""
    ep: int
    """Training expert-parallel rank."""
    gen_tp: int
    """Generation TP rank tau."""
    gen_pp: int
    """Generation PP rank pi."""
    micro_dp: int
    """Micro-DP rank mu (position in its micro-DP group); -1 under verl's placement."""
    engine: int
    """Generation engine (generation DP rank) d_i*d_g + mu; rank // (t_g*p_g) under verl's placement."""
    generation_shard: tuple[tuple[int, int], ...]
    """The (training stage, training TP slice) pairs whose union is this rank's generation shard (empty under verl's
    placement: there a generation shard is not a union of training shards)."""

    def to_dict(self) -> dict:
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out["generation_shard"] = [list(pair) for pair in self.generation_shard]
        return out


@dataclass(frozen=True, kw_only=True)
class HybridGroups:
    """Micro-DP, generation TP/PP groups and engines of one (training, generation) layout pair."""

    train: TrainLayout
    infer: InferLayout
    fsdp: bool
    """True: the training shards are FSDP dim-0 shards over all ranks (mapped as t = N, p = d = 1)."""
    placement: str = "hybridflow"
    """``hybridflow`` (micro-DP groups, the pack's resharder) or ``verl`` (verl's engines on consecutive ranks)."""

    @property
    def hybridflow(self) -> bool:
        """True when the generation ranks follow HybridFlow's micro-DP mapping (the pack's resharder runs it)."""
        return self.placement == "hybridflow"

    # -- sizes ---------------------------------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.train.world_size

    @property
    def t(self) -> int:
        return self.world_size if self.fsdp else self.train.tp

    @property
    def p(self) -> int:
        return 1 if self.fsdp else self.train.pp

    @property
    def d(self) -> int:
        return 1 if self.fsdp else self.train.dp * self.train.cp

    @property
    def t_g(self) -> int:
        return self.infer.tp

    @property
    def p_g(self) -> int:
        return self.infer.pp

    @property
    def k_t(self) -> int:
        """t / t_g (0 under verl's placement)."""
        return self.t // self.t_g if self.hybridflow else 0

    @property
    def k_p(self) -> int:
        """p / p_g (0 under verl's placement)."""
        return self.p // self.p_g if self.hybridflow else 0

    @property
    def d_g(self) -> int:
        """Micro-DP group size k_t * k_p (0 under verl's placement: no micro-DP groups)."""
        return self.k_t * self.k_p

    @property
    def ep(self) -> int:
        return 1 if self.fsdp else self.train.ep

    @property
    def ep_g(self) -> int:
        return self.infer.ep

    @property
    def k_e(self) -> int:
        """Training EP ranks merged into one generation EP rank (train.ep / infer.ep; 1 under verl's placement)."""
        return max(self.ep // self.ep_g, 1) if self.hybridflow else 1

    @property
    def num_micro_dp_groups(self) -> int:
        return self.world_size // self.d_g if self.hybridflow else 0

    @property
    def num_gen_tp_groups(self) -> int:
        return self.world_size // self.t_g

    @property
    def num_gen_pp_groups(self) -> int:
        return self.world_size // self.p_g

    @property
    def num_engines(self) -> int:
        return self.world_size // (self.t_g * self.p_g)

    # -- coordinates ---------------------------------------------------------------------------------------------------
    def _strides(self) -> dict[str, int]:
        """Rank stride of each training axis (tp, cp, dp, pp) in the layout's order."""
        sizes = {"tp": self.train.tp, "cp": self.train.cp, "dp": self.train.dp, "pp": self.train.pp}
        strides, stride = {}, 1
        for axis in self.train.axes:
            strides[axis] = stride
            stride *= sizes[axis]
        return strides

    def train_coords(self, rank: int) -> tuple[int, int, int, int]:
        """(d_i, p_i, t_i, ep_i) of ``rank``."""
        if not 0 <= rank < self.world_size:
            raise LayoutError(f"rank {rank} outside [0, {self.world_size})")
        if self.fsdp:
            return 0, 0, rank, 0
        coords = self.train.coords(rank)
        return coords["cp"] + self.train.cp * coords["dp"], coords["pp"], coords["tp"], coords["ep"]

    def rank_of(self, data: int, stage: int, tp: int) -> int:
        """Inverse of ``train_coords`` (scalars or numpy arrays)."""
        if self.fsdp:
            return tp
        strides = self._strides()
        cp_i, dp_i = data % self.train.cp, data // self.train.cp
        return tp * strides["tp"] + cp_i * strides["cp"] + dp_i * strides["dp"] + stage * strides["pp"]

    @cached_property
    def arrays(self) -> dict[str, np.ndarray]:
        """Per-rank numpy arrays over the whole world: data, stage, tp, ep, gen_tp, gen_pp, micro_dp, engine."""
        ranks = np.arange(self.world_size, dtype=np.int64)
        if self.fsdp:
            data, stage, tp, ep = np.zeros_like(ranks), np.zeros_like(ranks), ranks.copy(), np.zeros_like(ranks)
        else:
            strides, train = self._strides(), self.train
            tp = ranks // strides["tp"] % train.tp
            cp_i = ranks // strides["cp"] % train.cp
            dp_i = ranks // strides["dp"] % train.dp
            stage = ranks // strides["pp"] % train.pp
            data = cp_i + train.cp * dp_i
            ep = data % train.ep
        out = {"data": data, "stage": stage, "tp": tp, "ep": ep, "edp": data // self.ep}
        if not self.hybridflow:
            engine_size = self.t_g * self.p_g
            out.update(gen_tp=ranks % self.t_g, gen_pp=ranks // self.t_g % self.p_g,
                       micro_dp=np.full_like(ranks, -1), engine=ranks // engine_size)
            return out
        mu = (stage % self.k_p) * self.k_t + tp % self.k_t
        out.update(gen_tp=tp // self.k_t, gen_pp=stage // self.k_p, micro_dp=mu, engine=data * self.d_g + mu)
        return out

    def rank_info(self, rank: int) -> RankInfo:
        data, stage, tp, ep = self.train_coords(rank)
        if not self.hybridflow:
            return RankInfo(rank=rank, data=data, stage=stage, tp=tp, ep=ep, gen_tp=rank % self.t_g,
                            gen_pp=rank // self.t_g % self.p_g, micro_dp=-1,
                            engine=rank // (self.t_g * self.p_g), generation_shard=())
        tau, pi = tp // self.k_t, stage // self.k_p
        mu = (stage % self.k_p) * self.k_t + tp % self.k_t
        shard = tuple(
            (s, slice_)
            for s in range(pi * self.k_p, (pi + 1) * self.k_p)
            for slice_ in range(tau * self.k_t, (tau + 1) * self.k_t)
        )
        return RankInfo(
            rank=rank,
            data=data,
            stage=stage,
            tp=tp,
            ep=ep,
            gen_tp=tau,
            gen_pp=pi,
            micro_dp=mu,
            engine=data * self.d_g + mu,
            generation_shard=shard,
        )

    # -- groups of one rank (members in group-rank order) --------------------------------------------------------------
    def _require_hybridflow(self, what: str) -> None:
        if not self.hybridflow:
            raise LayoutError(
                f"{what}: verl's placement (infer tp({self.t_g}) pp({self.p_g}) from train tp({self.train.tp})"
                f" pp({self.train.pp})) has no micro-DP groups"
            )

    def micro_dp_group(self, rank: int) -> list[int]:
        """Members ordered by micro-DP rank mu = (stage % k_p) * k_t + (tp % k_t)."""
        self._require_hybridflow("micro_dp_group")
        data, stage, tp, _ = self.train_coords(rank)
        tau, pi = tp // self.k_t, stage // self.k_p
        return [
            int(self.rank_of(data, pi * self.k_p + mu // self.k_t, tau * self.k_t + mu % self.k_t))
            for mu in range(self.d_g)
        ]

    def expert_gather_group(self, rank: int) -> list[int]:
        """Ranks that all-gather experts after the micro-DP gather when infer.ep < train.ep (else just ``rank``)."""
        if self.k_e == 1 or not self.hybridflow:
            return [rank]
        data, stage, tp, ep = self.train_coords(rank)
        edp, base = data // self.ep, (ep // self.k_e) * self.k_e
        return [int(self.rank_of(edp * self.ep + e, stage, tp)) for e in range(base, base + self.k_e)]

    # -- all groups, without O(N^2) work ------------------------------------------------------------------------------
    def _group_matrix(self, kind: str) -> np.ndarray:
        """All groups of one kind as a (num_groups, group_size) array of ranks, built by broadcasting."""
        if not self.hybridflow:
            ranks = np.arange(self.world_size, dtype=np.int64)
            if kind == "micro_dp":
                return np.zeros((0, 1), dtype=np.int64)
            if kind == "gen_tp":
                return ranks.reshape(-1, self.t_g)
            if kind == "gen_pp":
                return ranks.reshape(-1, self.p_g, self.t_g).transpose(0, 2, 1).reshape(-1, self.p_g)
            raise ValueError(f"unknown group kind {kind!r}; choose micro_dp, gen_tp or gen_pp")
        d = np.arange(self.d).reshape(-1, 1, 1, 1)
        if kind == "micro_dp":
            pi = np.arange(self.p_g).reshape(1, -1, 1, 1)
            tau = np.arange(self.t_g).reshape(1, 1, -1, 1)
            mu = np.arange(self.d_g).reshape(1, 1, 1, -1)
            stage, tp = pi * self.k_p + mu // self.k_t, tau * self.k_t + mu % self.k_t
        elif kind == "gen_tp":
            stage = np.arange(self.p).reshape(1, -1, 1, 1)
            low = np.arange(self.k_t).reshape(1, 1, -1, 1)
            tau = np.arange(self.t_g).reshape(1, 1, 1, -1)
            tp = tau * self.k_t + low
        elif kind == "gen_pp":
            tp = np.arange(self.t).reshape(1, -1, 1, 1)
            low = np.arange(self.k_p).reshape(1, 1, -1, 1)
            pi = np.arange(self.p_g).reshape(1, 1, 1, -1)
            stage = pi * self.k_p + low
        else:
            raise ValueError(f"unknown group kind {kind!r}; choose micro_dp, gen_tp or gen_pp")
        ranks = self.rank_of(d, stage, tp)
        ranks = np.broadcast_to(ranks, np.broadcast_shapes(d.shape, np.shape(stage), np.shape(tp)))
        return np.asarray(ranks).reshape(-1, ranks.shape[-1])

    def groups(self, kind: str, limit: int | None = None) -> list[list[int]]:
        """Groups of ``kind`` (micro_dp, gen_tp, gen_pp), sorted by their first rank; at most ``limit`` of them."""
        matrix = self._group_matrix(kind)
        matrix = matrix[np.argsort(matrix.min(axis=1), kind="stable")]
        if limit is not None:
            matrix = matrix[:limit]
        return matrix.tolist()

    def spans_nodes(self, kind: str, gpus_per_node: int) -> int:
        """How many groups of ``kind`` have members on more than one node."""
        nodes = self._group_matrix(kind) // gpus_per_node
        return int(np.count_nonzero(nodes.min(axis=1) != nodes.max(axis=1)))

    def to_dict(self, limit: int = 8) -> dict:
        return {
            "t": self.t,
            "p": self.p,
            "d": self.d,
            "t_g": self.t_g,
            "p_g": self.p_g,
            "k_t": self.k_t,
            "k_p": self.k_p,
            "d_g": self.d_g,
            "fsdp": self.fsdp,
            "placement": self.placement,
            "counts": {
                "micro_dp": self.num_micro_dp_groups,
                "gen_tp": self.num_gen_tp_groups,
                "gen_pp": self.num_gen_pp_groups,
                "engines": self.num_engines,
            },
            "micro_dp": self.groups("micro_dp", limit),
            "gen_tp": self.groups("gen_tp", limit),
            "gen_pp": self.groups("gen_pp", limit),
            "truncated": self.num_micro_dp_groups > limit or self.num_gen_tp_groups > limit,
        }


def hybrid_groups(
    train: TrainLayout, infer: InferLayout, *, fsdp: bool | None = None, placement: str = "hybridflow"
) -> HybridGroups:
    """The groups of resolved layouts; raises LayoutError listing every problem.

    ``fsdp``: treat the training shards as FSDP dim-0 shards (default: when train.tp == train.pp == 1).
    ``placement``: ``hybridflow`` (the default, what the resharder needs): refuse a pair the scheme cannot take;
    ``auto``: HybridFlow's mapping where it applies, verl's placement otherwise (the planner: verl runs both);
    ``verl``: verl's placement. Every placement refuses what verl cannot run (``check_compatible``).
    """
    if placement not in (*PLACEMENTS, "auto"):
        raise ValueError(f"placement: unknown {placement!r}; choose hybridflow, verl or auto")
    if fsdp is None:
        fsdp = train.tp == 1 and train.pp == 1
    problems = check_compatible(train, infer)
    if fsdp and (train.tp != 1 or train.pp != 1):
        problems.append(f"layout.train: FSDP resharding needs tp=pp=1, got tp({train.tp}) pp({train.pp})")
    scheme_problems = [] if fsdp else hybridflow_problems(train, infer)
    if fsdp and infer.pp != 1:
        scheme_problems.append(
            f"layout.infer.pp: FSDP -> generation resharding is modelled for infer.pp=1, got {infer.pp}"
        )
    if not fsdp and train.tp == 1 and train.pp == 1 and (infer.tp > 1 or infer.pp > 1):
        # Megatron-style replicas hold whole models: there are no shards to gather a generation shard from
        scheme_problems.append(
            f"layout.infer: tp({infer.tp})*pp({infer.pp}) needs model-parallel training shards to gather from;"
            " layout.train has tp=pp=1 (use fsdp=True to plan FSDP dim-0 shards)"
        )
    if problems or (placement == "hybridflow" and scheme_problems):
        raise LayoutError(problems + (scheme_problems if placement == "hybridflow" else []))
    chosen = "verl" if placement == "verl" or (placement == "auto" and scheme_problems) else "hybridflow"
    return HybridGroups(train=train, infer=infer, fsdp=fsdp, placement=chosen)
