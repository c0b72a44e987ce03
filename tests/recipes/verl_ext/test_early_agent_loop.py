"""The agent-loop worker processes started early (recipes/verl_ext/early_agent_loop.py): one per verl agent-loop
worker, only where verl's own TransferQueue manager runs on one node, and answering every method verl's worker has.
Adoption itself runs in every CPU training run (tests/e2e/test_demo.py reads it in verl.log)."""

from __future__ import annotations

import inspect

from omegaconf import OmegaConf

from recipes.compose.compose import compose_recipe
from recipes.verl_ext import early_agent_loop


def _config():
    cfg = compose_recipe("grpo", ["cluster=cpu", "parallel=cpu", "model=tiny", "task=tiny", "rollout=hf"])
    return OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))


def test_one_shell_per_agent_loop_worker_and_none_for_another_manager_or_several_nodes():
    cfg = _config()
    OmegaConf.update(cfg, "actor_rollout_ref.rollout.agent.num_workers", 3)
    assert early_agent_loop.worker_names(cfg) == [f"{early_agent_loop.PREFIX}{i}" for i in range(3)]
    assert early_agent_loop.wanted(cfg)
    several = OmegaConf.merge(cfg, {"trainer": {"nnodes": 2}})
    assert not early_agent_loop.wanted(several) and early_agent_loop.start(several) == []
    custom = OmegaConf.merge(cfg, {"actor_rollout_ref": {"rollout": {"agent": {
        "agent_loop_manager_class": "my_team.agents.Manager"}}}})
    assert not early_agent_loop.wanted(custom) and early_agent_loop.start(custom) == []


def test_the_shell_answers_every_public_method_of_verls_worker():
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    verls = AgentLoopWorkerTQ.__ray_actor_class__
    public = {name for name, member in inspect.getmembers(verls, inspect.isfunction) if not name.startswith("_")}
    shell = early_agent_loop.AgentLoopWorkerTQ
    assert public == {"generate_sequences"}  # the one verl's managers call (AgentLoopManager(TQ).generate_sequences)
    assert all(inspect.iscoroutinefunction(getattr(shell, name)) for name in public)
    assert shell.__name__ == verls.__name__  # Ray's log prefix and process title stay verl's
