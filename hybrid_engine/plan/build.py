"""The plan: layouts, HybridFlow groups, bytes moved and memory per GPU, before any GPU starts (``action=plan``).

Entry point for the recipes::

    plan = build_plan(arch, train, infer, cluster, settings)
    print(plan.render_table()); plan.draw_picture("plan.png"); json.dump(plan.to_dict(), f)

``build_plan`` never raises for a bad run configuration: problems land in ``plan.errors`` (every one names its key)
and the parts that could not be computed are left out. ``plan.raise_for_errors()`` turns them into one LayoutError.

A layout verl runs but the HybridFlow scheme cannot take (infer.tp not dividing train.tp, e.g. verl's Megatron
"diff TP" example) is planned with verl's placement (``HybridGroups.placement == "verl"``): bytes of verl's own sync
(``tp_group_gather`` under Megatron, ``full_gather`` under FSDP) and the reference ``full_gather``;
``plan.sync_path`` says in one line which path applies and why.

Byte counting is defined in plan/bytes.py; the memory model in plan/memory.py; the JSON document (its schema), the
text table and the picture in plan/render.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hybrid_engine.groups import HybridGroups, hybrid_groups
from hybrid_engine.layout import InferLayout, LayoutError, TrainLayout, check_compatible
from hybrid_engine.model_spec import ModelArch, ModelSpec, build_spec
from hybrid_engine.plan import render
from hybrid_engine.plan.bytes import SchemeBytes, compute_bytes, generation_shard_peak
from hybrid_engine.plan.memory import estimate_memory
from hybrid_engine.plan.render import gib_text, host_text
from hybrid_engine.plan.settings import ClusterSpec, PlanSettings, dtype_bytes

__all__ = ["ClusterSpec", "Plan", "PlanSettings", "build_plan", "plan_from_names"]


@dataclass(kw_only=True)
class Plan:
    """Everything ``action=plan`` reports. Parts that could not be computed are None (see ``errors``)."""

    arch: ModelArch
    train: TrainLayout
    infer: InferLayout
    cluster: ClusterSpec
    settings: PlanSettings
    spec: ModelSpec | None = None
    groups: HybridGroups | None = None
    bytes: dict[str, SchemeBytes] = field(default_factory=dict)
    memory: dict | None = None
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    group_limit: int = 8

    @property
    def world_size(self) -> int:
        return self.cluster.world_size

    @property
    def fits(self) -> bool | None:
        return None if self.memory is None else bool(self.memory["fits"])

    @property
    def headroom_bytes(self) -> int | None:
        return None if self.memory is None else int(self.memory["headroom_bytes"])

    @property
    def zero_redundancy_scheme(self) -> str | None:
        """The scheme the 3D-HybridEngine runs: hybridflow (Megatron shards) or fsdp_to_tp (FSDP shards)."""
        for name in ("hybridflow", "fsdp_to_tp"):
            if name in self.bytes:
                return name
        return None

    @property
    def sync_path(self) -> dict | None:
        """Which weight sync applies: ``{"by": "hybrid_engine" | "verl", "scheme": ..., "line": one sentence}``; the
        pack's resharder where the HybridFlow scheme takes the layout, verl's own path otherwise. None without
        groups."""
        g = self.groups
        if g is None:
            return None
        t, i = self.train, self.infer
        if g.hybridflow and g.fsdp:
            return {"by": "hybrid_engine", "scheme": "fsdp_to_tp",
                    "line": f"the pack's resharder (fsdp_to_tp: FSDP Shard(0) over {g.world_size} ranks -> generation"
                            f" TP {g.t_g}, zero redundancy)"}
        if g.hybridflow:
            return {"by": "hybrid_engine", "scheme": "hybridflow",
                    "line": f"the pack's resharder (hybridflow: micro-DP all-gather of d_g={g.d_g}; infer.tp({i.tp})"
                            f" divides train.tp({t.tp}) and infer.pp({i.pp}) divides train.pp({t.pp}))"}
        scheme = "full_gather" if g.fsdp else "tp_group_gather"
        why = [f"infer.{axis} {b} does not divide train.{axis} {a}"
               for axis, a, b in (("tp", t.tp, i.tp), ("pp", t.pp, i.pp), ("ep", t.ep, i.ep))
               if not g.fsdp and a % b and (axis != "ep" or b > 1)]
        if not g.fsdp and t.ep > 1 and t.etp is not None and t.etp != t.tp:
            why.append(f"experts split over etp {t.etp} != tp {t.tp} tensor ranks (MoE parallel folding)")
        if g.fsdp:
            why.append(f"FSDP shards are resharded for infer.pp 1, not {i.pp}")
        elif not why:
            why.append("train tp = pp = 1 holds whole models, no shards to gather from")
        how = ("every GPU gathers the whole model from FSDP shards" if g.fsdp
               else "the whole model on every GPU: TP-group all-gather per stage + pipeline broadcast")
        return {"by": "verl", "scheme": scheme,
                "line": f"verl's own ({scheme}: {how}); the pack's resharder needs infer.tp | train.tp and"
                        f" infer.pp | train.pp: {', '.join(why)}"}

    @property
    def model_bytes(self) -> int:
        return 0 if self.spec is None else self.spec.numel * dtype_bytes(self.settings.dtype)

    def raise_for_errors(self) -> None:
        if self.errors:
            raise LayoutError(self.errors)

    # -- presentation (render.py) ------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """The JSON document (schema: ``hybrid_engine.plan.render``)."""
        return render.plan_to_dict(self)

    def render_table(self) -> str:
        """A readable report: layouts, groups (first few), bytes per scheme, memory breakdown, warnings, errors."""
        return render.render_table(self)

    def draw_picture(self, path, max_cells: int = 256) -> None:
        """One training replica's rank grid, coloured by micro-DP group; PNG or SVG by the suffix of ``path``."""
        render.draw_picture(self, path, max_cells)


