"""Every primary config x every option of every group composes, passes our checks and verl's own validator, and
every value the option's file writes lands in the resolved config."""

from __future__ import annotations

import pytest
import yaml
from omegaconf import OmegaConf

from recipes.check.validate import validate
from recipes.compose.compose import RECIPES, compose_recipe
from recipes.compose.confdir import conf_dir, group_options, pack_groups
from recipes.errors import ConfigError

from .conftest import CONTEXT

# Options whose plan, in the recipe's default layout (FSDP2 over one node of 80 GiB GPUs, llama3_1_8b; the critic
# doubles the trained state under kl_ppo; the auto token budgets, one sequence where nothing fits: the peaks below are
# the states and AdamW's step), peaks above the GPU (recipes.check.fit): each validates with a change that
# validation suggests (llama3_1_70b needs three: offload, 4 nodes, and its rollout share cannot hold the tp2
# generation shard). Strict: each must still be refused without it.
OVER_THE_GPU: dict[tuple[str, str, str], list[str]] = {
    ("grpo", "model", "llama3_1_70b"): ["offload=full", "cluster.nnodes=4"],  # 180.70 GiB in training
    ("grpo", "model", "qwen2_5_32b"): ["offload=full"],  # 101.40 GiB in generation
    ("grpo", "model", "qwen3_30b_a3b"): ["offload=optimizer"],  # 97.76 GiB in generation
    ("kl_ppo", "model", "llama3_1_70b"): ["offload=full", "cluster.nnodes=4"],  # 279.26 GiB in training
    ("kl_ppo", "model", "qwen2_5_32b"): ["offload=full"],  # 147.17 GiB in generation
    ("kl_ppo", "model", "qwen3_30b_a3b"): ["offload=full"],  # 140.41 GiB in generation
    # kl_ppo parallel=tp4pp2 and strategy=megatron (Megatron dp 1) left: 83.53 GiB in generation with the engine at
    # 0.6 of the GPU; they fit with rollout.share auto (the engine's share sized to the step's batch)
    # kl_ppo rollout=hf left: 75.73 GiB in training, the hf server's whole fp32 model (29.92 GiB) on its replica's
    # first GPU in place of a vLLM share (83.39 GiB when the planner reserved that share for it)
}

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


def _leaves(node, prefix=""):
    if isinstance(node, dict) and node:
        for key, value in node.items():
            if not (key == "defaults" and not prefix):
                yield from _leaves(value, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, node


def _written_values(path) -> dict:
    """The values an option file writes, by dotted key (an empty map is a value; interpolations are not)."""
    data = yaml.safe_load(path.read_text()) or {}
    return {key: value for key, value in _leaves(data) if not (isinstance(value, str) and "${" in value)}


def _plain(value):
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


@pytest.mark.parametrize("recipe,group,option", CASES, ids=[f"{r}-{g}={o}" for r, g, o in CASES])
def test_option_composes_and_validates(recipe, group, option):
    overrides = [f"{group}={option}"] + CONTEXT.get((group, option), [])
    if (recipe, group, option) in OVER_THE_GPU:
        with pytest.raises(ConfigError, match=r"^memory: planned peak .* > cluster.gpu.memory_gib 80"):
            validate(compose_recipe(recipe, overrides))
        overrides += OVER_THE_GPU[recipe, group, option]
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
    # every value the option's file writes (not an interpolation) is in the resolved config: nothing after it in the
    # defaults order, and no check, overrode it
    written = _written_values(conf_dir() / group / f"{option}.yaml")
    assert written, f"{group}/{option}.yaml writes no value"
    landed = {key: _plain(OmegaConf.select(resolved, key, default="<absent>")) for key in written}
    assert landed == written


@pytest.mark.parametrize("recipe", RECIPES)
def test_experiments_compose_and_validate(recipe):
    for option in group_options("experiment"):
        checked = validate(compose_recipe(recipe, [f"experiment={option}"]))
        assert checked.train.world_size == checked.cfg.cluster.nnodes * checked.cfg.cluster.gpus_per_node


ONE_DEVICE = {"cpu": ["cluster=cpu", "parallel=cpu", "model=tiny"],
              "h200": ["cluster=h200_141g", "cluster.gpus_per_node=1", "parallel=tp1", "model=tiny"]}


@pytest.mark.parametrize("where", ONE_DEVICE)
@pytest.mark.parametrize("recipe", RECIPES)
def test_the_tiny_task_takes_fixed_batching_on_one_device(recipe, where):
    """The tiny task's micro-batches divide its mini-batch per GPU (50 sequences: GRPO 10 prompts x 5, KL-PPO 50 x 1),
    as verl requires with batching=fixed (on an H200, 2026-12-01, it was 16 against GRPO's 40: refused before the
    run)."""
    checked = validate(compose_recipe(recipe, ["task=tiny", "batching=fixed", "rollout=hf", *ONE_DEVICE[where]]))
    actor = checked.cfg.actor_rollout_ref.actor
    assert actor.use_dynamic_bsz is False
    per_gpu = actor.ppo_mini_batch_size * checked.cfg.actor_rollout_ref.rollout.n
    assert per_gpu == 50 and per_gpu % actor.ppo_micro_batch_size_per_gpu == 0
    # and the log-prob passes' (50 against 16: 'data size must be divisible by force_group_size *
    # micro_batch_size_per_gpu' at the first step, 2026-12-04)
    assert per_gpu % checked.cfg.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu == 0
    assert per_gpu % checked.cfg.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu == 0


@pytest.mark.parametrize(("samples", "prompts"), [(5, 10), (1, 50), (3, 16), (7, 7), (100, 1)])
def test_the_tiny_task_takes_about_50_sequences_whatever_the_samples_per_prompt(samples, prompts):
    """50 // rollout.n prompts (pack.prompts_for): an n that does not divide 50 gets the nearest batch below it."""
    cfg = compose_recipe("grpo", ["task=tiny", *ONE_DEVICE["cpu"], f"actor_rollout_ref.rollout.n={samples}"])
    assert cfg.data.train_batch_size == prompts == cfg.actor_rollout_ref.actor.ppo_mini_batch_size


@pytest.mark.parametrize(("samples", "ranks", "prompts"), [(5, 1, 10), (5, 8, 8), (1, 8, 48), (3, 8, 16), (5, 16, 16),
                                                        (100, 8, 2), (5, 0, 10)])
def test_the_tiny_task_s_prompts_split_over_the_data_parallel_ranks(samples, ranks, prompts):
    """pack.prompts_for rounds down to a batch that splits over the ranks (50 at 5 samples on 8 GPUs: 50 % 8 = 2 was
    refused by validation, 2026-12-04); an invalid layout (dp -1 or 0) counts as one rank."""
    from recipes.compose.resolvers import _prompts_for

    assert _prompts_for(50, samples, ranks) == prompts
    assert prompts * samples % max(1, ranks) == 0


@pytest.mark.slow  # child processes
@pytest.mark.parametrize("recipe", RECIPES)
def test_the_embedded_default_with_fixed_batching_validates_on_the_command_line(recipe, tmp_path):
    import subprocess
    import sys

    argv = [sys.executable, "-m", f"recipes.{recipe}", "batching=fixed", "action=validate", f"hydra.run.dir={tmp_path}"]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "config OK" in run.stderr + run.stdout and "Traceback" not in run.stderr
    assert (tmp_path / "resolved_config.yaml").is_file()
