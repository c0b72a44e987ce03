"""Memory is part of validation: a layout whose planned peak memory per GPU exceeds the GPU is an error, with the
changes that would make it fit.

The planner (``hybrid_engine.plan``) estimates every GPU's memory phase by phase; here its peak is compared with
``cluster.gpu.memory_gib``. Planned peak > GPU memory is a problem (exit 2 in ``validate``, ``plan`` and ``train``),
with up to three changes that fit, each found by re-planning with that change applied:

- ``offload=optimizer|param|full`` (never one that turns an offload off); where none fits on FSDP2 (its
  ``offload=full`` keeps every state on the host, which may not hold them), FSDP1's manual offload
  (``offload=full strategy=fsdp`` with AdamW's foreach temporary off: the states go back to the GPU for the update);
- ``actor_rollout_ref.rollout.gpu_memory_utilization=x`` lower, in steps of 0.05, the KV cache still holding a sequence;
- ``layout.train.tp=2t|4t`` (Megatron: parameters and gradients split over more tensor ranks; inside one node);
- ``layout.infer.tp=2t|4t`` (a smaller generation shard per GPU, more of the rollout's share for the KV cache);
- ``cluster.nnodes=2n|4n`` (more data-parallel ranks shard the optimizer; FSDP shards everything);
- and, where no single change fits, one of the last three together with an offload, or a layout change with a lower
  rollout share.

A suggestion counts only when its re-plan fits by the planner's own rule (``fits``: headroom of at least
``min_headroom_gib`` and a KV cache), its layout is one validation accepts (``admissible``), and the KV cache holds
one sequence. The error itself is only "planned peak > GPU memory": the memory model is an estimate (the plan
accuracy figures in the README), so nothing stricter fails a run. ``run.allow_overcommit=true`` turns the error into
a warning (and skips the search).

Nothing to check without the model's shape (a hub id the pack does not ship: ``arch`` is None) or on the CPU
(``cluster=cpu``, the embedded default).

Re-planning is cheap: a change of settings re-runs only the memory model on the same groups
(``estimate_memory``, what ``build_plan`` runs); a change of layout builds a plan once (reusing the tensor spec);
monotone axes are tried at their strongest value first, so a hopeless axis costs one re-plan.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from omegaconf import DictConfig, OmegaConf

from hybrid_engine.layout import InferLayout, LayoutError, TrainLayout
from hybrid_engine.model_spec import ModelArch
from hybrid_engine.plan import ClusterSpec, Plan, PlanSettings, build_plan
from hybrid_engine.plan.budget import auto_token_budgets
from hybrid_engine.plan.memory import estimate_memory
from hybrid_engine.plan.render import gib_text, host_text
from hybrid_engine.plan.settings import GIB
from recipes.check.plan import cluster_spec, offload_keys, plan_settings
from recipes.check.schema import SchemaError

__all__ = ["Suggestion", "check_memory", "memory_plan", "overcommitted", "suggest"]

UTILIZATION_KEY = "actor_rollout_ref.rollout.gpu_memory_utilization"
UTILIZATION_STEP = 20
"""rollout shares are suggested in steps of 1/20 = 0.05"""
OFFLOADS = ("optimizer", "param", "full")
"""mildest first; ``full`` holds the least of the three on the GPU"""
FACTORS = (2, 4)
"""layout.train.tp and cluster.nnodes are suggested at 2x and 4x their value"""

Admissible = Callable[[TrainLayout, InferLayout], bool]


@dataclass(frozen=True)
class Suggestion:
    """Overrides to add to the command line, and what the re-plan with them gives."""

    overrides: tuple[str, ...]
    peak_bytes: int
    peak_phase: str

    @property
    def text(self) -> str:
        return " ".join(self.overrides)

    def line(self) -> str:
        return f"{self.text}  (planned peak {gib_text(self.peak_bytes)} in {self.peak_phase})"


def on_cpu(cfg: DictConfig) -> bool:
    """The CPU cluster (``cluster=cpu``, the embedded default): no GPU memory to check."""
    return (OmegaConf.select(cfg, "cluster.gpu.name", default=None) == "cpu"
            or OmegaConf.select(cfg, "trainer.device", default=None) == "cpu")


def memory_plan(cfg: DictConfig, train: TrainLayout | None, infer: InferLayout | None, arch: ModelArch | None, *,
                use_critic: bool, use_ref: bool) -> Plan | None:
    """The run's plan, for its memory; None when there is nothing to check (unknown model, the CPU, a layout the
    planner cannot place: validation reports that one)."""
    if arch is None or train is None or infer is None or on_cpu(cfg):
        return None
    try:
        plan = build_plan(arch, train, infer, cluster_spec(cfg), plan_settings(cfg, use_critic, use_ref))
    except (SchemaError, LayoutError, TypeError, ValueError):  # reported by the checks that read those keys
        return None
    return plan if plan.memory is not None and not plan.errors else None


def overcommitted(plan: Plan | None) -> bool:
    """Planned peak memory per GPU > the GPU's memory (nothing stricter: the model is an estimate), or offloaded
    states beyond a node's known CPU memory."""
    if plan is None or plan.memory is None:
        return False
    return plan.memory["peak_bytes"] > plan.memory["gpu_bytes"] or plan.memory["host"]["fits"] is False


