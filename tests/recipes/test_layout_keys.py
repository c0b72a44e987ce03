"""No drift: every verl key that repeats a layout or cluster number equals that number, for every layout option."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from recipes.compose.compose import compose_recipe
from recipes.compose.confdir import group_options
from recipes.compose.layout_keys import LAYOUT_FED_KEYS, adopt, find_adoptions

CASES = [
    ("fsdp2", "tp1", []), ("fsdp2", "tp2", []), ("fsdp2", "tp4", []), ("fsdp2", "tp8", []),
    ("fsdp", "tp4", []), ("fsdp2", "cpu", ["cluster=cpu"]),
    ("megatron", "tp2", []), ("megatron", "tp8", []), ("megatron", "tp4pp2", []),
    ("megatron", "tp8pp4", ["cluster.nnodes=4"]),
    ("veomni", "tp1", []), ("veomni", "tp2", ["layout.train.cp=2"]),
]
# rollout tp/pp/ep and trainer nnodes/gpus, plus each engine's own: FSDP's three Ulysses sizes, Megatron's
# tp/pp/cp/ep/etp for actor, ref and critic (FSDP: the deprecated and the fsdp_config spelling), VeOmni's Ulysses
# and expert sizes for actor and ref
KEYS_PER_STRATEGY = {"fsdp2": 11, "fsdp": 11, "megatron": 20, "veomni": 9}

_ABSENT = object()


def _present_keys(cfg):
    """The layout-fed verl keys that exist in ``cfg`` (the chosen strategy's engine sections only)."""
    return [key for key in LAYOUT_FED_KEYS if OmegaConf.select(cfg, key, default=_ABSENT) is not _ABSENT]


def test_cases_cover_every_parallel_option():
    assert {p for _, p, _ in CASES} == set(group_options("parallel"))


@pytest.mark.parametrize("strategy,parallel,extra", CASES)
def test_verl_keys_equal_layout_numbers(strategy, parallel, extra):
    cfg = compose_recipe("kl_ppo", [f"strategy={strategy}", f"parallel={parallel}", *extra])
    keys = _present_keys(cfg)
    assert len(keys) == KEYS_PER_STRATEGY[strategy], keys
    for verl_key in keys:
        assert OmegaConf.select(cfg, verl_key) == OmegaConf.select(cfg, LAYOUT_FED_KEYS[verl_key]), verl_key
    train = cfg.layout.train
    assert train.dp * train.tp * train.pp * train.cp == cfg.cluster.nnodes * cfg.cluster.gpus_per_node


def test_the_article_layout_numbers():
    cfg = compose_recipe("kl_ppo", ["strategy=megatron", "parallel=tp8pp4", "cluster.nnodes=4"])
    actor = cfg.actor_rollout_ref.actor.megatron
    assert (actor.tensor_model_parallel_size, actor.pipeline_model_parallel_size) == (8, 4)
    assert cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == 4
    assert (cfg.layout.train.dp, cfg.layout.infer.dp) == (1, 8)
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (4, 8)
    assert cfg.model_engine == "megatron"


def test_fsdp_trains_without_tp_but_generates_with_it():
    cfg = compose_recipe("grpo", ["strategy=fsdp2", "parallel=tp4"])
    assert (cfg.layout.train.tp, cfg.layout.train.dp, cfg.layout.infer.tp) == (1, 8, 4)


def test_direct_verl_override_is_adopted_into_the_layout():
    cfg = compose_recipe("grpo", ["parallel=tp1", "actor_rollout_ref.rollout.tensor_model_parallel_size=4"])
    adoptions, problems = find_adoptions(cfg)
    assert problems == []
    assert [a.note for a in adoptions] == [
        "actor_rollout_ref.rollout.tensor_model_parallel_size=4 sets layout.infer.tp (was 1)"]
    assert cfg.layout.infer.tp == 1  # finding reads the config only
    adopt(cfg, adoptions)
    assert cfg.layout.infer.tp == 4
    assert OmegaConf.is_interpolation(cfg.actor_rollout_ref.rollout, "tensor_model_parallel_size")
    assert cfg.layout.infer.dp == 2


def test_conflicting_direct_overrides_are_reported():
    cfg = compose_recipe("kl_ppo", ["strategy=megatron", "parallel=tp2",
                                    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4",
                                    "critic.megatron.tensor_model_parallel_size=2"])
    _, problems = find_adoptions(cfg)
    assert problems == [
        "critic.megatron.tensor_model_parallel_size: 2 disagrees with "
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4; both repeat layout.train.tp"
    ]
