"""The plan: layouts, HybridFlow groups, bytes moved and memory per GPU, before any GPU starts (``action=plan``).

Entry point for the recipes::

    plan = build_plan(arch, train, infer, cluster, settings)
    print(plan.render_table()); plan.draw_picture("plan.png"); json.dump(plan.to_dict(), f)

``build_plan`` never raises for a bad run configuration: problems land in ``plan.errors`` (every one names its key)
and the parts that could not be computed are left out. ``plan.raise_for_errors()`` turns them into one LayoutError.

JSON schema of ``Plan.to_dict()`` (bytes are integers, times seconds)::

    {
      "model": {"name", "model_type", "params", "model_bytes", "spec_method", "arch": {...ModelArch fields}},
      "world_size": int,
      "cluster": {...ClusterSpec fields},
      "settings": {...PlanSettings fields},
      "layouts": {"train": {"dp","tp","pp","cp","ep","order"}, "infer": {"tp","pp","dp","ep","order"}},
      "groups": {"t","p","d","t_g","p_g","k_t","k_p","d_g","fsdp",
                 "counts": {"micro_dp","gen_tp","gen_pp","engines"},
                 "micro_dp": [[rank,...], ...], "gen_tp": [...], "gen_pp": [...],   # first `group_limit` groups
                 "truncated": bool, "micro_dp_groups_spanning_nodes": int},
      "bytes": {scheme: {"description", "table2_formula",
                         "per_gpu_received_bytes": {"max","min","mean"}, "per_gpu_fraction_of_model": "7/32 M",
                         "total_received_bytes", "peak_param_bytes", "time_s",
                         "phases": [{"name","link","max_bytes","seconds"}]}},
      "time_s": {scheme: seconds},
      "zero_redundancy_scheme": "hybridflow" | "fsdp_to_tp" | null,
      "memory": {...see memory.estimate_memory: gpu_bytes, actor, critic, ref_params, activations, rollout,
                 phases, peak_phase, peak_bytes, headroom_bytes, fits},
      "fits": bool | null, "headroom_bytes": int | null,
      "warnings": [str], "errors": [str]
    }

Byte counting is defined in plan/bytes.py; the memory model in plan/memory.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hybrid_engine.groups import HybridGroups, hybrid_groups
from hybrid_engine.layout import InferLayout, LayoutError, TrainLayout, check_compatible
from hybrid_engine.model_spec import ModelArch, ModelSpec, build_spec
from hybrid_engine.plan.bytes import SCHEMES, SchemeBytes, compute_bytes, fraction_text
from hybrid_engine.plan.memory import estimate_memory
from hybrid_engine.plan.settings import GIB, ClusterSpec, PlanSettings, dtype_bytes

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
    def model_bytes(self) -> int:
        return 0 if self.spec is None else self.spec.numel * dtype_bytes(self.settings.dtype)

    def raise_for_errors(self) -> None:
        if self.errors:
            raise LayoutError(self.errors)

    # -- JSON ----------------------------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        groups = None
        if self.groups is not None:
            groups = self.groups.to_dict(self.group_limit)
            groups["micro_dp_groups_spanning_nodes"] = self.groups.spans_nodes("micro_dp", self.cluster.gpus_per_node)
        return {
            "model": {
                "name": self.arch.name,
                "model_type": self.arch.model_type,
                "params": None if self.spec is None else self.spec.numel,
                "model_bytes": self.model_bytes,
                "spec_method": None if self.spec is None else self.spec.method,
                "arch": self.arch.to_dict(),
            },
            "world_size": self.world_size,
            "cluster": self.cluster.to_dict(),
            "settings": self.settings.to_dict(),
            "layouts": {"train": self.train.to_dict(), "infer": self.infer.to_dict()},
            "groups": groups,
            "bytes": {name: scheme.to_dict() for name, scheme in self.bytes.items()},
            "time_s": {name: scheme.time_s for name, scheme in self.bytes.items()},
            "zero_redundancy_scheme": self.zero_redundancy_scheme,
            "memory": self.memory,
            "fits": self.fits,
            "headroom_bytes": self.headroom_bytes,
            "warnings": list(self.warnings),
            "errors": list(self.errors),
        }

    # -- text ----------------------------------------------------------------------------------------------------------
    def render_table(self) -> str:
        """A readable report: layouts, groups (first few), bytes per scheme, memory breakdown, warnings, errors."""
        lines = []
        arch = self.arch
        params = f"{self.spec.numel / 1e9:.2f} B params, M = {_gib(self.model_bytes)}" if self.spec else ""
        lines.append(f"model    {arch.name} ({arch.model_type}) {params} in {self.settings.dtype}")
        c = self.cluster
        lines.append(
            f"cluster  {c.nnodes} x {c.gpus_per_node} {c.gpu} ({c.memory_gib:g} GiB) = {c.world_size} GPUs;"
            f" NVLink {c.nvlink_GBps:g} GB/s, network {c.network_GBps:g} GB/s per GPU"
        )
        t, i = self.train, self.infer
        lines.append(
            f"train    {self.settings.strategy}: dp={t.dp} tp={t.tp} pp={t.pp} cp={t.cp} ep={t.ep} (order {t.order})"
        )
        lines.append(f"infer    tp={i.tp} pp={i.pp} dp={i.dp} ep={i.ep}")
        g = self.groups
        if g is not None:
            lines.append("")
            lines.append(
                f"groups   t={g.t} p={g.p} d={g.d} -> t_g={g.t_g} p_g={g.p_g}: k_t={g.k_t} k_p={g.k_p},"
                f" micro-DP size d_g={g.d_g}"
            )
            for kind, label, count in (
                ("micro_dp", "micro-DP", g.num_micro_dp_groups),
                ("gen_tp", "gen TP", g.num_gen_tp_groups),
                ("gen_pp", "gen PP", g.num_gen_pp_groups),
            ):
                shown = g.groups(kind, limit=4)
                noun = "group" if count == 1 else "groups"
                more = f" ... ({count} {noun})" if count > len(shown) else f" ({count} {noun})"
                lines.append(f"  {label:<9}" + " ".join("{" + ",".join(map(str, grp)) + "}" for grp in shown) + more)
        if self.bytes:
            lines.append("")
            lines.append(
                f"{'scheme':<16}{'received/GPU':>14}{'of M':>12}{'Table 2':>22}{'peak params':>13}{'time':>10}  links"
            )
            for name, scheme in self.bytes.items():
                links = "+".join(sorted({p.link for p in scheme.phases}))
                lines.append(
                    f"{name:<16}{_gib(scheme.max):>14}{fraction_text(scheme.fraction):>12}"
                    f"{SCHEMES[name][0]:>22}{_gib(scheme.peak_param_bytes):>13}{_seconds(scheme.time_s):>10}  {links}"
                )
        if self.memory is not None:
            m = self.memory
            lines.append("")
            lines.append(f"memory per GPU ({_gib(m['gpu_bytes'])})")
            actor = m["actor"]
            lines.append(
                "  actor    params {}  grads {}  master {}  optimizer {}  unsharded layers {}".format(
                    *(_gib(actor[k]) for k in ("params", "grads", "master_weights", "optimizer", "unsharded_layers"))
                )
            )
            if m["critic"]:
                lines.append(f"  critic   same as actor ({_gib(sum(m['critic'].values()))})")
            if m["ref_params"]:
                lines.append(f"  ref      params {_gib(m['ref_params'])}")
            acts = m["activations"]
            lines.append(
                f"  acts     {acts['tokens_per_micro_batch']} tokens/micro-batch:"
                f" activations {_gib(acts['activations'])} logits {_gib(acts['logits'])}  [{acts['formula']}]"
            )
            r = m["rollout"]
            lines.append(
                f"  rollout  reserved {_gib(r['reserved'])}: weights {_gib(r['weights'])}"
                f" KV cache {_gib(r['kv_cache'])} = {r['kv_cache_tokens']} tokens ({r['sequences_in_cache']} sequences)"
            )
            lines.append("  phases   " + "  ".join(f"{k} {_gib(v)}" for k, v in m["phases"].items()))
            verdict = "fits" if m["fits"] else "DOES NOT FIT"
            lines.append(
                f"  peak     {_gib(m['peak_bytes'])} in {m['peak_phase']},"
                f" headroom {_gib(m['headroom_bytes'])}: {verdict}"
            )
        for title, items in (("warnings", self.warnings), ("errors", self.errors)):
            if items:
                lines.append("")
                lines.append(f"{title}:")
                lines.extend(f"  - {item}" for item in items)
        return "\n".join(lines)

    # -- picture -------------------------------------------------------------------------------------------------------
    def draw_picture(self, path, max_cells: int = 256) -> None:
        """Draw one training replica's rank grid (stages x TP ranks), coloured by micro-DP group, with generation TP
        groups as lines. PNG or SVG by the suffix of ``path``. Large grids show the first stages only."""
        if self.groups is None:
            raise LayoutError(self.errors or ["no groups to draw"])
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        g = self.groups
        cols = min(g.t, 64)
        rows = max(1, min(g.p, max_cells // cols))
        fig, ax = plt.subplots(figsize=(max(4.0, 0.9 * cols + 1.5), max(2.5, 0.8 * rows + 1.5)))
        cmap = plt.get_cmap("tab20")
        for stage in range(rows):
            for tp in range(cols):
                rank = int(g.rank_of(0, stage, tp))
                info = g.rank_info(rank)
                group_index = (info.gen_pp * g.t_g + info.gen_tp) % 20
                y = rows - 1 - stage
                ax.add_patch(plt.Rectangle((tp, y), 0.95, 0.9, color=cmap(group_index), alpha=0.85))
                ax.text(tp + 0.47, y + 0.55, str(rank), ha="center", va="center", fontsize=8, weight="bold")
                ax.text(tp + 0.47, y + 0.22, f"τ{info.gen_tp} μ{info.micro_dp}", ha="center", va="center", fontsize=6)
        for stage in range(rows):
            for low in range(min(g.k_t, cols)):
                xs = [tau * g.k_t + low + 0.47 for tau in range(g.t_g) if tau * g.k_t + low < cols]
                y = rows - 1 - stage + 0.06 + 0.1 * low
                if len(xs) > 1:
                    ax.plot(xs, [y] * len(xs), color="black", linewidth=0.8, alpha=0.6)
        ax.set_xlim(-0.2, cols + 0.2)
        ax.set_ylim(-0.2, rows + 0.2)
        ax.set_xticks([c + 0.47 for c in range(cols)], [f"tp{c}" for c in range(cols)], fontsize=7)
        ax.set_yticks([rows - 1 - s + 0.45 for s in range(rows)], [f"pp{s}" for s in range(rows)], fontsize=7)
        shown = "" if rows == g.p and cols == g.t else f" (first {rows} of {g.p} stages, {cols} of {g.t} TP ranks)"
        ax.set_title(
            f"{self.arch.name}: train t={g.t} p={g.p} d={g.d} -> gen t_g={g.t_g} p_g={g.p_g}; colour = micro-DP group,"
            f" line = gen TP group{shown}",
            fontsize=8,
        )
        ax.set_aspect("equal")
        fig.tight_layout()
        suffix = str(path).rsplit(".", 1)[-1].lower()
        if suffix not in ("png", "svg"):
            plt.close(fig)
            raise ValueError(f"draw_picture: path must end in .png or .svg, got {path}")
        fig.savefig(path, format=suffix, dpi=120)
        plt.close(fig)


def _gib(value: int | float) -> str:
    return f"{value / GIB:.2f} GiB"


def _seconds(value: float) -> str:
    return f"{value * 1e3:.1f} ms" if value < 1 else f"{value:.2f} s"


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
    if m is not None:
        if m["rollout"]["kv_cache"] <= 0:
            out.append(
                f"rollout.gpu_memory_utilization: {s.gpu_memory_utilization} of the GPU"
                f" ({_gib(m['rollout']['reserved'])}) does not hold the generation weights"
                f" ({_gib(m['rollout']['weights'])})"
            )
        elif m["rollout"]["kv_cache_tokens"] < seq:
            out.append(
                f"rollout: KV cache holds {m['rollout']['kv_cache_tokens']} tokens < one sequence ({seq} tokens)"
            )
        if not m["fits"]:
            out.append(
                f"memory: peak {_gib(m['peak_bytes'])} in {m['peak_phase']} leaves {_gib(m['headroom_bytes'])} of"
                f" {_gib(m['gpu_bytes'])} (want >= {s.min_headroom_gib:g} GiB): does not fit"
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
        problems = check_compatible(resolved_train, resolved_infer)
        if not problems:
            try:
                plan.groups = hybrid_groups(resolved_train, resolved_infer, fsdp=settings.is_fsdp)
            except LayoutError as error:
                problems = error.problems
        errors.extend(problems)
    if plan.groups is not None:
        size = dtype_bytes(settings.dtype)
        plan.bytes = compute_bytes(plan.spec, plan.groups, cluster, size)
        generation_weights = plan.bytes[plan.zero_redundancy_scheme].peak_param_bytes
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
