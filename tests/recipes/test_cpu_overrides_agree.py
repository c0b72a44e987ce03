"""The CPU settings have one source, the recipes' embedded default (conf/cluster/cpu.yaml, parallel/cpu, rollout/hf,
model/tiny, task/tiny, and the default strategy fsdp2); ``recipes.verl_ext.plugin.cpu_overrides`` reads its plain verl
overrides for ``python -m verl.trainer.main_ppo`` from there. These tests hold the result against both recipes'
resolved configs, key by key, and against verl's own tree: what main_ppo composes from the list is what the recipes
run with, for every verl key those option files set."""

from __future__ import annotations

import os

import pytest
import verl
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from recipes.compose.compose import compose_recipe
from recipes.compose.confdir import conf_dir, included_files
from recipes.compose.defaults import EMBEDDED_DEFAULTS, embedded_defaults
from recipes.verl_ext.demo import ensure_tiny_assets
from recipes.verl_ext.plugin import cpu_overrides

EMBEDDED = embedded_defaults([], accelerator=False)
PLACEHOLDERS = {"{model_dir}": "model_dir", "{train_parquet}": "train_parquet", "{val_parquet}": "val_parquet",
                "{reward_py}": "reward_py"}


@pytest.fixture(scope="module")
def assets():
    return ensure_tiny_assets()


def _resolved(recipe: str, extra=()):
    return OmegaConf.to_container(compose_recipe(recipe, EMBEDDED + list(extra)), resolve=True)


def _select(tree: dict, dotted: str):
    node = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


def _filled(value, assets):
    if isinstance(value, str) and value in PLACEHOLDERS:
        return str(getattr(assets, PLACEHOLDERS[value]))
    return value


def _verl_main_ppo_config(assets, *deltas):
    """verl's own tree with the list, as main_ppo composes it."""
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose("ppo_trainer", overrides=cpu_overrides.cli_overrides(assets, *deltas))
    return OmegaConf.to_container(cfg, resolve=True)


def _option_leaves(path, verl_top: set[str]):
    """Every verl leaf key an option file (and the files of its group it includes) sets."""
    for source in [*included_files(path), path]:
        values = OmegaConf.to_container(OmegaConf.load(source)) or {}
        values.pop("defaults", None)
        stack = [(key, value) for key, value in values.items() if key in verl_top]
        while stack:
            key, value = stack.pop()
            if isinstance(value, dict) and value:
                stack.extend((f"{key}.{k}", v) for k, v in value.items())
            else:
                yield key


@pytest.mark.parametrize("recipe", ["grpo", "kl_ppo"])
def test_every_override_is_the_recipes_value(recipe, assets):
    tree = _resolved(recipe)
    # the keys the main_ppo demo of this algorithm sets on top (KL-PPO's 16 prompts a step where the recipe's task
    # takes 80 // rollout.n): the demo's own, documented deltas
    delta = {"grpo": cpu_overrides.GRPO_DEMO, "kl_ppo": cpu_overrides.KL_PPO_DEMO}[recipe]
    checked, differ = 0, []
    for label, group in cpu_overrides.GROUPS.items():
        if label == "demo run":  # the demo's own length and logging, not a conf option
            continue
        assert "=" in label and (conf_dir() / label.replace("=", "/")).with_suffix(".yaml").is_file(), label
        for key, value in group.items():
            key = key.lstrip("+")
            if key in delta:
                continue
            try:
                found = _select(tree, key)
            except KeyError:
                differ.append(f"{key}: missing in the recipe")
                continue
            if found != _filled(value, assets):
                differ.append(f"{key}: recipe {found!r}, cpu_overrides {value!r}")
            checked += 1
    assert not differ, "\n".join(differ)
    assert checked >= 40


def test_main_ppo_gets_the_recipes_value_for_every_key_the_cpu_options_set(assets):
    """Independent of how the list is made: verl's tree + the list == the recipe, for each verl key in the files."""
    verl_cfg = _verl_main_ppo_config(assets)
    recipe = _resolved("grpo")
    demo = {key.lstrip("+") for key in cpu_overrides.DEMO_RUN}
    files = [conf_dir() / group / f"{option}.yaml" for group, option in EMBEDDED_DEFAULTS.items()]
    files.append(conf_dir() / "strategy" / "fsdp2.yaml")
    checked, differ = 0, []
    for path in files:
        for key in _option_leaves(path, set(verl_cfg)):
            if key in demo:
                continue
            expected, got = _select(recipe, key), _select(verl_cfg, key)
            if expected != got:
                differ.append(f"{key} ({path.name}): recipe {expected!r}, main_ppo {got!r}")
            checked += 1
    assert not differ, "\n".join(differ)
    assert checked >= 45
    # and the routed keys: the recipes' layout and model paths reach verl's own keys
    for key in ("trainer.n_gpus_per_node", "actor_rollout_ref.rollout.tensor_model_parallel_size", "critic.model.path"):
        assert _select(verl_cfg, key) == _select(recipe, key), key


def test_world_size_is_the_recipes_cluster_gpus_per_node(assets):
    """world_size(n) is what cluster.gpus_per_node=n changes in the recipe: ranks, Ray GPUs, one hf server."""
    delta = cpu_overrides.world_size(2)
    assert {key.lstrip("+") for key in delta} == {
        "trainer.n_gpus_per_node",
        "ray_kwargs.ray_init.num_gpus",
        "actor_rollout_ref.rollout.tensor_model_parallel_size",
    }
    recipe = _resolved("grpo", ["cluster.gpus_per_node=2"])
    for key, value in delta.items():
        assert value == 2 == _select(recipe, key.lstrip("+")), key
    verl_cfg = _verl_main_ppo_config(assets, delta)
    assert verl_cfg["trainer"]["n_gpus_per_node"] == verl_cfg["ray_kwargs"]["ray_init"]["num_gpus"] == 2


def test_every_key_comes_from_a_conf_file():
    origins = cpu_overrides.ORIGINS
    for label, group in cpu_overrides.GROUPS.items():
        if label == "demo run":
            continue
        for key in group:
            path = origins[key.lstrip("+")]
            assert path.is_file() and path.is_relative_to(conf_dir()), (key, path)
