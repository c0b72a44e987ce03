"""The pack's copies of verl 0.9.1's small decisions agree with verl's own functions."""

from __future__ import annotations

import copy
import functools
import itertools
import warnings

import pytest
from omegaconf import OmegaConf
from verl.trainer.ppo.utils import need_critic, need_reference_policy

from recipes.compose import compose_recipe
from recipes.verl_ext import api

CASES = list(itertools.product(
    ["grpo", "kl_ppo"],
    ["gae", "grpo", "reinforce_plus_plus", "rloo"],
    [None, True, False],
    [True, False],
    [True, False],
))


@pytest.mark.parametrize("recipe,estimator,critic,kl_in_reward,kl_loss", CASES)
def test_roles_match_verl(recipe, estimator, critic, kl_in_reward, kl_loss):
    cfg = copy.deepcopy(_composed(recipe))
    for key, value in (("algorithm.adv_estimator", estimator), ("critic.enable", critic),
                       ("algorithm.use_kl_in_reward", kl_in_reward), ("actor_rollout_ref.actor.use_kl_loss", kl_loss)):
        OmegaConf.update(cfg, key, value)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = (bool(need_critic(cfg)), bool(need_reference_policy(cfg)))
    assert api.roles(cfg) == expected


@functools.cache
def _composed(recipe):
    return compose_recipe(recipe, ["parallel=tp1"])
