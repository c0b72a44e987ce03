"""The layout search (``plan.solve=true``): which layout, offload, token budget and rollout share to run.

HybridFlow's device-mapping search (EuroSys 2025, Algorithm 1) enumerates placements and parallel sizes, keeps those
that fit the GPUs' memory and ranks them by a simulated iteration time. This is that search for one colocated verl
run (actor, ref, critic and the rollout engine on every GPU):

1. enumerate layouts: strategy (FSDP2 or Megatron), training dp/tp/pp/cp/ep, generation tp/ep, keeping only what
   validation accepts (the model's shape: heads and kv heads by tp, layers by pp, experts by ep, ep | dp*cp; FSDP
   trains with tp = pp = 1 and no ep; an engine larger than a node takes whole nodes; vLLM/SGLang generate with
   pp 1 and ep = tp or 1; the mini-batch times rollout.n splits over dp). Training TP stays inside a node and
   context parallel is searched only for sequences of ``LONG_SEQUENCE`` tokens and more (below that it only adds
   communication: the memory model splits activations by tp);
2. a lower bound of each layout's step time (``step_time`` with no offload, the largest budgets, the largest rollout
   share, no weight sync), cheapest first;
3. branch and bound: in that order, settle each layout's settings (``settle``: per offload, mildest first, the
   largest token budgets and rollout share whose planned phases leave ``min_headroom_gib`` free, checked with
   ``estimate_memory``) and time it with its weight sync (``compute_bytes`` of the scheme that runs); stop once
   the next lower bound is slower than the ``top``-th result: nothing after it can enter;
4. when nothing fits, the smallest shortfall over every allowed layout at its lightest settings.

A layout's generation weights are bounded below by M / (tp_g * ep share) before anything is planned: an engine shard
larger than the largest rollout share is dropped without a plan.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

from hybrid_engine.groups import HybridGroups, hybrid_groups
from hybrid_engine.layout import FSDP_ORDER, InferLayout, LayoutError, TrainLayout
from hybrid_engine.model_spec import ModelArch, ModelSpec, build_spec
from hybrid_engine.plan.bytes import compute_bytes, generation_shard_peak
from hybrid_engine.plan.memory import estimate_memory, kv_bytes_per_token, micro_batch_tokens
from hybrid_engine.plan.settings import FSDP_FAMILY, GIB, ClusterSpec, PlanSettings, dtype_bytes
from hybrid_engine.plan.step_time import GpuFigures, StepTime, Workload, gpu_figures, step_time

__all__ = ["Candidate", "SolveRequest", "SolveResult", "solve"]

BUDGET_FACTORS = (2, 3, 4, 6, 8, 12, 16)
"""token budgets per GPU searched, as multiples of prompt + response"""
SHARE_STEP = 20
"""rollout shares in steps of 1/20 = 0.05"""
MAX_SHARE = 0.9
"""the largest rollout share offered (vLLM's own default)"""
OFFLOADS = ("none", "optimizer", "param", "full")
"""mildest first: each holds less on the GPU and moves more over PCIe"""
LONG_SEQUENCE = 16384
MAX_ENGINE_NODES = 8
"""generation engines up to this many whole nodes"""


@dataclass(frozen=True, kw_only=True)
class SolveRequest:
    """What to solve for: the model, the GPUs, the run's settings (lengths, roles, batching mode) and batch."""

    arch: ModelArch
    cluster: ClusterSpec
    settings: PlanSettings
    """the run's settings; strategy, offload, budgets and gpu_memory_utilization are what the search changes"""
    workload: Workload
    strategies: tuple[str, ...] = ("fsdp2", "megatron")
    rollout: str = "vllm"
    """vllm / sglang: generation pp 1, ep 1 or = tp (verl 0.9.1's RolloutConfig); hf: one server per engine"""
    critic_mini_batch_size: int | None = None
    top: int = 5
    spec: ModelSpec | None = None


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One layout with its settled settings, planned memory and estimated step time."""

    strategy: str
    train: TrainLayout
    infer: InferLayout
    settings: PlanSettings
    """the settings it runs with: offload, token budgets or micro-batch, gpu_memory_utilization"""
    memory: dict
    time: StepTime
    scheme: str
    """the weight-sync scheme that runs (hybridflow, fsdp_to_tp: the pack's resharder; tp_group_gather,
    full_gather: verl's own)"""
    offloads: dict[str, float | None] = field(default_factory=dict)
    """the offloads tried on this layout: the step time each gave with its own budgets and share, None where it
    does not fit (heavier ones are not tried once a milder one reached the largest budgets and share)"""

    @property
    def offload(self) -> str:
        return self.settings.offload

    @property
    def budget_factors(self) -> tuple[int, int] | None:
        """(actor, log-prob) token budgets as multiples of prompt + response; None with fixed batching."""
        s = self.settings
        if not s.use_dynamic_bsz:
            return None
        return s.ppo_max_token_len_per_gpu // s.sequence_length, s.log_prob_max_token_len_per_gpu // s.sequence_length

    def describe(self) -> str:
        t, i, s = self.train, self.infer, self.settings
        train = f"{self.strategy} train dp{t.dp} tp{t.tp} pp{t.pp} cp{t.cp} ep{t.ep}"
        infer = f"infer tp{i.tp}" + (f" ep{i.ep}" if i.ep > 1 else "") + f" x{i.dp}"
        factors = self.budget_factors
        batch = (f"budget {factors[0]}x/{factors[1]}x" if factors
                 else f"micro-batch {s.ppo_micro_batch_size_per_gpu}")
        return f"{train} -> {infer}, offload {s.offload}, {batch}, rollout share {s.gpu_memory_utilization:g}"

    def to_dict(self) -> dict:
        m = self.memory
        factors = self.budget_factors
        return {
            "strategy": self.strategy,
            "train": self.train.to_dict(),
            "infer": self.infer.to_dict(),
            "offload": self.offload,
            "use_dynamic_bsz": self.settings.use_dynamic_bsz,
            "budget_factors": None if factors is None else {"actor": factors[0], "log_prob": factors[1]},
            "ppo_max_token_len_per_gpu": self.settings.ppo_max_token_len_per_gpu,
            "log_prob_max_token_len_per_gpu": self.settings.log_prob_max_token_len_per_gpu,
            "ppo_micro_batch_size_per_gpu": self.settings.ppo_micro_batch_size_per_gpu,
            "gpu_memory_utilization": self.settings.gpu_memory_utilization,
            "weight_sync_scheme": self.scheme,
            "offloads_tried": dict(self.offloads),
            "time_s": {**self.time.parts(), "total": self.time.total},
            "memory": {"peak_bytes": m["peak_bytes"], "peak_phase": m["peak_phase"],
                       "headroom_bytes": m["headroom_bytes"], "phases": dict(m["phases"]),
                       "kv_cache_tokens": m["rollout"]["kv_cache_tokens"]},
        }


@dataclass(kw_only=True)
class SolveResult:
    request: SolveRequest
    candidates: list[Candidate] = field(default_factory=list)
    """the best ``top``, fastest first"""
    considered: int = 0
    """layouts enumerated (strategy x train x infer)"""
    allowed: int = 0
    """of those, layouts validation accepts (shape, batch splits)"""
    evaluated: int = 0
    """layouts whose settings were settled (the rest were bounded out)"""
    fitting: int = 0
    """evaluated layouts that fit"""
    seconds: float = 0.0
    shortfall: dict | None = None
    """when nothing fits: the layout closest to fitting and how many bytes it lacks: ``peak_phase``/``peak_bytes``
    (planned at full offload and the lightest settings) or ``shard_bytes``/``share_bytes`` (its generation shard
    against the largest rollout share); None when no layout was allowed at all"""
    refused: dict[str, int] = field(default_factory=dict)
    """why layouts were not allowed: rule -> count"""
    gpu: GpuFigures | None = None


# -- enumeration -------------------------------------------------------------------------------------------------


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _train_layouts(arch: ModelArch, cluster: ClusterSpec, settings: PlanSettings, fsdp: bool, refused):
    world, per_node = cluster.world_size, cluster.gpus_per_node
    heads, kv, layers = arch.num_attention_heads, arch.num_key_value_heads, arch.num_hidden_layers
    long = settings.sequence_length >= LONG_SEQUENCE
    cps = [c for c in (1, 2, 4, 8) if long or c == 1]
    if fsdp:
        for cp in cps:
            if world % cp or heads % cp or (kv % cp and cp % kv):
                refused["ulysses cp vs heads or world"] = refused.get("ulysses cp vs heads or world", 0) + 1
                continue
            yield TrainLayout(dp=world // cp, cp=cp, order=FSDP_ORDER)
        return
    for tp in _divisors(per_node):
        if world % tp:
            continue
        if heads % tp or kv % tp:
            refused["train tp vs heads"] = refused.get("train tp vs heads", 0) + 1
            continue
        for pp in _divisors(layers):
            for cp in cps:
                if world % (tp * pp * cp):
                    continue
                dp = world // (tp * pp * cp)
                for ep in (_divisors(arch.num_experts) if arch.is_moe else [1]):
                    if (dp * cp) % ep:
                        continue
                    yield TrainLayout(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep)


def _infer_layouts(arch: ModelArch, cluster: ClusterSpec, rollout: str, refused):
    world, per_node = cluster.world_size, cluster.gpus_per_node
    heads, kv = arch.num_attention_heads, arch.num_key_value_heads
    for tp in _divisors(world):
        if tp > per_node and (tp % per_node or tp > MAX_ENGINE_NODES * per_node):
            continue
        if rollout != "hf" and (heads % tp or (kv % tp and tp % kv)):
            refused["infer tp vs heads"] = refused.get("infer tp vs heads", 0) + 1
            continue
        eps = [1] + ([tp] if arch.is_moe and tp > 1 and arch.num_experts % tp == 0 and rollout != "hf" else [])
        for ep in eps:
            yield InferLayout(tp=tp, pp=1, dp=world // tp, ep=ep)


def _batch_splits(request: SolveRequest, dp: int) -> bool:
    n = request.settings.rollout_n
    minis = [request.workload.ppo_mini_batch_size]
    if request.settings.has_critic:
        minis.append(request.critic_mini_batch_size or minis[0])
    return all((mini * n) % dp == 0 for mini in minis)


# -- settling one layout -----------------------------------------------------------------------------------------


@dataclass
class _Layout:
    strategy: str
    train: TrainLayout
    infer: InferLayout
    groups: HybridGroups
    weights: int = 0
    """the largest generation shard one GPU holds (``generation_shard_peak``), once the layout is evaluated"""
    bound: float = 0.0


def _micro_tokens(settings: PlanSettings) -> dict:
    """Tokens of the largest update and log-prob micro-batch per GPU, as the memory model counts them."""
    update, log_prob = micro_batch_tokens(settings)
    return {"tokens_per_micro_batch": update, "log_prob_tokens": log_prob}


def _with_micro_tokens(memory: dict, settings: PlanSettings) -> dict:
    """``memory`` with the micro-batch tokens of ``settings``: what the step-time model reads of another budget."""
    return {**memory, "activations": {**memory["activations"], **_micro_tokens(settings)}}


def _scheme(groups: HybridGroups) -> str:
    if groups.hybridflow:
        return "fsdp_to_tp" if groups.fsdp else "hybridflow"
    return "full_gather" if groups.fsdp else "tp_group_gather"


class _Solver:
    def __init__(self, request: SolveRequest):
        self.request = request
        self.spec = request.spec or build_spec(request.arch)
        self.cluster = request.cluster
        self.gpu = gpu_figures(self.cluster.gpu)
        self.base = request.settings
        self.seq = self.base.sequence_length
        self.dtype = dtype_bytes(self.base.dtype)
        self.model_bytes = self.spec.numel * self.dtype
        self.expert_elems = sum(t.numel for t in self.spec.tensors if t.ep_dim is not None and t.tied_to is None)
        self.dense_elems = self.spec.numel - self.expert_elems
        self.headroom = int(self.base.min_headroom_gib * GIB)
        self.gpu_bytes = self.cluster.memory_bytes
        self.closest_shard: dict | None = None
        """the layout whose generation shard overshoots the largest rollout share the least (never planned)"""

    # settings ---------------------------------------------------------------------------------------------------
    def actor_options(self, layout: _Layout) -> list[dict]:
        """Ascending: the token budgets (dynamic batching) or micro-batch sizes per GPU (fixed) to try."""
        if self.base.use_dynamic_bsz:
            return [{"ppo_max_token_len_per_gpu": f * self.seq} for f in BUDGET_FACTORS]
        per_gpu = self.request.workload.ppo_mini_batch_size * self.base.rollout_n // layout.train.dp
        return [{"ppo_micro_batch_size_per_gpu": k} for k in _divisors(per_gpu) if k <= 64]

    def log_prob_options(self) -> list[dict]:
        if self.base.use_dynamic_bsz:
            return [{"log_prob_max_token_len_per_gpu": f * self.seq} for f in BUDGET_FACTORS]
        return [{}]

    def settings(self, layout: _Layout, offload: str, actor: dict, log_prob: dict, share: float) -> PlanSettings:
        s = replace(self.base, strategy=layout.strategy, param_offload=offload in ("param", "full"),
                    optimizer_offload=offload in ("optimizer", "full"), offload_policy=offload == "full",
                    gpu_memory_utilization=share)
        return replace(s, **actor, **log_prob, **self.per_gpu_batches(layout.train.dp))

    def per_gpu_batches(self, dp: int) -> dict:
        """The sequences one GPU trains on per optimizer step and scores per log-prob pass at this dp (they cap
        dynamic micro-batches in the memory model; ``_batch_splits`` made the first exact)."""
        n, w = self.base.rollout_n, self.request.workload
        return {"mini_batch_sequences_per_gpu": w.ppo_mini_batch_size * n // dp,
                "rollout_sequences_per_gpu": w.train_batch_size * n // dp}

    def memory(self, layout: _Layout, settings: PlanSettings) -> dict:
        return estimate_memory(self.spec, layout.groups, self.cluster, settings, layout.weights)

    def fits(self, memory: dict, phase: str) -> bool:
        return memory["phases"][phase] + self.headroom <= self.gpu_bytes

    def min_share(self, layout: _Layout) -> float:
        """The smallest rollout share (in steps) that holds the generation weights and one sequence's KV cache."""
        per_token = kv_bytes_per_token(self.spec, layout.groups.t_g, layout.groups.p_g, self.dtype)
        need = layout.weights + self.seq * per_token
        return math.ceil(need / self.gpu_bytes * SHARE_STEP - 1e-9) / SHARE_STEP

    def max_share(self, memory: dict, settings: PlanSettings) -> float:
        """The largest rollout share (in steps, at most MAX_SHARE) whose phases still fit: every phase that holds
        the engine's reservation grows with the share one for one."""
        phases = ["generation"] + ([] if settings.free_cache_engine else ["training", "log_prob"])
        room = min(self.gpu_bytes - self.headroom - memory["phases"][p] for p in phases)
        share = settings.gpu_memory_utilization + room / self.gpu_bytes
        return min(MAX_SHARE, math.floor(share * SHARE_STEP + 1e-9) / SHARE_STEP)

    def lightest(self, layout: _Layout, offload: str) -> tuple[PlanSettings, dict]:
        """The least memory ``offload`` allows: the smallest budgets, the smallest rollout share."""
        actors = self.actor_options(layout)
        settings = self.settings(layout, offload, actors[0] if actors else {}, self.log_prob_options()[0],
                                 min(self.min_share(layout), 1.0))
        return settings, self.memory(layout, settings)

    def settle(self, layout: _Layout, offload: str) -> tuple[PlanSettings | None, dict]:
        """The largest token budgets (or micro-batch) and rollout share that fit with ``offload``; None when nothing
        does. Both budgets are searched together, each its own bisection over its phase (training, log_prob), the
        largest tried first; the share is then the largest every phase holding the engine leaves room for."""
        actors, log_probs = self.actor_options(layout), self.log_prob_options()
        share = self.min_share(layout)
        if share > MAX_SHARE or not actors:
            return None, self.lightest(layout, offload)[1]
        options = {"training": actors, "log_prob": log_probs}
        best = {"training": -1, "log_prob": -1}
        bounds = {phase: [0, len(values) - 1] for phase, values in options.items()}
        first = True
        memory = None
        while any(lo <= hi for lo, hi in bounds.values()):
            index = {phase: (hi if first else (lo + hi) // 2) if lo <= hi else max(best[phase], 0)
                     for phase, (lo, hi) in bounds.items()}
            first = False
            memory = self.memory(layout, self.settings(layout, offload, actors[index["training"]],
                                                       log_probs[index["log_prob"]], share))
            for phase, (lo, hi) in bounds.items():
                if lo > hi:
                    continue
                if self.fits(memory, phase):
                    best[phase], bounds[phase][0] = index[phase], index[phase] + 1
                else:
                    bounds[phase][1] = index[phase] - 1
        if best["training"] < 0 or best["log_prob"] < 0:
            return None, memory
        chosen = self.fastest_options(layout, offload, share, best["training"], best["log_prob"], memory)
        settings = self.settings(layout, offload, actors[chosen[0]], log_probs[chosen[1]], share)
        memory = self.memory(layout, settings)
        steps = round(self.max_share(memory, settings) * SHARE_STEP)
        for step in range(steps, max(steps - 3, round(share * SHARE_STEP) - 1), -1):
            # the share that fits, checked by the memory model itself (a step lower when it disagrees)
            trial = replace(settings, gpu_memory_utilization=step / SHARE_STEP)
            trial_memory = self.memory(layout, trial)
            if self.all_fit(trial_memory):
                return trial, trial_memory
            memory = trial_memory
        return None, memory

    def all_fit(self, memory: dict) -> bool:
        """The planner's own rule (headroom and a KV cache), the cache holding one sequence."""
        return bool(memory["fits"]) and memory["rollout"]["kv_cache_tokens"] >= self.seq

    def shortfall(self, memory: dict) -> int:
        """Bytes the peak phase lacks for the headroom, or the host for the offloaded states where it is the shorter
        (at least 1 when it fails for want of a KV cache)."""
        host = memory["host"]
        host_short = 0 if host["fits"] is not False else int(
            host["per_node"] + (host["headroom_gib"] - host["memory_gib"]) * GIB)
        return max(int(memory["peak_bytes"] + self.headroom - self.gpu_bytes), host_short, 1)

    # time -------------------------------------------------------------------------------------------------------
    def time(self, layout: _Layout, settings: PlanSettings, memory: dict, sync_s: float) -> StepTime:
        return step_time(self.spec, layout.train, layout.infer, self.cluster, settings, self.request.workload,
                         memory, sync_s, self.gpu)

    def fastest_options(self, layout: _Layout, offload: str, share: float, top_actor: int, top_log_prob: int,
                        memory: dict) -> tuple[int, int]:
        """Which of the budgets that fit (indices up to ``top_*``) to run. Pipeline stages (pp > 1) trade the 1F1B
        bubble, smaller with more micro-batches, against each micro-batch's own cost: the step-time model's fastest
        pair; without stages fewer micro-batches only save, so the largest."""
        if layout.train.pp == 1:
            return top_actor, top_log_prob
        actors, log_probs = self.actor_options(layout), self.log_prob_options()

        def parts(a: int, lp: int) -> StepTime:
            settings = self.settings(layout, offload, actors[a], log_probs[lp], share)
            return self.time(layout, settings, _with_micro_tokens(memory, settings), 0.0)

        # the update reads only the actor's budget, the log-prob passes only theirs: each is chosen on its own
        actor = min(range(top_actor + 1), key=lambda a: parts(a, top_log_prob).update)
        return actor, min(range(top_log_prob + 1), key=lambda lp: parts(actor, lp).log_prob)

    def bound(self, layout: _Layout) -> float:
        """A lower bound of the layout's step time, without planning it: no offload, the largest share, no weight
        sync, per-GPU shards no larger than an even split (``_even_split``), and the fastest budgets (the largest
        without pipeline stages; any, with them: ``fastest_options``)."""
        actors, log_probs = self.actor_options(layout) or [{}], self.log_prob_options()

        def parts(a: int, lp: int) -> StepTime:
            settings = self.settings(layout, "none", actors[a], log_probs[lp], MAX_SHARE)
            return self.time(layout, settings, self._even_split(layout, settings), 0.0)

        top = parts(len(actors) - 1, len(log_probs) - 1)
        if layout.train.pp == 1:
            return top.total
        update = min(parts(a, len(log_probs) - 1).update for a in range(len(actors)))
        log_prob = min(parts(len(actors) - 1, lp).log_prob for lp in range(len(log_probs)))
        return top.generation + log_prob + update

    def _even_split(self, layout: _Layout, settings: PlanSettings) -> dict:
        """What ``step_time`` reads of a memory breakdown, with every shard an even split of the model (real shards
        are never smaller: embeddings, norms and uneven splits only add) and the KV cache of the largest share."""
        t = layout.train
        elems = self.spec.numel / (t.dp * t.cp) if layout.groups.fsdp else self.split_elems(t.tp, t.pp, t.ep)
        weights = self.split_elems(layout.groups.t_g, layout.groups.p_g, layout.groups.ep_g) * self.dtype
        per_token = kv_bytes_per_token(self.spec, layout.groups.t_g, layout.groups.p_g, self.dtype)
        kv_tokens = int(max(settings.gpu_memory_utilization * self.gpu_bytes - weights, 0) // max(per_token, 1))
        params = elems * (4 if layout.groups.fsdp else self.dtype)
        return {"rollout": {"weights": weights, "kv_bytes_per_token": per_token, "kv_cache_tokens": kv_tokens},
                "actor": {"params": params, "grads": 0, "optimizer": 0, "master_weights": 0},
                "activations": _micro_tokens(settings)}

    def split_elems(self, tp: int, pp: int, ep: int) -> float:
        """Elements per GPU of an even split: dense tensors over tp * pp, experts over tp * pp * ep (the planner's
        split of experts, ``plan/bytes.py``: sliced by tp, then divided over ep)."""
        return self.dense_elems / (tp * pp) + self.expert_elems / (tp * pp * ep)

    def sync_s(self, layout: _Layout) -> float:
        scheme = _scheme(layout.groups)
        return compute_bytes(self.spec, layout.groups, self.cluster, self.dtype, [scheme])[scheme].time_s

    def best_settings(self, layout: _Layout) -> tuple[Candidate | None, tuple[int, str, dict]]:
        """The fastest fitting settings of one layout, offloads mildest first; a heavier offload is tried only
        while a milder one left the budgets or the share below their largest (it only adds PCIe time). When even
        full offload at the lightest settings does not fit, nothing does: (None, (shortfall, "full", memory))."""
        layout.weights = generation_shard_peak(self.spec, layout.groups, self.dtype)
        _, lightest = self.lightest(layout, "full")
        if not self.all_fit(lightest):
            return None, (self.shortfall(lightest), "full", lightest)
        best, sync, tried = None, None, {}
        for offload in OFFLOADS:
            settings, memory = self.settle(layout, offload)
            tried[offload] = None
            if settings is None:
                continue
            if sync is None:
                sync = self.sync_s(layout)
            found = Candidate(strategy=layout.strategy, train=layout.train, infer=layout.infer, settings=settings,
                              memory=memory, time=self.time(layout, settings, memory, sync),
                              scheme=_scheme(layout.groups), offloads=tried)
            tried[offload] = found.time.total
            if best is None or found.time.total < best.time.total:
                best = found
            if self._largest(layout, settings):
                break
        return best, (self.shortfall(lightest), "full", lightest)

    def _largest(self, layout: _Layout, settings: PlanSettings) -> bool:
        actors = self.actor_options(layout)
        top = actors[-1] if actors else {}
        largest = all(getattr(settings, k) == v for k, v in {**top, **self.log_prob_options()[-1]}.items())
        return largest and settings.gpu_memory_utilization >= MAX_SHARE

    # layouts ----------------------------------------------------------------------------------------------------
    def layouts(self, result: SolveResult) -> list[_Layout]:
        request, refused = self.request, result.refused
        out = []
        share_cap = MAX_SHARE * self.gpu_bytes
        for strategy in request.strategies:
            fsdp = strategy in FSDP_FAMILY
            for train in _train_layouts(request.arch, self.cluster, self.base, fsdp, refused):
                if not _batch_splits(request, train.dp):
                    for _ in _infer_layouts(request.arch, self.cluster, request.rollout, {}):
                        result.considered += 1
                    refused["mini-batch x rollout.n vs dp"] = refused.get("mini-batch x rollout.n vs dp", 0) + 1
                    continue
                for infer in _infer_layouts(request.arch, self.cluster, request.rollout, refused):
                    result.considered += 1
                    shard = self.split_elems(infer.tp, infer.pp, infer.ep) * self.dtype
                    if shard > share_cap:
                        refused["generation shard > largest rollout share"] = \
                            refused.get("generation shard > largest rollout share", 0) + 1
                        short = int(shard - share_cap)
                        if self.closest_shard is None or short < self.closest_shard["bytes"]:
                            self.closest_shard = {"bytes": short, "strategy": strategy, "train": train,
                                                  "infer": infer, "offload": "full", "shard_bytes": int(shard),
                                                  "share_bytes": int(share_cap), "gpu_bytes": self.gpu_bytes}
                        continue
                    try:
                        groups = hybrid_groups(train, infer, fsdp=fsdp, placement="auto")
                    except LayoutError:
                        refused["verl cannot place the engines"] = refused.get("verl cannot place the engines", 0) + 1
                        continue
                    out.append(_Layout(strategy, train, infer, groups))
        result.allowed = len(out)
        return out


def solve(request: SolveRequest) -> SolveResult:
    """The ``request.top`` fastest layouts that fit (see the module docstring); ``shortfall`` when none does."""
    start = time.perf_counter()
    result = SolveResult(request=request)
    solver = _Solver(request)
    result.gpu = solver.gpu
    layouts = solver.layouts(result)
    for layout in layouts:
        layout.bound = solver.bound(layout)
    layouts.sort(key=lambda layout: layout.bound)
    found: list[Candidate] = []
    closest = None
    for layout in layouts:
        if len(found) >= request.top and layout.bound >= found[request.top - 1].time.total:
            break
        result.evaluated += 1
        best, (short, offload, memory) = solver.best_settings(layout)
        if best is None:
            if closest is None or short < closest["bytes"]:
                closest = {"bytes": short, "strategy": layout.strategy, "train": layout.train,
                           "infer": layout.infer, "offload": offload, "peak_phase": memory["peak_phase"],
                           "peak_bytes": memory["peak_bytes"], "gpu_bytes": solver.gpu_bytes,
                           "headroom_bytes": solver.headroom, "host": memory["host"]}
            continue
        result.fitting += 1
        found.append(best)
        found.sort(key=lambda c: c.time.total)
    result.candidates = found[:request.top]
    if not found:
        shard = solver.closest_shard
        result.shortfall = closest or shard  # a planned shortfall; a shard's is a lower bound, for want of one
    result.seconds = time.perf_counter() - start
    return result
