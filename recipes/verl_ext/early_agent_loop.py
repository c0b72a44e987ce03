"""verl's agent-loop worker processes, started by the driver while verl's task runner is still starting, adopted by
its agent-loop manager.

verl 0.9.1 creates its agent-loop workers (``AgentLoopManager._init_agent_loop_workers``) after the trainer has
built everything else: each is a fresh Ray worker that imports torch, transformers and verl (~5 CPU-s) while the
first step waits and the other core idles. Its arguments (the LLM client, the reward-loop handles) exist only then,
so the early start cannot build the worker itself. :func:`start` starts, from the driver's early-start thread
(:mod:`recipes.verl_ext.early_start`), one :class:`AgentLoopWorkerTQ` shell per worker: a Ray actor whose
``__init__`` only imports verl's agent loop, and in a thread the rollout engine's server module (for vLLM and
SGLang: the first server handle the router hands the worker would load it, 2-5 s before the first request). The
patched ``_init_agent_loop_workers`` (:func:`adopt`, installed by ``recipes.verl_ext.plugin.patches``) hands each shell
the manager's own arguments (:meth:`AgentLoopWorkerTQ.build` builds verl's worker with them, on the actor's event-loop
thread, where Ray runs an async actor's ``__init__``) and takes the shells as its workers; ``generate_sequences``, the
one method verl calls on them, is the worker's.

Only for verl's TransferQueue manager (``AgentLoopManagerTQ``, the v1 trainer's) and one node; with any other
manager class, or a set of shells that does not match ``agent.num_workers``, the shells are ended and verl creates
its own, as without this.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from recipes.verl_ext import early_actors

logger = logging.getLogger(__name__)

PREFIX = "klppo_early_agent_loop_"


class AgentLoopWorkerTQ:
    """A Ray worker that holds verl's ``AgentLoopWorkerTQ`` once :meth:`build` has made it (the class keeps verl's
    name: Ray's log prefix and process title stay ``AgentLoopWorkerTQ``)."""

    def __init__(self, rollout: str | None = None) -> None:
        # lazy: these imports are the point of the early start: they run while verl builds its actor workers
        import verl.trainer.ppo.v1.agent_loop_tq  # noqa: F401

        self._worker = None
        # the first server handle the router hands this worker loads the engine's server class: imported ahead
        self._warm = early_actors.WarmImport(rollout) if rollout else None

    def build(self, *args: Any, **kwargs: Any) -> None:
        """verl's worker, made with the manager's arguments (a sync method of an async actor: Ray runs it on the
        event-loop thread, as it runs the actor's ``__init__``), once the engine's module is imported."""
        from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ  # lazy: imported by __init__ already

        if self._warm is not None:
            self._warm.wait()
        self._worker = AgentLoopWorkerTQ.__ray_actor_class__(*args, **kwargs)

    async def generate_sequences(self, batch: Any) -> Any:
        """verl's ``AgentLoopWorkerTQ.generate_sequences``."""
        return await self._worker.generate_sequences(batch)


def worker_names(config) -> list[str]:
    """The names of the early shells for ``config``: one per ``actor_rollout_ref.rollout.agent.num_workers``."""
    return [f"{PREFIX}{i}" for i in range(int(config.actor_rollout_ref.rollout.agent.num_workers))]


def wanted(config) -> bool:
    """Whether verl's v1 trainer builds ``AgentLoopManagerTQ`` on one node for ``config``."""
    agent = config.actor_rollout_ref.rollout.get("agent") or {}
    return int(config.trainer.nnodes) == 1 and not agent.get("agent_loop_manager_class")


def start(config) -> list:
    """The shells for ``config`` (non-blocking; the caller holds the handles for the run: Ray ends an actor once no
    handle to it is left in its owner), placed as verl places its workers on one node."""
    if not wanted(config):
        return []
    import ray  # lazy: only a training run starts Ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # lazy: as above

    node_id = ray.get_runtime_context().get_node_id()
    shell = ray.remote(AgentLoopWorkerTQ)
    warm = early_actors.heavy_rollout(config)
    return [shell.options(name=name, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=True))
            .remote(warm) for name in worker_names(config)]


async def adopt(manager) -> list | None:
    """The early shells, built with ``manager``'s arguments, or None: then every early shell is ended and verl
    creates its own workers."""
    import ray  # lazy: runs in verl's task runner
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ as Verls  # lazy: as above

    present = early_actors.named_with(PREFIX)
    names = worker_names(manager.config)
    if present and manager.agent_loop_workers_class is Verls and wanted(manager.config) and present == sorted(names):
        shells = [ray.get_actor(name) for name in names]
        try:
            await asyncio.gather(*[
                shell.build.remote(manager.config, manager.llm_client, manager.teacher_client,
                                   manager.reward_loop_worker_handles) for shell in shells])
        except Exception as error:  # noqa: BLE001 - verl's own workers then, as without the early start
            logger.warning("early agent-loop workers failed to build (%s); verl starts its own", error)
        else:
            print(f"agent loop: the manager takes the workers started early ({', '.join(names)})", flush=True)
            return shells
    early_actors.end(present)
    if present:
        logger.warning("early agent-loop workers not adopted (%s for %d workers); verl starts its own",
                       ", ".join(present), len(names))
    return None
