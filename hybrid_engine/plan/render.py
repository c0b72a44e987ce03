"""How a plan is shown: the JSON document (``action=plan plan.format=json``), the text table and the rank-grid
picture. Pure functions of a ``Plan`` (``build.py``); ``Plan.to_dict()``, ``Plan.render_table()`` and
``Plan.draw_picture()`` call them.

JSON schema of ``Plan.to_dict()`` (bytes are integers, times seconds)::

    {
      "model": {"name", "model_type", "params", "model_bytes", "spec_method", "arch": {...ModelArch fields}},
      "world_size": int,
      "cluster": {...ClusterSpec fields},
      "settings": {...PlanSettings fields},
      "layouts": {"train": {"dp","tp","pp","cp","ep","order"}, "infer": {"tp","pp","dp","ep","order"}},
      "groups": {"t","p","d","t_g","p_g","k_t","k_p","d_g","fsdp","placement",   # placement verl: k_t = k_p = d_g = 0
                 "counts": {"micro_dp","gen_tp","gen_pp","engines"},
                 "micro_dp": [[rank,...], ...], "gen_tp": [...], "gen_pp": [...],   # first `group_limit` groups
                 "truncated": bool, "micro_dp_groups_spanning_nodes": int},
      "bytes": {scheme: {"description", "table2_formula",
                         "per_gpu_received_bytes": {"max","min","mean"}, "per_gpu_fraction_of_model": "7/32 M",
                         "total_received_bytes", "peak_param_bytes", "time_s",
                         "phases": [{"name","link","max_bytes","seconds"}]}},
      "time_s": {scheme: seconds},
      "zero_redundancy_scheme": "hybridflow" | "fsdp_to_tp" | null,
      "sync_path": {"by": "hybrid_engine" | "verl", "scheme", "line"} | null,
      "memory": {...see memory.estimate_memory: gpu_bytes, actor, critic, ref_params, activations, rollout,
                 phases, peak_phase, peak_bytes, headroom_bytes, fits},
      "fits": bool | null, "headroom_bytes": int | null,
      "warnings": [str], "errors": [str]
    }
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybrid_engine.layout import LayoutError
from hybrid_engine.plan.bytes import SCHEMES, fraction_text
from hybrid_engine.plan.settings import GIB

if TYPE_CHECKING:
    from hybrid_engine.plan.build import Plan

__all__ = ["draw_picture", "gib_text", "plan_to_dict", "render_table", "seconds_text"]


def gib_text(value: int | float) -> str:
    return f"{value / GIB:.2f} GiB"


def host_text(host: dict, gpus_per_node: int) -> str:
    """The offloaded states in one machine's CPU memory, and whether they fit it (with the arithmetic)."""
    text = (f"offloaded {gib_text(host['per_node'])} per node ({gib_text(host['per_gpu'])} per GPU x "
            f"{gpus_per_node})")
    if host["memory_gib"] is None:
        return f"{text}; cluster.host_memory_gib not set: not checked"
    verdict = "fits" if host["fits"] else "DOES NOT FIT"
    return (f"{text} + {host['headroom_gib']:g} GiB for the processes vs cluster.host_memory_gib "
            f"{host['memory_gib']:g}: {verdict}")


def seconds_text(value: float) -> str:
    return f"{value * 1e3:.1f} ms" if value < 1 else f"{value:.2f} s"


