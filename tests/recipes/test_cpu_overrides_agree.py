"""The CPU settings exist twice, on purpose: as the recipes' embedded default (conf/cluster/cpu.yaml, rollout/hf,
model/tiny, task/tiny) and as plain verl overrides for ``python -m verl.trainer.main_ppo``
(``recipes.verl_ext.plugin.cpu_overrides``, for verl users without the recipes, and for bench_demo). This test keeps
the two in step: every verl key the override list sets has the same value in the recipes' resolved config."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from recipes.compose import compose_recipe
from recipes.defaults import embedded_defaults
from recipes.verl_ext.plugin.cpu_overrides import (
    DATA_TINY,
    MODEL_TINY,
    PARALLEL_CPU,
    ROLLOUT_HF,
)

EMBEDDED = embedded_defaults([], accelerator=False)

# keys whose value is a placeholder filled from the tiny assets, or that the recipes derive differently on purpose
NOT_COMPARED = {
    # the recipes fill these from ${pack.asset:...}; the override list from TinyAssets: compared as paths below
    "actor_rollout_ref.model.path",
    "critic.model.path",
    "data.train_files",
    "data.val_files",
    "reward.custom_reward_function.path",
    "reward.custom_reward_function.name",
    # ray's logical CPU count: the recipes size it from the cluster group, the plain list fixes 16
    "ray_kwargs.ray_init.num_cpus",
    # both fix the prompt order; the recipes take the run's seed
    "data.seed",
    # batch sizes and micro-batches: the recipes derive them from batching/ and task/ (checked by test_every_option)
    "data.train_batch_size",
    "actor_rollout_ref.actor.ppo_mini_batch_size",
    "critic.ppo_mini_batch_size",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
    "critic.ppo_micro_batch_size_per_gpu",
}


def _resolved(recipe: str):
    cfg = compose_recipe(recipe, EMBEDDED)
    return OmegaConf.to_container(cfg, resolve=True)


def _select(tree: dict, dotted: str):
    node = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


def _normal(value):
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


@pytest.mark.parametrize("recipe", ["grpo", "kl_ppo"])
def test_the_plain_verl_overrides_match_the_embedded_default(recipe):
    tree = _resolved(recipe)
    groups = {**PARALLEL_CPU, **ROLLOUT_HF, **MODEL_TINY, **DATA_TINY}
    checked, differ = 0, []
    for key, value in groups.items():
        key = key.lstrip("+")
        if key in NOT_COMPARED:
            continue
        try:
            found = _select(tree, key)
        except KeyError:
            differ.append(f"{key}: missing in the recipe")
            continue
        if _normal(found) != _normal(value):
            differ.append(f"{key}: recipe {found!r}, cpu_overrides {value!r}")
        checked += 1
    assert not differ, "\n".join(differ)
    assert checked >= 30