def layout_free(cfg: DictConfig) -> bool:
    """Whether layout.train.dp and layout.infer.dp are derived from the world size (the defaults), so that a change
    of cluster.nnodes or layout.train.tp re-derives them; a dp typed as a number pins the world."""
    for key in ("layout.train", "layout.infer"):
        node = OmegaConf.select(cfg, key, default=None)
        if not isinstance(node, DictConfig) or "dp" not in node or not OmegaConf.is_interpolation(node, "dp"):
            return False
    return True


MANUAL_OFFLOAD = ("strategy=fsdp", "+actor_rollout_ref.actor.optim.override_optimizer_config.foreach=false")
"""what, beside offload=full, turns FSDP2's CPU offload into FSDP1's manual one without AdamW's foreach temporary"""
POLICY_KEY = "actor_rollout_ref.actor.fsdp_config.offload_policy"
"""verl's FSDP2 CPUOffloadPolicy switch, which offload=full turns on with the other two"""


def offload_overrides(cfg: DictConfig, settings: PlanSettings) -> Callable[[str], tuple[str, ...]]:
    """How ``offload=<name>`` is typed for this run: the group, or, where the actor's verl offload keys were typed
    (a verl example's ``fsdp_config.param_offload=False`` outranks the group), those keys themselves."""
    keys = offload_keys(settings.strategy)
    if keys is None or all(_is_interpolation(cfg, key) for key in keys):
        return lambda name: (f"offload={name}",)

    def verl_keys(name: str) -> tuple[str, ...]:
        wanted = _with_offload(settings, name)
        pairs = ((keys[0], settings.param_offload, wanted.param_offload),
                 (keys[1], settings.optimizer_offload, wanted.optimizer_offload))
        if settings.strategy == "fsdp2":
            pairs += ((POLICY_KEY, settings.offload_policy, wanted.offload_policy),)
        return tuple(f"{key}=true" for key, now, new in pairs if new and not now)

    return verl_keys


def _is_interpolation(cfg: DictConfig, key: str) -> bool:
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, default=None)
    return isinstance(node, DictConfig) and leaf in node and OmegaConf.is_interpolation(node, leaf)


def check_memory(cfg: DictConfig, train: TrainLayout | None, infer: InferLayout | None, arch: ModelArch | None, *,
                 use_critic: bool, use_ref: bool, allow_overcommit: bool, admissible: Admissible | None,
                 problems: list[str], warnings: list[str]) -> None:
    """Append the memory problem (or, with ``run.allow_overcommit=true``, the warning) of a run whose planned peak
    exceeds the GPU. ``cfg`` is the config as checked (read only); ``admissible(train, infer)``: whether validation
    accepts a changed layout (batch splits, heads per tensor rank)."""
    plan = memory_plan(cfg, train, infer, arch, use_critic=use_critic, use_ref=use_ref)
    if not overcommitted(plan):
        return
    head = overcommit_line(plan)
    if allow_overcommit:
        warnings.append(f"{head}; run.allow_overcommit=true: going on (it may run out of GPU memory)")
        return
    found = suggest(plan, layout_free=layout_free(cfg), admissible=admissible,
                    offload_overrides=offload_overrides(cfg, plan.settings))
    longest = None if plan.settings.use_dynamic_bsz else longest_response_that_fits(plan)
    if longest is not None:  # fixed micro-batches: the script's own sizes, planned at every response's maximum
        safer = "; ".join(s.text for s in found)
        warnings.append(f"{head} if every response reaches data.max_response_length "
                        f"{plan.settings.max_response_length}; the fixed micro-batches fit with responses up to "
                        f"{longest} tokens: going on (it may run out of GPU memory on longer ones"
                        + (f"; these fit at any length: {safer})" if safer else ")"))
        return
    if found:
        lines = [f"{head}; these fit when re-planned (add to the command line):"]
        lines += [f"    {s.line()}" for s in found]
    else:
        lines = [f"{head}; no offload, lower {UTILIZATION_KEY}, larger layout.train.tp or layout.infer.tp or more "
                 f"cluster.nnodes (alone or two together) re-plans as fitting"]
    lines.append("    or run.allow_overcommit=true to go on anyway")
    problems.append("\n".join(lines))