# -- JSON --------------------------------------------------------------------------------------------------------------
def plan_to_dict(plan: Plan) -> dict:
    """The JSON document of ``Plan.to_dict()`` (schema in the module docstring)."""
    groups = None
    if plan.groups is not None:
        groups = plan.groups.to_dict(plan.group_limit)
        groups["micro_dp_groups_spanning_nodes"] = plan.groups.spans_nodes("micro_dp", plan.cluster.gpus_per_node)
    return {
        "model": {
            "name": plan.arch.name,
            "model_type": plan.arch.model_type,
            "params": None if plan.spec is None else plan.spec.numel,
            "model_bytes": plan.model_bytes,
            "spec_method": None if plan.spec is None else plan.spec.method,
            "arch": plan.arch.to_dict(),
        },
        "world_size": plan.world_size,
        "cluster": plan.cluster.to_dict(),
        "settings": plan.settings.to_dict(),
        "layouts": {"train": plan.train.to_dict(), "infer": plan.infer.to_dict()},
        "groups": groups,
        "bytes": {name: scheme.to_dict() for name, scheme in plan.bytes.items()},
        "time_s": {name: scheme.time_s for name, scheme in plan.bytes.items()},
        "zero_redundancy_scheme": plan.zero_redundancy_scheme,
        "sync_path": plan.sync_path,
        "memory": plan.memory,
        "fits": plan.fits,
        "headroom_bytes": plan.headroom_bytes,
        "warnings": list(plan.warnings),
        "errors": list(plan.errors),
    }