def _resolve(layout, world_size: int, world_desc: str, errors: list[str]):
    try:
        return layout.resolve(world_size, world_desc=world_desc)
    except LayoutError as error:
        errors.extend(error.problems)
        return None


def _warnings(plan: Plan, spec: ModelSpec) -> list[str]:
    arch, train, infer, s = plan.arch, plan.train, plan.infer, plan.settings
    out = []
    seq = s.sequence_length
    if s.use_dynamic_bsz and s.ppo_max_token_len_per_gpu < 2 * seq:
        out.append(
            f"actor.ppo_max_token_len_per_gpu: {s.ppo_max_token_len_per_gpu} < 2 * (max_prompt_length"
            f" {s.max_prompt_length} + max_response_length {s.max_response_length}) = {2 * seq}:"
            " micro-batches hold at most one full-length sequence"
        )
    log_prob = s.log_prob_max_token_len_per_gpu
    if s.use_dynamic_bsz and log_prob is not None and log_prob < 2 * seq:
        out.append(f"log_prob_max_token_len_per_gpu: {log_prob} < 2 * (prompt + response) = {2 * seq}")
    kv = arch.num_key_value_heads
    if not arch.is_mla:
        for key, tp in (("layout.train.tp", train.tp), ("layout.infer.tp", infer.tp)):
            if tp > kv:
                out.append(
                    f"{key}: tp({tp}) > num_key_value_heads({kv}): each kv head is replicated on {tp // kv} GPUs"
                    + (" (Megatron-core refuses tp > query groups)" if key.endswith("train.tp") else "")
                )
        for key, tp in (("layout.train.tp", train.tp), ("layout.infer.tp", infer.tp)):
            if arch.num_attention_heads % tp:
                out.append(
                    f"{key}: num_attention_heads({arch.num_attention_heads}) % tp({tp}) ="
                    f" {arch.num_attention_heads % tp}: Megatron-core and vLLM need heads divisible by tp"
                )
    if train.pp > 1 and arch.num_hidden_layers % train.pp:
        out.append(
            f"layout.train.pp: {arch.num_hidden_layers} layers over pp({train.pp}) stages is uneven"
            f" (planned as {arch.num_hidden_layers // train.pp} or {math.ceil(arch.num_hidden_layers / train.pp)}"
            " layers per stage; Megatron needs num_layers_in_first/last_pipeline_stage for this)"
        )
    if (train.ep > 1 or infer.ep > 1) and not arch.is_moe:
        out.append(f"layout.train.ep/infer.ep: {arch.name} has no experts; ep > 1 does nothing")
    g = plan.groups
    if g is not None:
        spanning = g.spans_nodes("micro_dp", plan.cluster.gpus_per_node)
        if spanning and g.d_g > 1:
            out.append(
                f"groups: {spanning} of {g.num_micro_dp_groups} micro-DP groups span nodes (size {g.d_g}):"
                " the resharding all-gather crosses the network"
            )
    m = plan.memory
    host_rollout = m is not None and m["rollout"]["gpu_memory_utilization"]["max"] is None
    if m is not None and not host_rollout:
        if m["rollout"]["kv_cache"] <= 0:
            out.append(
                f"rollout.gpu_memory_utilization: {s.gpu_memory_utilization} of the GPU"
                f" ({gib_text(m['rollout']['reserved'])}) does not hold the generation weights"
                f" ({gib_text(m['rollout']['weights'])})"
            )
        elif m["rollout"]["kv_cache_tokens"] < seq:
            out.append(
                f"rollout: KV cache holds {m['rollout']['kv_cache_tokens']} tokens < one sequence ({seq} tokens)"
            )
    if m is not None:
        share = m["rollout"]["gpu_memory_utilization"]
        if share["max"] is not None and not share["ok"]:
            out.append(
                f"rollout.gpu_memory_utilization: {share['configured']:g} is outside {share['min']:.2f} to"
                f" {share['max']:.2f}, the share that leaves the training side its peak plus"
                f" {s.min_headroom_gib:g} GiB headroom when the engine wakes (and holds its weights and one sequence):"
                f" {share['why']}"
            )
        if m["host"]["fits"] is False:
            out.append(f"memory: host {host_text(m['host'], plan.cluster.gpus_per_node)}")
        if not m["gpu_fits"]:
            out.append(
                f"memory: peak {gib_text(m['peak_bytes'])} in {m['peak_phase']} leaves"
                f" {gib_text(m['headroom_bytes'])} of"
                f" {gib_text(m['gpu_bytes'])} (want >= {s.min_headroom_gib:g} GiB): does not fit"
            )
    return out


