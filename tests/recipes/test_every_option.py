"""Every primary config x every option of every group composes and passes our checks and verl's own validator."""

from __future__ import annotations

import pytest

from recipes.compose import RECIPES, compose_recipe
from recipes.confdir import group_options, pack_groups
from recipes.validate import validate

from .conftest import CONTEXT

CASES = [
    (recipe, group, option)
    for recipe in RECIPES
    for group in pack_groups()
    if group != "experiment"
    for option in group_options(group)
]


def test_every_group_has_options():
    groups = pack_groups()
    for expected in ("strategy", "parallel", "cluster", "nccl", "batching", "kl", "entropy", "overlap", "offload",
                     "rollout", "model", "task", "logger", "experiment"):
        assert expected in groups
    assert {"cpu", "tp1", "tp2", "tp4", "tp8", "tp8pp4", "tp4pp2"} <= set(group_options("parallel"))
    assert {"off", "nvlink", "ib", "roce", "debug"} == set(group_options("nccl"))
    assert len(CASES) >= 2 * 40


@pytest.mark.parametrize("recipe,group,option", CASES, ids=[f"{r}-{g}={o}" for r, g, o in CASES])
def test_option_composes_and_validates(recipe, group, option):
    overrides = [f"{group}={option}"] + CONTEXT.get((group, option), [])
    cfg = compose_recipe(recipe, overrides)
    checked = validate(cfg)  # raises ConfigError with every problem
    resolved = checked.cfg
    # the option really landed: the pack key that names the group's choice
    if group in ("strategy", "rollout"):
        assert resolved[group].name == option
    if group == "model":
        assert resolved.model.name == option
    if group == "strategy":
        assert resolved.actor_rollout_ref.actor.strategy == option
        assert resolved.critic.strategy == option


@pytest.mark.parametrize("recipe", RECIPES)
def test_experiments_compose_and_validate(recipe):
    for option in group_options("experiment"):
        checked = validate(compose_recipe(recipe, [f"experiment={option}"]))
        assert checked.train.world_size == checked.cfg.cluster.nnodes * checked.cfg.cluster.gpus_per_node
