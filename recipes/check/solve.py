"""``action=plan plan.solve=true``: the layout search for the chosen model, cluster and recipe, printed as ranked
commands.

The search is ``hybrid_engine.plan.solve`` (pure); here its request is read from the run's config (the planner's
settings, the batch, the strategy when the command line chose one), and each result becomes the command that runs
it: the user's own overrides, less the ones the search decides (strategy, layout, offload, token budgets or
micro-batch, the rollout's share, and this action), then the search's choice as the pack's keys.
"""

from __future__ import annotations

import json
import shlex
import sys

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from hybrid_engine.plan.render import gib_text, host_text
from hybrid_engine.plan.settings import FSDP_FAMILY, ClusterSpec, PlanSettings
from hybrid_engine.plan.solve import MAX_SHARE, Candidate, SolveRequest, SolveResult, solve
from hybrid_engine.plan.step_time import Workload
from recipes.compose.confdir import entry_command
from recipes.compose.defaults import chooses_layout
from recipes.compose.layout_keys import LAYOUT_FED_KEYS, ROLE_STRATEGY_KEYS
from recipes.compose.overrides import override_key

__all__ = ["command_overrides", "request_from_run", "run_solve", "solve_run"]

UTILIZATION_KEY = "actor_rollout_ref.rollout.gpu_memory_utilization"
ACTOR_MICRO_KEY = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
CRITIC_MICRO_KEY = "critic.ppo_micro_batch_size_per_gpu"
BUDGET_KEYS = ("batching.actor_factor", "batching.logprob_factor", "batching.critic_factor")
DECIDED_GROUPS = ("strategy", "parallel", "offload", "model_engine")
DECIDED_KEYS = {
    "action", "plan.solve", "plan.format", "plan.picture", UTILIZATION_KEY, ACTOR_MICRO_KEY, CRITIC_MICRO_KEY,
    *BUDGET_KEYS,
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu", "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", "critic.ppo_max_token_len_per_gpu",
    "critic.forward_max_token_len_per_gpu",
    *(key for key, pack in LAYOUT_FED_KEYS.items() if pack.startswith("layout.")),
}
"""keys whose typed values the search replaces (verl's layout keys too: they would be adopted over the layout)"""
PART_NAMES = {"generation": "generation", "log_prob": "log-prob", "update": "update", "weight_sync": "weight sync"}


def typed_overrides() -> list[str]:
    """The command line of this run as Hydra received it (outside a Hydra run: none)."""
    if not HydraConfig.initialized():
        return []
    return [str(arg) for arg in HydraConfig.get().overrides.task]


def _decided(arg: str) -> bool:
    key = override_key(arg)
    if key is None:
        return False
    return (key in DECIDED_KEYS or key.split(".")[0] in DECIDED_GROUPS and "." not in key
            or key.startswith("layout.") or key.startswith("offload.") or key.endswith("_offload")
            or key.endswith("offload_policy"))


def _about_layout(problem: str) -> bool:
    """A problem of the configured layout, which the search replaces: its layout, memory, batch split over dp,
    token budgets, offload or rollout share."""
    key = problem.split(":", 1)[0]
    return key == "memory" or _decided(f"{key}=") or "dp(" in problem


def request_from_run(run, typed: list[str], settings: PlanSettings, cluster: ClusterSpec) -> SolveRequest:
    """The search's inputs from a checked run: its planner settings and cluster (``recipes.check.plan`` reads them from
    the config), the batch, the rollout engine; both strategies unless the command line chose one (``strategy=``,
    or verl's ``model_engine=`` adopted)."""
    cfg: DictConfig = run.cfg
    sel = lambda key, default=None: OmegaConf.select(cfg, key, default=default)  # noqa: E731
    chosen = str(sel("strategy.name"))
    # a typed role strategy (verl's actor_rollout_ref.actor.strategy=...) chooses the engine as strategy= does: the
    # commands keep it, so they search that strategy only (recipes.compose.compose.refuse_mixed_engines)
    typed_strategy = any(override_key(arg) in ("strategy", "model_engine", *ROLE_STRATEGY_KEYS) for arg in typed)
    fsdp = chosen if chosen in FSDP_FAMILY else "fsdp2"
    return SolveRequest(
        arch=run.arch,
        cluster=cluster,
        settings=settings,
        workload=Workload(train_batch_size=int(sel("data.train_batch_size")),
                          ppo_mini_batch_size=int(sel("actor_rollout_ref.actor.ppo_mini_batch_size")),
                          ppo_epochs=int(sel("actor_rollout_ref.actor.ppo_epochs", 1) or 1),
                          max_num_seqs=int(sel("actor_rollout_ref.rollout.max_num_seqs", 256) or 256)),
        strategies=(chosen,) if typed_strategy else (fsdp, "megatron"),
        rollout=str(sel("rollout.name")),
        critic_mini_batch_size=int(sel("critic.ppo_mini_batch_size") or 0) or None if run.use_critic else None,
    )