def longest_response_that_fits(plan: Plan) -> int | None:
    """The longest response (tokens) at which the plan's fixed micro-batches fit the GPU, everything else as
    planned; None where none does (weights, gradients and optimizer states alone overcommit) or where the host's
    memory is what does not fit."""
    if plan.memory["host"]["fits"] is False:
        return None

    def fits(length: int) -> bool:
        shorter = build_plan(plan.arch, plan.train, plan.infer, plan.cluster,
                             replace(plan.settings, max_response_length=length), spec=plan.spec)
        return shorter.memory is not None and shorter.memory["peak_bytes"] <= shorter.memory["gpu_bytes"]

    if not fits(1):
        return None
    low, high = 1, plan.settings.max_response_length  # fits(low) holds; fits(high) does not
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def overcommit_line(plan: Plan) -> str:
    """``memory: planned peak ... > ...``: what does not fit, with the arithmetic."""
    m, t, i, c = plan.memory, plan.train, plan.infer, plan.cluster
    if m["peak_bytes"] <= m["gpu_bytes"]:  # the host's memory, not the GPU's
        return (f"memory: {host_text(m['host'], c.gpus_per_node)}: {plan.arch.name} {plan.settings.strategy} "
                f"offload {plan.settings.offload} on {c.nnodes}x{c.gpus_per_node} GPUs")
    return (f"memory: planned peak {gib_text(m['peak_bytes'])} per GPU in {m['peak_phase']} > cluster.gpu.memory_gib "
            f"{c.memory_gib:g} ({c.gpu}), {gib_text(m['peak_bytes'] - m['gpu_bytes'])} over: {plan.arch.name} "
            f"{plan.settings.strategy} train tp{t.tp} pp{t.pp} cp{t.cp} dp{t.dp}, infer tp{i.tp}, "
            f"offload {plan.settings.offload}, {UTILIZATION_KEY} {plan.settings.gpu_memory_utilization:g}, "
            f"on {c.nnodes}x{c.gpus_per_node} GPUs")


# -- the search ---------------------------------------------------------------------------------------------------

Layout = tuple[ClusterSpec, TrainLayout, InferLayout]


@dataclass(frozen=True)
class _Option:
    overrides: tuple[str, ...]
    layout: Layout


