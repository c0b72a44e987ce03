"""action=plan: layouts, HybridFlow groups, bytes per GPU and memory per GPU, before any GPU starts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from hybrid_engine.plan import ClusterSpec, Plan, PlanSettings, build_plan
from hybrid_engine.plan.budget import auto_token_budgets
from hybrid_engine.plan.render import gib_text
from recipes.check.schema import Cluster, Offload, SchemaError, load_section
from recipes.check.schema import Plan as PlanKeys

ARTICLE_FACTORS = {"actor": 3.0, "logprob": 4.0, "critic": 6.0}
"""The source article's budgets in sequences of prompt + response (actor 2-3x, log-prob larger, critic 2x actor): what
``batching=dynamic`` uses where its auto budgets cannot be planned (recipes.check.budget)."""
BUDGET_FALLBACKS: set[str] = set()
"""Why auto budgets fell back to ARTICLE_FACTORS since validation last cleared it (recipes.check.budget adds,
recipes.check.validate reads and says it)."""


def cluster_spec(cfg: DictConfig) -> ClusterSpec:
    cluster = load_section(Cluster, cfg.cluster, "cluster")
    gpu = cluster.gpu
    return ClusterSpec(
        nnodes=cluster.nnodes,
        gpus_per_node=cluster.gpus_per_node,
        gpu=gpu.name,
        memory_gib=float(gpu.memory_gib),
        nvlink_GBps=float(gpu.nvlink_GBps),
        network_GBps=float(gpu.network_GBps),
        host_memory_gib=None if cluster.host_memory_gib is None else float(cluster.host_memory_gib),
    )


ENGINE_SECTIONS = {"fsdp": "fsdp_config", "fsdp2": "fsdp_config", "megatron": "megatron", "veomni": "veomni"}
"""the actor's engine section of each strategy, where verl reads param_offload / optimizer_offload"""


def offload_keys(strategy: str) -> tuple[str, str] | None:
    """verl's keys of the actor's parameter and optimizer offload under ``strategy`` (offload/ fills them)."""
    section = ENGINE_SECTIONS.get(str(strategy))
    if section is None:
        return None
    return tuple(f"actor_rollout_ref.actor.{section}.{name}_offload" for name in ("param", "optimizer"))