def build_plan(
    arch: ModelArch,
    train: TrainLayout,
    infer: InferLayout,
    cluster: ClusterSpec,
    settings: PlanSettings,
    *,
    spec: ModelSpec | None = None,
    spec_method: str = "auto",
    group_limit: int = 8,
) -> Plan:
    """Plan a run: resolve the layouts on the cluster, build the tensor spec (analytic fast path when the family is
    known), the HybridFlow groups, bytes per scheme with time estimates, and memory per GPU. Never raises for a bad
    run configuration: see ``Plan.errors``."""
    errors = list(settings.problems())
    world, desc = cluster.world_size, cluster.world_desc
    resolved_train = _resolve(train, world, desc, errors)
    resolved_infer = _resolve(infer, world, desc, errors)
    plan = Plan(
        arch=arch,
        train=resolved_train or train,
        infer=resolved_infer or infer,
        cluster=cluster,
        settings=settings,
        group_limit=group_limit,
    )
    plan.spec = spec if spec is not None else build_spec(arch, spec_method)
    if settings.is_fsdp and (train.tp > 1 or train.pp > 1):
        errors.append(
            f"layout.train: strategy {settings.strategy} shards with FSDP only; tp({train.tp}) pp({train.pp}) need"
            " strategy=megatron"
        )
    if resolved_train is not None and resolved_infer is not None and not errors:
        problems = check_compatible(resolved_train, resolved_infer, gpus_per_node=cluster.gpus_per_node)
        if not problems:
            try:
                plan.groups = hybrid_groups(resolved_train, resolved_infer, fsdp=settings.is_fsdp, placement="auto")
            except LayoutError as error:
                problems = error.problems
        errors.extend(problems)
    if plan.groups is not None:
        size = dtype_bytes(settings.dtype)
        plan.bytes = compute_bytes(plan.spec, plan.groups, cluster, size)
        generation_weights = generation_shard_peak(plan.spec, plan.groups, size)
        plan.memory = estimate_memory(plan.spec, plan.groups, cluster, settings, generation_weights)
    plan.errors = errors
    plan.warnings = _warnings(plan, plan.spec)
    return plan


def plan_from_names(
    model: str,
    train: dict,
    infer: dict,
    *,
    cluster: ClusterSpec | None = None,
    settings: PlanSettings | None = None,
) -> Plan:
    """Convenience for scripts and tests: ``plan_from_names("qwen2_7b", {"tp": 8, "pp": 4}, {"tp": 4})``."""
    from hybrid_engine.model_spec import load_arch

    cluster = cluster or ClusterSpec()
    settings = settings or PlanSettings()
    return build_plan(load_arch(model), TrainLayout(**train), InferLayout(**infer), cluster, settings)