class _Search:
    """Re-plans with memos: one plan per layout, the memory model alone for a change of settings."""

    def __init__(self, base: Plan, admissible: Admissible | None):
        self.base = base
        self.admissible = admissible
        self.plans: dict[Layout, Plan | None] = {(base.cluster, base.train, base.infer): base}

    def plan(self, layout: Layout) -> Plan | None:
        """The plan of a layout with the run's settings; None when the planner or validation refuses the layout."""
        if layout not in self.plans:
            cluster, train, infer = layout
            try:
                plan = build_plan(self.base.arch, train, infer, cluster, self.base.settings, spec=self.base.spec)
            except LayoutError:
                plan = None
            if plan is not None and (plan.errors or plan.memory is None or plan.groups is None):
                plan = None
            if plan is not None and self.admissible is not None and not self.admissible(plan.train, plan.infer):
                plan = None
            self.plans[layout] = plan
        return self.plans[layout]

    @staticmethod
    def memory(plan: Plan, settings: PlanSettings) -> dict:
        if settings == plan.settings:
            return plan.memory
        return estimate_memory(plan.spec, plan.groups, plan.cluster, settings, plan.memory["rollout"]["weights"])

    @staticmethod
    def fits(memory: dict, settings: PlanSettings) -> bool:
        return bool(memory["fits"]) and memory["rollout"]["kv_cache_tokens"] >= settings.sequence_length

    def offload(self, plan: Plan, names: tuple[str, ...]) -> tuple[str, dict] | None:
        """The mildest of ``names`` (mildest first) that fits on ``plan``'s layout; ``full`` (it holds the least) is
        tried first: when it does not fit, neither does a milder one."""
        tries = {name: _with_offload(plan.settings, name) for name in names}
        memories = {}
        if "full" in names:
            memories["full"] = self.memory(plan, tries["full"])
            if not self.fits(memories["full"], tries["full"]):
                return None
        for name in names:
            memory = memories.get(name) or self.memory(plan, tries[name])
            if self.fits(memory, tries[name]):
                return name, memory
        return None

    def manual_offload(self, plan: Plan) -> dict | None:
        """FSDP2's offload=full keeps every state on the host and steps AdamW there; where the host cannot hold them,
        FSDP1's manual offload keeps them there only between phases (the update loads them back) and AdamW's
        foreach temporary off: the memory of that, where it fits."""
        if plan.settings.strategy != "fsdp2":
            return None
        settings = replace(_with_offload(plan.settings, "full"), strategy="fsdp", offload_policy=False,
                           optimizer_foreach=False)
        if settings.use_dynamic_bsz:  # the auto budgets, as validation sizes them again with these overrides
            budgets = auto_token_budgets(plan.spec, plan.groups, plan.cluster, settings,
                                         plan.memory["rollout"]["weights"])
            if not budgets["fits"]:
                return None
            settings = replace(settings, ppo_max_token_len_per_gpu=budgets["ppo_max_token_len_per_gpu"],
                               log_prob_max_token_len_per_gpu=budgets["log_prob_max_token_len_per_gpu"])
        memory = self.memory(plan, settings)
        return memory if self.fits(memory, settings) else None

    def utilization(self, plan: Plan, settings: PlanSettings) -> tuple[float, dict] | None:
        """The largest rollout share (a multiple of 0.05, below the run's) that fits on ``plan``'s layout with
        ``settings``, its KV cache holding one sequence; a few re-plans, each aimed at the peak's excess."""
        gpu = plan.cluster.memory_bytes
        memory = self.memory(plan, settings)
        weights = memory["rollout"]["weights"]
        one_sequence = weights + settings.sequence_length * memory["rollout"]["kv_bytes_per_token"]
        steps = math.ceil(round(settings.gpu_memory_utilization * UTILIZATION_STEP, 6))  # the run's share, rounded up
        for _ in range(4):
            excess = memory["peak_bytes"] + settings.min_headroom_gib * GIB - gpu
            aim = (settings.gpu_memory_utilization - excess / gpu) * UTILIZATION_STEP
            steps = min(steps - 1, math.floor(round(aim, 6)))
            share = steps / UTILIZATION_STEP
            if steps < 1 or int(share * gpu) < one_sequence:
                return None
            lower = replace(settings, gpu_memory_utilization=share)
            new = self.memory(plan, lower)
            if self.fits(new, lower):
                return share, new
            phase = new["peak_phase"]
            if new["phases"][phase] == memory["phases"][phase]:
                return None  # the peak is now a phase the rollout's share is not part of
            memory, settings = new, lower
        return None

    def layout_fit(self, options: list[_Option]) -> tuple[_Option, Plan] | None:
        """The first (smallest) option whose plan fits; more GPUs or tensor ranks only lower the peak, so when the
        largest valid option does not fit, none does."""
        if not options:
            return None
        last = self.plan(options[-1].layout)
        if last is not None and not self.fits(last.memory, last.settings):
            return None
        for option in options:
            plan = self.plan(option.layout)
            if plan is not None and self.fits(plan.memory, plan.settings):
                return option, plan
        return None


def _with_offload(settings: PlanSettings, name: str) -> PlanSettings:
    """The settings ``offload=<name>`` gives (recipes.check.plan.plan_settings reads offload.param /
    offload.optimizer)."""
    return replace(settings, param_offload=name in ("param", "full"), optimizer_offload=name in ("optimizer", "full"),
                   offload_policy=name == "full")


def _offload_names(settings: PlanSettings) -> tuple[str, ...]:
    """The offload options that keep every offload already on and add one."""
    out = []
    for name in OFFLOADS:
        param, optimizer = name in ("param", "full"), name in ("optimizer", "full")
        if param >= settings.param_offload and optimizer >= settings.optimizer_offload and name != settings.offload:
            out.append(name)
    return tuple(out)


