"""What the plan sizes to the run: ``batching=dynamic``'s auto token budgets, and the rollout engine's memory share
and CUDA-graph sizes (``rollout.share`` / ``rollout.graphs`` auto, hybrid_engine/plan/engine_share.py).

A budget factor left null (``batching.actor_factor`` / ``logprob_factor`` / ``critic_factor``, the default) takes the
auto budget (``hybrid_engine.plan.budget.auto_token_budgets``); a typed factor is a multiple of prompt + response
(the source article's 3x / 4x / 6x); a typed verl key (``actor_rollout_ref.actor.ppo_max_token_len_per_gpu=...``)
wins over both. Where the plan cannot be made (an unknown model, a layout that does not factor: validation reports
those), the source article's factors stand in, so the rest of the checks still run, and validation says so with the
reason (``recipes.check.plan.BUDGET_FALLBACKS``): the repository's measurement puts those factors at 0.70x of the auto
budget's speed.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from hybrid_engine.layout import InferLayout, TrainLayout, collect_layout_errors
from hybrid_engine.model_spec import build_spec
from hybrid_engine.plan import build_plan
from hybrid_engine.plan.budget import auto_token_budgets
from hybrid_engine.plan.engine_share import engine_share, graph_sizes
from hybrid_engine.plan.memory import kv_bytes_per_token
from recipes.check.plan import ARTICLE_FACTORS, BUDGET_FALLBACKS, cluster_spec, plan_settings

__all__ = ["ARTICLE_FACTORS", "FALLBACK_SHARE", "auto_budgets", "engine_graph_sizes", "engine_memory_share",
           "token_budget"]

KEYS = {"actor": "ppo_max_token_len_per_gpu", "logprob": "log_prob_max_token_len_per_gpu",
        "critic": "critic_ppo_max_token_len_per_gpu"}
_MEMO: dict[tuple, dict | str] = {}


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
    except Exception as error:  # noqa: BLE001 - a key that does not resolve: validation names it
        BUDGET_FALLBACKS.add(f"{type(error).__name__}: {error}".splitlines()[0])
        return None
    if key not in _MEMO:
        _MEMO[key] = _compute(cfg)
    if isinstance(_MEMO[key], str):  # why no plan could be made
        BUDGET_FALLBACKS.add(_MEMO[key])
        return None
    return _MEMO[key]


def _compute(cfg: DictConfig) -> dict | str:
    """The auto budgets, or the first line of why they cannot be planned."""
    from recipes.check.validate import _fsdp_layout, _layout_dict, _world, load_model_arch  # lazy: validate imports fit
    from recipes.verl_ext.api import roles

    problems: list[str] = []
    try:
        arch = load_model_arch(cfg, problems, [], model_chosen=True)
        world, desc = _world(cfg, problems)
        train_d = _fsdp_layout(cfg, _layout_dict(cfg, "layout.train", problems), problems)
        infer_d = _layout_dict(cfg, "layout.infer", problems)
        if arch is None or world is None or problems:
            return problems[0].splitlines()[0] if problems else "the model's architecture is not known here"
        train, infer, layout_problems = collect_layout_errors(
            train_d, infer_d, world, desc, gpus_per_node=OmegaConf.select(cfg, "cluster.gpus_per_node"))
        if layout_problems or train is None or infer is None:
            return layout_problems[0].splitlines()[0] if layout_problems else "the layout does not factor"
        use_critic, use_ref = roles(cfg)
        seq = int(cfg.data.max_prompt_length) + int(cfg.data.max_response_length)
        settings = plan_settings(cfg, use_critic, use_ref, budgets=(seq, seq))
        plan = build_plan(arch, TrainLayout(**_fields(train)), InferLayout(**_fields(infer)), cluster_spec(cfg),
                          settings)
        if plan.groups is None or plan.memory is None:
            return "the plan has no memory model for this layout"
        return auto_token_budgets(plan.spec, plan.groups, plan.cluster, settings, plan.memory["rollout"]["weights"])
    except Exception as error:  # noqa: BLE001 - validation says it (BUDGET_FALLBACKS), and the plan reports it
        return f"{type(error).__name__}: {error}".splitlines()[0]


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


FALLBACK_SHARE = 0.6
"""verl's examples' share, where no plan can be made (validation names what is missing)."""


def _step_sequences(cfg: DictConfig) -> tuple[int, int, int, int] | None:
    """(sequences one generation replica runs in a step, their longest length, generation tp, generation pp)."""
    try:
        infer = cfg.layout.infer
        tp, pp = int(infer.tp), int(infer.pp)
        replicas = max(1, int(cfg.cluster.world_size) // max(1, tp * pp))
        sequences = int(cfg.data.train_batch_size) * int(cfg.actor_rollout_ref.rollout.n)
        length = int(cfg.data.max_prompt_length) + int(cfg.data.max_response_length)
    except Exception:  # noqa: BLE001 - a key that does not resolve: validation names it
        return None
    return -(-sequences // replicas), length, tp, pp


def engine_memory_share(share, root: DictConfig | None) -> float:
    """``actor_rollout_ref.rollout.gpu_memory_utilization`` from ``rollout.share``: a number as it is; ``auto``: the
    engine's weights, one step's KV cache and its working memory, as a fraction of the GPU (FALLBACK_SHARE where
    the model or the layout cannot be read: validation reports those)."""
    if str(share) != "auto":
        return float(share)
    from recipes.check.validate import load_model_arch  # lazy: validate imports fit, which imports this module

    step = _step_sequences(root) if root is not None else None
    if step is None:
        return FALLBACK_SHARE
    sequences, length, tp, pp = step
    try:
        arch = load_model_arch(root, [], [], model_chosen=True)
        spec = build_spec(arch)
        gpu = int(float(root.cluster.gpu.memory_gib) * 2**30)
    except Exception:  # noqa: BLE001 - validation reports the model
        return FALLBACK_SHARE
    weights = spec.numel * 2 // (tp * pp)
    return engine_share(weight_bytes=weights, kv_bytes_per_token=kv_bytes_per_token(spec, tp, pp, 2),
                        sequences=sequences, sequence_length=length, gpu_bytes=gpu)


def engine_graph_sizes(graphs, root: DictConfig | None):
    """``actor_rollout_ref.rollout.cudagraph_capture_sizes`` from ``rollout.graphs``: ``auto`` = 1, 2, 4 and every
    8 up to one step's sequences per generation replica, at most the engine's ``max_num_seqs`` (no decode batch is
    larger); null = the engine's own sizes; a list as it is."""
    if graphs is None or str(graphs) != "auto":
        return graphs
    step = _step_sequences(root) if root is not None else None
    if step is None:
        return None
    most = OmegaConf.select(root, "actor_rollout_ref.rollout.max_num_seqs", default=None)
    return graph_sizes(min(step[0], int(most)) if most else step[0])