def data_parallel_size(cfg: DictConfig) -> int:
    """Ranks that split the batch: every rank under FSDP (ulysses aside), world / (tp * pp * cp) under Megatron."""
    sel = lambda key, default=1: OmegaConf.select(cfg, key, default=default)  # noqa: E731
    world = int(sel("cluster.nnodes")) * int(sel("cluster.gpus_per_node"))
    if str(sel("strategy.name", "fsdp2")) != "megatron":
        return max(world // int(sel("layout.train.cp", 1) or 1), 1)
    model_parallel = int(sel("layout.train.tp", 1)) * int(sel("layout.train.pp", 1)) * int(sel("layout.train.cp", 1))
    return max(world // max(model_parallel, 1), 1)


def batch_sequences_per_gpu(cfg: DictConfig) -> tuple[int | None, int | None]:
    """(sequences per GPU per optimizer step, per log-prob pass): ppo_mini_batch_size and train_batch_size, each
    * rollout.n / dp; None where a key is missing or the division leaves a remainder (validation reports that)."""
    sel = lambda key: OmegaConf.select(cfg, key, default=None)  # noqa: E731
    try:
        n, dp = int(sel("actor_rollout_ref.rollout.n") or 1), data_parallel_size(cfg)
        mini, batch = sel("actor_rollout_ref.actor.ppo_mini_batch_size"), sel("data.train_batch_size")
    except (TypeError, ValueError):
        return None, None

    def per_gpu(value):
        return int(value) * n // dp if isinstance(value, int) and value > 0 and int(value) * n >= dp else None

    return per_gpu(mini), per_gpu(batch)


def plan_settings(cfg: DictConfig, has_critic: bool, has_ref: bool, *, budgets: tuple[int, int] | None = None
                  ) -> PlanSettings:
    """The planner's inputs, read from the verl keys of the run's config and the roles verl gives it (offload from
    the actor's engine keys, which offload/ fills: a verl example that types them is planned as it runs).
    ``budgets``: (update, log-prob) token budgets to plan with instead of reading the config's (the auto budget
    plans before they exist)."""
    sel = lambda key, default=None: OmegaConf.select(cfg, key, default=default)  # noqa: E731
    actor = "actor_rollout_ref.actor"
    if budgets is None:
        budgets = (int(sel(f"{actor}.ppo_max_token_len_per_gpu")),
                   int(sel("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu")))
    mini_per_gpu, batch_per_gpu = batch_sequences_per_gpu(cfg)
    offload = load_section(Offload, cfg.get("offload"), "offload")
    keys = offload_keys(cfg.strategy.name)
    param, optimizer = (bool(sel(keys[0], offload.param)), bool(sel(keys[1], offload.optimizer))) if keys else (
        offload.param, offload.optimizer)
    foreach = sel(f"{actor}.optim.override_optimizer_config.foreach", None)
    return PlanSettings(
        strategy=str(cfg.strategy.name),
        param_offload=param,
        optimizer_offload=optimizer,
        offload_policy=bool(sel(f"{actor}.fsdp_config.offload_policy", offload.policy)),
        optimizer_foreach=foreach is None or bool(foreach),
        dtype="bfloat16",
        max_prompt_length=int(sel("data.max_prompt_length")),
        max_response_length=int(sel("data.max_response_length")),
        ppo_max_token_len_per_gpu=budgets[0],
        log_prob_max_token_len_per_gpu=budgets[1],
        use_dynamic_bsz=bool(sel(f"{actor}.use_dynamic_bsz")),
        ppo_micro_batch_size_per_gpu=int(sel(f"{actor}.ppo_micro_batch_size_per_gpu") or 1),
        log_prob_micro_batch_size_per_gpu=max(
            int(sel("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu") or 0),
            int(sel("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu") or 0) if has_ref else 0,
        )
        or None,
        gradient_checkpointing=bool(sel("actor_rollout_ref.model.enable_gradient_checkpointing")),
        gpu_memory_utilization=float(sel("actor_rollout_ref.rollout.gpu_memory_utilization")),
        free_cache_engine=bool(sel("actor_rollout_ref.rollout.free_cache_engine")),
        has_critic=has_critic,
        has_ref=has_ref,
        rollout_n=int(sel("actor_rollout_ref.rollout.n")),
        rollout_engine=str(sel("actor_rollout_ref.rollout.name", "vllm")),
        use_remove_padding=bool(sel("actor_rollout_ref.model.use_remove_padding", True)),
        use_torch_compile=bool(sel(f"{actor}.use_torch_compile", True)),
        update_entropy=float(sel(f"{actor}.entropy_coeff", 0) or 0) != 0,
        mini_batch_sequences_per_gpu=mini_per_gpu,
        rollout_sequences_per_gpu=batch_per_gpu,
    )


def make_plan(run) -> Plan:
    """The plan of a validated run (``recipes.check.validate.ValidatedRun``; not imported: recipes.check.fit, which
    validation calls, plans through this module)."""
    settings = plan_settings(run.cfg, run.use_critic, run.use_ref)
    return build_plan(run.arch, run.train, run.infer, cluster_spec(run.cfg), settings)


def auto_budget_report(run) -> dict | None:
    """The auto token budgets of a checked run (what ``batching.*_factor=null`` resolves to), or None without a plan."""
    if run.arch is None or run.train is None or run.infer is None:
        return None
    seq = int(run.cfg.data.max_prompt_length) + int(run.cfg.data.max_response_length)
    settings = plan_settings(run.cfg, run.use_critic, run.use_ref, budgets=(seq, seq))
    plan = build_plan(run.arch, run.train, run.infer, cluster_spec(run.cfg), settings)
    if plan.groups is None or plan.memory is None:
        return None
    return auto_token_budgets(plan.spec, plan.groups, plan.cluster, settings, plan.memory["rollout"]["weights"])


def budget_lines(cfg: DictConfig, auto: dict | None) -> list[str]:
    """The plan's lines about the token budgets: auto (factors null) or typed, the phases' bytes, the headroom."""
    if OmegaConf.select(cfg, "batching.mode", default=None) != "dynamic":
        return []
    factors = {role: OmegaConf.select(cfg, f"batching.{role}_factor", default=None) for role in ("actor", "logprob")}
    if all(value is not None for value in factors.values()):
        return [f"token budgets: typed factors (actor {factors['actor']:g}x, log-prob {factors['logprob']:g}x of "
                f"prompt+response)"]
    if auto is None:
        return ["token budgets: auto could not be planned (see the errors); the source article's 3x / 4x / 6x stand"]
    limits = auto["limits"]
    update, update_note = _budget(cfg, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
                                  auto["ppo_max_token_len_per_gpu"], limits["update"])
    log_prob, log_prob_note = _budget(cfg, "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
                                      auto["log_prob_max_token_len_per_gpu"], limits["log_prob"])
    critic, critic_note = _budget(cfg, "critic.ppo_max_token_len_per_gpu", auto["critic_ppo_max_token_len_per_gpu"])
    typed = any("typed" in note for note in (update_note, log_prob_note, critic_note))
    return [
        f"token budgets: auto{' where not typed' if typed else ''} (batching.*_factor null): update {update:,} tokens "
        f"per GPU{update_note}, log-prob {log_prob:,}{log_prob_note}, critic {critic:,}{critic_note}; a "
        f"{auto['margin']:.0%} margin on the budget-dependent bytes",
        f"token budgets{' (at the auto values)' if typed else ''}: training {gib_text(auto['training_bytes'])}, "
        f"log-prob {gib_text(auto['log_prob_bytes'])} of {gib_text(auto['gpu_bytes'])}: headroom "
        f"{gib_text(auto['headroom_bytes'])}",
    ]


def _budget(cfg: DictConfig, key: str, auto: int, limit: str | None = None) -> tuple[int, str]:
    """One budget of the plan's line and its note: the typed value beside the auto one, or the auto value and what
    limits it."""
    value = OmegaConf.select(cfg, key, default=None)
    if isinstance(value, int) and value != auto:
        return value, f" (typed {key}; auto {auto:,})"
    return auto, f" (limited by {limit})" if limit else ""


def run_plan(checked, out=None) -> int:
    """Print the plan (table or JSON), draw the picture if asked; 2 when the plan or the config has errors."""
    out = sys.stdout if out is None else out  # at call time: the stdout of now (a test may capture it)
    cfg = checked.cfg
    try:
        keys = load_section(PlanKeys, cfg.get("plan"), "plan")
        if keys.solve:
            from recipes.check.solve import run_solve  # lazy: the search loads only when asked for

            settings = plan_settings(cfg, checked.use_critic, checked.use_ref)
            return run_solve(checked, keys.format, settings, cluster_spec(cfg), out)
        plan = make_plan(checked)
    except SchemaError as error:  # check() reported these too (a plan with a layout error still gets here)
        for line in error.problems:
            print(f"config error: {line}", file=sys.stderr)
        return 2
    fmt = keys.format
    for problem in checked.problems:
        if problem not in plan.errors:
            plan.errors.append(problem)
    for warning in checked.warnings:
        if warning not in plan.warnings:
            plan.warnings.append(warning)
    auto = auto_budget_report(checked)
    if fmt == "json":
        document = plan.to_dict()
        document["token_budgets"] = {"lines": budget_lines(cfg, auto), "auto": auto}
        print(json.dumps(document, indent=2, default=str), file=out)
    else:
        print(plan.render_table(), file=out)
        for line in budget_lines(cfg, auto):
            print(line, file=out)
    picture = keys.picture
    if picture:
        path = Path(str(picture)).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        plan.draw_picture(path)
        print(f"rank grid written to {path}", file=sys.stderr if fmt == "json" else out)
    return 2 if plan.errors else 0
