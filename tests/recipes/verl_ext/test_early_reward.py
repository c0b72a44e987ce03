"""The reward-loop workers started early are made for the config verl's manager will hold (recipes/verl_ext/
early_reward.py): the digest ignores exactly what verl writes on the way and sees any other change. Adoption itself
runs in every CPU training run (tests/e2e/test_demo.py reads it in verl.log)."""

from __future__ import annotations

import copy

from omegaconf import OmegaConf

from recipes.compose.compose import compose_recipe
from recipes.verl_ext import early_reward


def _config():
    cfg = compose_recipe("kl_ppo", ["cluster=cpu", "parallel=cpu", "model=tiny", "task=tiny", "rollout=hf"])
    return OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))


def test_what_verl_sets_on_the_way_keeps_the_digest_and_anything_else_changes_it():
    cfg = _config()
    driver = early_reward.config_digest(cfg)
    runner = copy.deepcopy(cfg)  # as verl's task runner and trainer leave it (TaskRunnerV1.run, the trainer's init)
    OmegaConf.update(runner, "transfer_queue.enable", not cfg.transfer_queue.enable)
    OmegaConf.update(runner, "data.gen_batch_size", 1, force_add=True)
    OmegaConf.update(runner, "trainer.v1.trainer_mode", "sync")  # the pack's StabilityTrainer
    OmegaConf.update(runner, "actor_rollout_ref.actor.optim.total_training_steps", 20)
    OmegaConf.update(runner, "critic.optim.total_training_steps", 20)
    OmegaConf.update(runner, "reward.reward_model.nnodes", 3)
    OmegaConf.update(runner, "reward.reward_model.n_gpus_per_node", 7)
    assert early_reward.config_digest(runner) == driver
    for key, value in (("reward.reward_manager.name", "dapo"), ("actor_rollout_ref.model.path", "/elsewhere"),
                       ("data.reward_fn_key", "source")):
        other = copy.deepcopy(cfg)
        OmegaConf.update(other, key, value, force_add=True)
        assert early_reward.config_digest(other) != driver, key


def test_one_name_per_reward_worker_and_none_with_a_reward_model_or_several_nodes():
    cfg = _config()
    OmegaConf.update(cfg, "reward.num_workers", 3)
    names = early_reward.worker_names(cfg)
    assert len(names) == 3 and len(set(names)) == 3
    assert all(n.startswith(early_reward.PREFIX + early_reward.config_digest(cfg)) for n in names)
    several = copy.deepcopy(cfg)
    OmegaConf.update(several, "trainer.nnodes", 2)
    assert early_reward.start(several) == []  # verl spreads them over the nodes: left to verl
    OmegaConf.update(cfg, "reward.reward_model.enable", True)
    assert early_reward.start(cfg) == []  # the model's router address exists only once the task runner starts it