def _layout_axes(base: Plan, free: bool) -> list[list[_Option]]:
    """Larger layout.train.tp (Megatron), larger layout.infer.tp (the generation shard: the rollout's share must hold
    it) and more cluster.nnodes, each axis smallest first."""
    if not free:
        return []
    c, t, i = base.cluster, base.train, base.infer
    axes = []
    if base.settings.strategy == "megatron":
        axes.append(_wider_tp("layout.train.tp", t, t.pp * t.cp, c, lambda train: (c, train, i)))
    axes.append(_wider_tp("layout.infer.tp", i, i.pp, c, lambda infer: (c, t, infer)))
    nodes = []
    for factor in FACTORS:
        try:
            layout = (replace(c, nnodes=c.nnodes * factor), replace(t, dp=-1), replace(i, dp=-1))
        except LayoutError:
            continue
        nodes.append(_Option((f"cluster.nnodes={c.nnodes * factor}",), layout))
    axes.append(nodes)
    return [axis for axis in axes if axis]


def _wider_tp(key: str, layout, ranks_beside_tp: int, cluster, layouts: Callable) -> list[_Option]:
    """``layout`` (train or infer) at 2x and 4x its tp, dp derived again, where an engine stays inside a node and the
    world divides ``tp * ranks_beside_tp``; ``layouts(wider)`` is the (cluster, train, infer) to plan."""
    out = []
    for factor in FACTORS:
        size = layout.tp * factor
        if size > cluster.gpus_per_node or cluster.world_size % (size * ranks_beside_tp):
            continue
        try:
            wider = replace(layout, tp=size, dp=-1)
        except LayoutError:
            continue
        out.append(_Option((f"{key}={size}",), layouts(wider)))
    return out


def suggest(base: Plan, *, layout_free: bool = True, admissible: Admissible | None = None, limit: int = 3,
            offload_overrides: Callable[[str], tuple[str, ...]] | None = None) -> list[Suggestion]:
    """Up to ``limit`` changes that make ``base`` fit, each re-planned: single changes first (offload, lower rollout
    share, larger train or generation tp, more nodes), then, for the axes no single change fixed, two together.
    ``layout_free``: dp is derived (``layout_free(cfg)``), so tp and nnodes may change; ``offload_overrides(name)``:
    how an offload is typed (default ``offload=<name>``)."""
    typed = offload_overrides or (lambda name: (f"offload={name}",))
    search = _Search(base, admissible)
    settings = base.settings
    offloads = _offload_names(settings)
    axes = _layout_axes(base, layout_free)
    found: list[Suggestion] = []

    def add(overrides, memory):
        found.append(Suggestion(tuple(overrides), int(memory["peak_bytes"]), str(memory["peak_phase"])))

    # one change
    single_offload = search.offload(base, offloads)
    if single_offload:
        add(typed(single_offload[0]), single_offload[1])
    else:
        manual = search.manual_offload(base)
        if manual:
            add([*(o for o in typed("full") if not o.startswith(POLICY_KEY)), *MANUAL_OFFLOAD], manual)
    single_share = search.utilization(base, settings)
    if single_share:
        add([f"{UTILIZATION_KEY}={single_share[0]:g}"], single_share[1])
    open_axes = []
    for axis in axes:
        hit = search.layout_fit(axis)
        if hit:
            add(hit[0].overrides, hit[1].memory)
        else:
            open_axes.append(axis)
    # two changes: offloads milder than one that fits alone; layouts and shares that did not fit alone
    milder = offloads[:offloads.index(single_offload[0])] if single_offload else offloads
    for axis in open_axes:
        if len(found) >= limit:
            break
        for option in axis:
            plan = search.plan(option.layout)
            hit = search.offload(plan, milder) if plan is not None else None
            if hit:
                add([*typed(hit[0]), *option.overrides], hit[1])
                break
    if not single_share:
        for name in milder:
            if len(found) >= limit:
                break
            hit = search.utilization(base, _with_offload(settings, name))
            if hit:
                add([*typed(name), f"{UTILIZATION_KEY}={hit[0]:g}"], hit[1])
                break
        for axis in open_axes:
            if len(found) >= limit:
                break
            for option in axis:
                plan = search.plan(option.layout)
                hit = search.utilization(plan, plan.settings) if plan is not None else None
                if hit:
                    add([*option.overrides, f"{UTILIZATION_KEY}={hit[0]:g}"], hit[1])
                    break
    return found[:limit]
