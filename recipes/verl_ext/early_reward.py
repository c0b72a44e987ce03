"""verl's reward-loop workers, started by the driver while verl's task runner is still starting, adopted by its
``RewardLoopManager``.

verl 0.9.1 creates its reward-loop workers (``RewardLoopManager._init_reward_loop_workers``) after the actor workers
have built their models. Each is a fresh Ray worker that imports torch, transformers and verl and loads the tokenizer
(~5 CPU-s), at the moment the agent-loop workers start for the first step: on 2 cores the first step waited for both.
:func:`start` creates them from the driver's early-start thread (:mod:`recipes.verl_ext.early_start`), the same class
with the same arguments, under names that carry a digest of the config they were made with; the patched
``_init_reward_loop_workers`` (:func:`adopt`, installed by ``recipes.verl_ext.plugin.patches``) takes them by name
when its own config has that digest, and otherwise ends them and creates verl's own, as without this.

Only for rule-based reward (with a reward model the workers need the model's router address, which exists only once
the task runner has started the model) and on one node (verl spreads the workers over the nodes; the early start
would put them all on the driver's).
"""

from __future__ import annotations

import hashlib
import json
import logging

from omegaconf import OmegaConf

from recipes.verl_ext import early_actors

logger = logging.getLogger(__name__)

PREFIX = "klppo_early_reward_loop_"

SET_BY_VERL = (
    # what verl's task runner and trainer write into the config before the reward-loop manager reads it
    # (TaskRunnerV1.run; RayPPOTrainer._init_dataloader and _init_resource_pool_mgr, verl 0.9.1; the pack's
    # StabilityTrainer runs as verl's sync mode: recipes/verl_ext/stability/trainer.py)
    "transfer_queue.enable",
    "trainer.v1.trainer_mode",
    "data.gen_batch_size",
    "actor_rollout_ref.actor.optim.total_training_steps",
    "critic.optim.total_training_steps",
    "reward.reward_model.nnodes",
    "reward.reward_model.n_gpus_per_node",
)


def config_digest(config) -> str:
    """A digest of ``config`` without the keys verl sets on its way to the reward-loop manager."""
    plain = OmegaConf.to_container(config, resolve=True)
    for key in SET_BY_VERL:
        *parents, leaf = key.split(".")
        node = plain
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    text = json.dumps(plain, sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def worker_names(config) -> list[str]:
    """The names of the early workers made for ``config``: one per ``reward.num_workers``."""
    digest = config_digest(config)
    return [f"{PREFIX}{digest}_{i}" for i in range(int(config.reward.num_workers))]


def start(config) -> list:
    """The reward-loop workers for ``config``, created as verl's manager creates them (non-blocking); their handles
    (the caller holds them for the run: Ray ends an actor once no handle to it is left in its owner). None made
    with a reward model or over several nodes."""
    if config.reward.reward_model.enable or int(config.trainer.nnodes) != 1:
        return []
    import ray  # lazy: only a training run starts Ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # lazy: as above
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker  # lazy: imports verl

    conf = OmegaConf.create(OmegaConf.to_container(config, resolve=True))
    conf.transfer_queue.enable = True  # what TaskRunnerV1.run sets before it builds the trainer
    node_id = ray.get_runtime_context().get_node_id()
    worker = ray.remote(RewardLoopWorker)
    return [worker.options(name=name, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=True))
            .remote(conf, None) for name in worker_names(conf)]


def adopt(manager) -> list | None:
    """The early workers made for ``manager.config`` (all of them), or None: then every early worker left is ended
    (another config's, or an incomplete set) and verl creates its own."""
    import ray  # lazy: runs in verl's task runner

    if manager.config.reward.reward_model.enable:
        return None
    wanted = worker_names(manager.config)
    present = early_actors.named_with(PREFIX)
    if present and present == sorted(wanted):
        print(f"reward loop: the manager takes the workers started early ({', '.join(wanted)})", flush=True)
        return [ray.get_actor(name) for name in wanted]
    early_actors.end(present)
    if present:
        logger.warning("early reward-loop workers not adopted (made for another config: %s); verl starts its own",
                       ", ".join(present))
    return None