def command_overrides(candidate: Candidate, cfg: DictConfig, use_critic: bool) -> list[str]:
    """The pack's keys that run ``candidate``: strategy, layout numbers, offload, budgets or micro-batch, share."""
    t, i, s = candidate.train, candidate.infer, candidate.settings
    out = [f"strategy={candidate.strategy}", f"layout.train.tp={t.tp}", f"layout.train.pp={t.pp}"]
    for key, value in (("layout.train.cp", t.cp), ("layout.train.ep", t.ep)):
        if value != 1 or OmegaConf.select(cfg, key) != 1:
            out.append(f"{key}={value}")
    out.append(f"layout.infer.tp={i.tp}")
    for key, value in (("layout.infer.pp", i.pp), ("layout.infer.ep", i.ep)):
        if value != 1 or OmegaConf.select(cfg, key) != 1:
            out.append(f"{key}={value}")
    out.append(f"offload={candidate.offload}")
    factors = candidate.budget_factors
    if factors is not None:
        out += [f"batching.actor_factor={factors[0]}", f"batching.logprob_factor={factors[1]}"]
        if use_critic:  # the critic's budget as planned: the actor's (the memory model sizes one trained model)
            out.append(f"batching.critic_factor={factors[0]}")
    else:
        out.append(f"{ACTOR_MICRO_KEY}={s.ppo_micro_batch_size_per_gpu}")
        if use_critic:
            out.append(f"{CRITIC_MICRO_KEY}={s.ppo_micro_batch_size_per_gpu}")
    out.append(f"{UTILIZATION_KEY}={s.gpu_memory_utilization:g}")
    return out


def command_line(recipe: str, typed: list[str], candidate: Candidate, cfg: DictConfig, use_critic: bool) -> str:
    kept = [arg for arg in typed if not _decided(arg)]
    if not chooses_layout(kept):
        # the cluster planned for, by name: what makes the command a GPU run on a machine without one (no embedded
        # CPU default, recipes/compose/defaults.py); an experiment= or cluster= kept says so already
        kept.append(f"cluster={OmegaConf.select(cfg, 'cluster.gpu.name')}")
    words = [*entry_command(recipe), *kept, *command_overrides(candidate, cfg, use_critic)]
    return " ".join(shlex.quote(word) for word in words)


def reason(rank: int, candidate: Candidate, first: Candidate) -> str:
    """Why it sits at ``rank``: the fastest's largest part, or how much slower than the fastest and where; and why
    its offload (the milder ones do not fit, or are slower with their budgets)."""
    parts = candidate.time.parts()
    if rank == 1:
        largest = max(parts, key=parts.get)
        text = f"fastest estimate; {PART_NAMES[largest]} is {parts[largest] / candidate.time.total:.0%} of its step"
    else:
        gaps = {name: parts[name] - first.time.parts()[name] for name in parts}
        worst = sorted((name for name in gaps if gaps[name] > 0), key=lambda name: -gaps[name])[:2]
        where = ", ".join(f"{PART_NAMES[name]} {gaps[name]:+.1f} s" for name in worst)
        text = f"{candidate.time.total - first.time.total:+.1f} s vs #1" + (f" ({where})" if where else "")
    tried = list(candidate.offloads)  # mildest first
    milder = tried[:tried.index(candidate.offload)] if candidate.offload in tried else []
    unfit = [name for name in milder if candidate.offloads[name] is None]
    slower = [name for name in milder if candidate.offloads[name] is not None]
    if unfit:
        text += f"; offload {'/'.join(unfit)} does not fit"
    if slower:
        text += f"; offload {'/'.join(slower)} is slower"
    return text


def solve_run(run, settings: PlanSettings, cluster: ClusterSpec, typed: list[str] | None = None
              ) -> tuple[SolveResult, list[dict]]:
    """The search for a checked run and, per result, what is printed: its numbers, reason and command."""
    typed = typed_overrides() if typed is None else typed
    result = solve(request_from_run(run, typed, settings, cluster))
    recipe = str(OmegaConf.select(run.cfg, "run.name"))
    rows = []
    for rank, candidate in enumerate(result.candidates, 1):
        rows.append({"rank": rank, **candidate.to_dict(), "describe": candidate.describe(),
                     "reason": reason(rank, candidate, result.candidates[0]),
                     "overrides": command_overrides(candidate, run.cfg, run.use_critic),
                     "command": command_line(recipe, typed, candidate, run.cfg, run.use_critic)})
    return result, rows


