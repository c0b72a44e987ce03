"""The pack's copies of verl 0.9.1's small decisions agree with verl's own functions."""

from __future__ import annotations

import copy
import functools
import importlib.util
import itertools
import sys
import warnings

import pytest
from omegaconf import OmegaConf
from verl.trainer.ppo.utils import need_critic, need_reference_policy

from recipes.compose.compose import compose_recipe
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


def test_lora_rank_fallback_is_verls_own():
    """Where vLLM is absent, validation checks a LoRA rank on the list verl's get_vllm_max_lora_rank falls back to."""
    import ast
    import importlib.util
    from typing import get_args

    source = open(importlib.util.find_spec("verl").submodule_search_locations[0]
                  + "/workers/rollout/vllm_rollout/utils.py").read()
    fallback = next(node for node in ast.walk(ast.parse(source))
                    if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "MaxLoRARanks")
    assert ast.literal_eval(fallback.value.slice) == get_args(api.VLLM_LORA_RANKS)
    assert [api.max_lora_rank(r) for r in (1, 2, 64, 65, 300, 512)] == [1, 8, 64, 128, 320, 512]
    with pytest.raises(ValueError, match="lora_rank must be less than or equal to 512, but got 513"):
        api.max_lora_rank(513)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM installed: verl's own check runs")
def test_verl_validator_checks_lora_without_vllm():
    cfg = _composed("grpo")
    cfg = copy.deepcopy(cfg)
    OmegaConf.update(cfg, "actor_rollout_ref.model.lora_rank", 64)
    api.validate_config(cfg, use_critic=False, use_reference_policy=True)  # no vLLM needed
    assert "verl.workers.rollout.vllm_rollout.utils" not in sys.modules  # the stand-in does not outlive the check
    OmegaConf.update(cfg, "actor_rollout_ref.model.lora_rank", 1024)
    with pytest.raises(ValueError, match="but got 1024"):
        api.validate_config(cfg, use_critic=False, use_reference_policy=True)