# -- text --------------------------------------------------------------------------------------------------------------
def render_table(plan: Plan) -> str:
    """A readable report: layouts, groups (first few), bytes per scheme, memory breakdown, warnings, errors."""
    lines = []
    arch = plan.arch
    params = f"{plan.spec.numel / 1e9:.2f} B params, M = {gib_text(plan.model_bytes)}" if plan.spec else ""
    lines.append(f"model    {arch.name} ({arch.model_type}) {params} in {plan.settings.dtype}")
    c = plan.cluster
    lines.append(
        f"cluster  {c.nnodes} x {c.gpus_per_node} {c.gpu} ({c.memory_gib:g} GiB) = {c.world_size} GPUs;"
        f" NVLink {c.nvlink_GBps:g} GB/s, network {c.network_GBps:g} GB/s per GPU"
    )
    t, i = plan.train, plan.infer
    lines.append(
        f"train    {plan.settings.strategy}: dp={t.dp} tp={t.tp} pp={t.pp} cp={t.cp} ep={t.ep} (order {t.order})"
    )
    lines.append(f"infer    tp={i.tp} pp={i.pp} dp={i.dp} ep={i.ep}")
    g = plan.groups
    if g is not None:
        lines.append("")
        if g.hybridflow:
            lines.append(
                f"groups   t={g.t} p={g.p} d={g.d} -> t_g={g.t_g} p_g={g.p_g}: k_t={g.k_t} k_p={g.k_p},"
                f" micro-DP size d_g={g.d_g}"
            )
        else:
            lines.append(
                f"groups   t={g.t} p={g.p} d={g.d} -> t_g={g.t_g} p_g={g.p_g}: verl's placement, engines on"
                f" consecutive ranks; no micro-DP groups"
            )
        kinds = [("gen_tp", "gen TP", g.num_gen_tp_groups), ("gen_pp", "gen PP", g.num_gen_pp_groups)]
        if g.hybridflow:
            kinds.insert(0, ("micro_dp", "micro-DP", g.num_micro_dp_groups))
        for kind, label, count in kinds:
            shown = g.groups(kind, limit=4)
            noun = "group" if count == 1 else "groups"
            more = f" ... ({count} {noun})" if count > len(shown) else f" ({count} {noun})"
            lines.append(f"  {label:<9}" + " ".join("{" + ",".join(map(str, grp)) + "}" for grp in shown) + more)
    sync = plan.sync_path
    if sync is not None:
        lines.append(f"sync     {sync['line']}")
    if plan.bytes:
        lines.append("")
        lines.append(
            f"{'scheme':<16}{'received/GPU':>14}{'of M':>12}{'Table 2':>22}{'peak params':>13}{'time':>10}  links"
        )
        for name, scheme in plan.bytes.items():
            links = "+".join(sorted({p.link for p in scheme.phases}))
            lines.append(
                f"{name:<16}{gib_text(scheme.max):>14}{fraction_text(scheme.fraction):>12}"
                f"{SCHEMES[name][0]:>22}{gib_text(scheme.peak_param_bytes):>13}{seconds_text(scheme.time_s):>10}"
                f"  {links}"
            )
    if plan.memory is not None:
        m = plan.memory
        lines.append("")
        lines.append(f"memory per GPU ({gib_text(m['gpu_bytes'])})")
        actor = m["actor"]
        lines.append(
            "  actor    params {}  grads {}  master {}  optimizer {}  unsharded layers {}".format(
                *(gib_text(actor[k]) for k in ("params", "grads", "master_weights", "optimizer", "unsharded_layers"))
            )
        )
        if m["critic"]:
            lines.append(f"  critic   same as actor ({gib_text(sum(m['critic'].values()))})")
        if m["ref_params"]:
            lines.append(f"  ref      params {gib_text(m['ref_params'])}")
        acts = m["activations"]
        lines.append(
            f"  acts     {acts['tokens_per_micro_batch']} tokens/micro-batch:"
            f" activations {gib_text(acts['activations'])} logits {gib_text(acts['logits'])}  [{acts['formula']}]"
        )
        lines.append(
            f"  log-prob {acts['log_prob_tokens']} tokens/micro-batch: logits {gib_text(acts['log_prob_logits'])}"
            f" (ref, no entropy: {gib_text(acts.get('log_prob_ref_logits', acts['log_prob_logits']))})"
        )
        r = m["rollout"]
        share = r.get("gpu_memory_utilization") or {}
        if share.get("max") is None:
            lines.append(f"  rollout  {r.get('engine', 'hf')}: weights {gib_text(r['weights'])}, nothing reserved"
                         f" ({share.get('why', '')})")
        else:
            lines.append(
                f"  rollout  reserved {gib_text(r['reserved'])}: weights {gib_text(r['weights'])}"
                f" KV cache {gib_text(r['kv_cache'])} = {r['kv_cache_tokens']} tokens"
                f" ({r['sequences_in_cache']} sequences)"
            )
            verdict = "ok" if share["ok"] else "NOT SAFE"
            lines.append(
                f"  share    gpu_memory_utilization {share['configured']:g} configured, {share['min']:.2f} to"
                f" {share['max']:.2f} leaves the training side its peak + headroom when the engine wakes: {verdict}"
            )
        lines.append("  phases   " + "  ".join(f"{k} {gib_text(v)}" for k, v in m["phases"].items()))
        verdict = "fits" if m["gpu_fits"] else "DOES NOT FIT"
        lines.append(
            f"  peak     {gib_text(m['peak_bytes'])} in {m['peak_phase']},"
            f" headroom {gib_text(m['headroom_bytes'])}: {verdict}"
        )
        if m["host"]["per_node"]:
            lines.append(f"  host     {host_text(m['host'], plan.cluster.gpus_per_node)}")
    for title, items in (("warnings", plan.warnings), ("errors", plan.errors)):
        if items:
            lines.append("")
            lines.append(f"{title}:")
            lines.extend(f"  - {item}" for item in items)
    return "\n".join(lines)


# -- picture -----------------------------------------------------------------------------------------------------------
def draw_picture(plan: Plan, path, max_cells: int = 256) -> None:
    """Draw one training replica's rank grid (stages x TP ranks), coloured by micro-DP group, with generation TP
    groups as lines. PNG or SVG by the suffix of ``path``. Large grids show the first stages only."""
    if plan.groups is None:
        raise LayoutError(plan.errors or ["no groups to draw"])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    g = plan.groups
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
            label = f"τ{info.gen_tp} μ{info.micro_dp}" if g.hybridflow else f"τ{info.gen_tp} e{info.engine}"
            ax.text(tp + 0.47, y + 0.22, label, ha="center", va="center", fontsize=6)
    for stage in range(rows if g.hybridflow else 0):
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
    legend = "colour = micro-DP group, line = gen TP group" if g.hybridflow else (
        "verl's placement: colour = gen TP rank and stage, e = engine")
    ax.set_title(
        f"{plan.arch.name}: train t={g.t} p={g.p} d={g.d} -> gen t_g={g.t_g} p_g={g.p_g}; {legend}{shown}",
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