def shortfall_line(result: SolveResult) -> str:
    r, s = result.request, result.shortfall
    c = r.cluster
    if s is None:
        refused = ", ".join(f"{why} ({n})" for why, n in sorted(result.refused.items())) or "none enumerated"
        return (f"plan.solve: no layout of {r.arch.name} is allowed on {c.nnodes}x{c.gpus_per_node} GPUs "
                f"({result.considered} considered; refused: {refused})")
    t, i = s["train"], s["infer"]
    head = (f"plan.solve: no layout of {r.arch.name} fits {c.nnodes}x{c.gpus_per_node} {c.gpu} "
            f"({c.memory_gib:g} GiB per GPU); the closest, {s['strategy']} train tp{t.tp} pp{t.pp} cp{t.cp} "
            f"ep{t.ep} dp{t.dp} -> infer tp{i.tp}")
    if "shard_bytes" in s:
        why = (f", holds a generation shard of at least {gib_text(s['shard_bytes'])} > the largest rollout share "
               f"{MAX_SHARE:g} * {gib_text(s['gpu_bytes'])} = {gib_text(s['share_bytes'])}")
    elif s["bytes"] > s["peak_bytes"] + s["headroom_bytes"] - s["gpu_bytes"]:  # the host's memory is the shorter
        why = f" with offload={s['offload']} and the smallest budgets, {host_text(s['host'], c.gpus_per_node)}"
    else:
        why = (f" with offload={s['offload']} and the smallest budgets, plans {gib_text(s['peak_bytes'])} in "
               f"{s['peak_phase']} + {gib_text(s['headroom_bytes'])} headroom > {gib_text(s['gpu_bytes'])}")
    return f"{head}{why}: {gib_text(s['bytes'])} short (more nodes or GPUs with more memory)"


def render_table(result: SolveResult, rows: list[dict]) -> str:
    r = result.request
    c, s, w = r.cluster, r.settings, r.workload
    lines = [
        f"solve    {r.arch.name} on {c.nnodes}x{c.gpus_per_node} {c.gpu} ({c.memory_gib:g} GiB, "
        f"{result.gpu.tflops:g} TFLOPS, {result.gpu.hbm_GBps:g} GB/s HBM"
        + (" assumed" if result.gpu.assumed else "")
        + f"; NVLink {c.nvlink_GBps:g}, network {c.network_GBps:g} GB/s per GPU)",
        f"step     {w.train_batch_size} prompts x {s.rollout_n} samples, prompt {s.max_prompt_length} + response "
        f"{s.max_response_length} tokens, {'critic, ' if s.has_critic else ''}"
        f"strategies {', '.join(r.strategies)}",
        f"search   {result.considered} layouts, {result.allowed} allowed, {result.evaluated} planned, "
        f"{result.fitting} fit; the rest bounded out ({result.seconds:.2f} s)",
        "",
        f"{'#':<3}{'step':>8}{'gen':>8}{'logp':>8}{'update':>8}{'sync':>8}{'peak/GPU':>11}{'headroom':>11}  layout",
    ]
    for row in rows:
        t, m = row["time_s"], row["memory"]
        lines.append(f"{row['rank']:<3}{t['total']:>7.1f}s{t['generation']:>8.1f}{t['log_prob']:>8.1f}"
                     f"{t['update']:>8.1f}{t['weight_sync']:>8.1f}{gib_text(m['peak_bytes']):>11}"
                     f"{gib_text(m['headroom_bytes']):>11}  {row['describe']}")
        lines.append(f"     why: {row['reason']}; peak in {m['peak_phase']}, sync {row['weight_sync_scheme']}")
        lines.append(f"     {row['command']}")
    lines.append("")
    lines.append("times: roofline estimates for ranking (hybrid_engine/plan/step_time.py), responses at full length")
    return "\n".join(lines)


def run_solve(run, fmt: str, settings: PlanSettings, cluster: ClusterSpec, out=None) -> int:
    """Print the ranked layouts (table or JSON); 2 with one line on stderr when nothing fits. ``settings`` and
    ``cluster``: the planner's inputs as ``recipes.check.plan`` reads them from the run's config."""
    out = sys.stdout if out is None else out  # at call time: the stdout of now (a test may capture it)
    others = [problem for problem in run.problems if not _about_layout(problem)]
    if others:  # mistakes the search cannot choose its way around
        for problem in others:
            print(f"config error: {problem}", file=sys.stderr)
        return 2
    result, rows = solve_run(run, settings, cluster)
    if not rows:
        print(f"config error: {shortfall_line(result)}", file=sys.stderr)
        if fmt == "json":
            print(json.dumps({"solve": _summary(result), "candidates": []}, indent=2, default=str), file=out)
        return 2
    if fmt == "json":
        print(json.dumps({"solve": _summary(result), "candidates": rows}, indent=2, default=str), file=out)
    else:
        print(render_table(result, rows), file=out)
    return 0


def _summary(result: SolveResult) -> dict:
    r = result.request
    shortfall = None
    if result.shortfall is not None:
        s = result.shortfall
        shortfall = {**{k: v for k, v in s.items() if k not in ("train", "infer")},
                     "train": s["train"].to_dict(), "infer": s["infer"].to_dict(), "line": shortfall_line(result)}
    return {"model": r.arch.name, "cluster": r.cluster.to_dict(), "strategies": list(r.strategies),
            "gpu_figures": {"tflops": result.gpu.tflops, "hbm_GBps": result.gpu.hbm_GBps,
                            "assumed": result.gpu.assumed},
            "considered": result.considered, "allowed": result.allowed, "evaluated": result.evaluated,
            "fitting": result.fitting, "seconds": result.seconds, "refused": result.refused,
            "shortfall": shortfall}
