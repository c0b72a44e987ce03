"""``batching=dynamic``'s auto token budgets: sized by the memory model for the run's model, GPU and layout.

A budget factor left null (``batching.actor_factor`` / ``logprob_factor`` / ``critic_factor``, the default) takes the
auto budget (``hybrid_engine.plan.budget.auto_token_budgets``); a typed factor is a multiple of prompt + response
(the source article's 3x / 4x / 6x); a typed verl key (``actor_rollout_ref.actor.ppo_max_token_len_per_gpu=...``)
wins over both. Where the plan cannot be made (an unknown model, a layout that does not factor: validation reports
those), the source article's factors stand in, so the rest of the checks still run.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from hybrid_engine.layout import InferLayout, TrainLayout, collect_layout_errors
from hybrid_engine.plan import build_plan
from hybrid_engine.plan.budget import auto_token_budgets
from recipes.plan import cluster_spec, plan_settings

__all__ = ["ARTICLE_FACTORS", "auto_budgets", "token_budget"]

ARTICLE_FACTORS = {"actor": 3.0, "logprob": 4.0, "critic": 6.0}
"""The source article's budgets in sequences of prompt + response (actor 2-3x, log-prob larger, critic 2x actor)."""
KEYS = {"actor": "ppo_max_token_len_per_gpu", "logprob": "log_prob_max_token_len_per_gpu",
        "critic": "critic_ppo_max_token_len_per_gpu"}
_MEMO: dict[tuple, dict | None] = {}


def _inputs(cfg: DictConfig) -> tuple:
    """What the auto budget depends on, resolved (the memo's key)."""
    keys = ("model.name", "actor_rollout_ref.model.path", "strategy.name", "cluster.nnodes", "cluster.gpus_per_node",
            "cluster.gpu.memory_gib", "layout.train", "layout.infer", "offload", "data.max_prompt_length",
            "data.max_response_length", "data.train_batch_size", "actor_rollout_ref.actor.ppo_mini_batch_size",
            "actor_rollout_ref.rollout.n", "actor_rollout_ref.rollout.name",
            "actor_rollout_ref.rollout.gpu_memory_utilization", "actor_rollout_ref.rollout.free_cache_engine",
            "actor_rollout_ref.model.enable_gradient_checkpointing", "actor_rollout_ref.model.use_remove_padding",
            "actor_rollout_ref.actor.use_torch_compile", "actor_rollout_ref.actor.entropy_coeff",
            "actor_rollout_ref.actor.use_kl_loss", "algorithm.use_kl_in_reward", "algorithm.adv_estimator",
            "critic.enable", "actor_rollout_ref.actor.fsdp_config.param_offload",
            "actor_rollout_ref.actor.fsdp_config.optimizer_offload", "trainer.device")
    out = []
    for key in keys:
        value = OmegaConf.select(cfg, key, default=None)
        out.append(str(OmegaConf.to_container(value, resolve=True)) if isinstance(value, DictConfig) else str(value))
    return tuple(out)


def auto_budgets(cfg: DictConfig) -> dict | None:
    """The auto budgets of this config (``auto_token_budgets``' answer), or None where no plan can be made."""
    try:
        key = _inputs(cfg)
    except Exception:  # noqa: BLE001 - a key that does not resolve: validation names it
        return None
    if key not in _MEMO:
        _MEMO[key] = _compute(cfg)
    return _MEMO[key]


def _compute(cfg: DictConfig) -> dict | None:
    from recipes.validate import _fsdp_layout, _layout_dict, _world, load_model_arch  # lazy: validate imports fit
    from recipes.verl_ext.api import roles

    problems: list[str] = []
    try:
        arch = load_model_arch(cfg, problems, [], model_chosen=True)
        world, desc = _world(cfg, problems)
        train_d = _fsdp_layout(cfg, _layout_dict(cfg, "layout.train", problems), problems)
        infer_d = _layout_dict(cfg, "layout.infer", problems)
        if arch is None or world is None or problems:
            return None
        train, infer, layout_problems = collect_layout_errors(
            train_d, infer_d, world, desc, gpus_per_node=OmegaConf.select(cfg, "cluster.gpus_per_node"))
        if layout_problems or train is None or infer is None:
            return None
        use_critic, use_ref = roles(cfg)
        seq = int(cfg.data.max_prompt_length) + int(cfg.data.max_response_length)
        settings = plan_settings(cfg, use_critic, use_ref, budgets=(seq, seq))
        plan = build_plan(arch, TrainLayout(**_fields(train)), InferLayout(**_fields(infer)), cluster_spec(cfg),
                          settings)
        if plan.groups is None or plan.memory is None:
            return None
        return auto_token_budgets(plan.spec, plan.groups, plan.cluster, settings, plan.memory["rollout"]["weights"])
    except Exception:  # noqa: BLE001 - the plan that validation runs next reports what is wrong
        return None


def _fields(layout) -> dict:
    return {name: getattr(layout, name) for name in layout.__dataclass_fields__}


def token_budget(role: str, factor, max_prompt_length, max_response_length, root: DictConfig | None) -> int:
    """Tokens per GPU per micro-batch of ``role`` (actor, logprob, critic): a typed factor times prompt + response;
    a null factor: the auto budget (the source article's factor where no plan can be made)."""
    seq = int(max_prompt_length) + int(max_response_length)
    if factor is not None:
        return int(float(factor) * seq)
    auto = auto_budgets(root) if root is not None else None
    if auto is None:
        return int(ARTICLE_FACTORS[role] * seq)
    return int(auto[KEYS[role]])
