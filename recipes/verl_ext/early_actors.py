"""The named Ray actors the driver starts early for verl (``early_reward``, ``early_agent_loop``, ``early_router``):
finding them, ending those verl's managers do not take, and the import they run ahead of verl's first request."""

from __future__ import annotations

import threading
import time


def named_with(prefix: str) -> list[str]:
    """The names of this job's named actors that begin with ``prefix``, sorted."""
    import ray  # lazy: runs in verl's task runner

    return sorted(name for name in ray.util.list_named_actors() if name.startswith(prefix))


def end(names: list[str]) -> None:
    """Kill the actors of these names (one already gone is skipped)."""
    import ray  # lazy: runs in verl's task runner

    for name in names:
        try:
            ray.kill(ray.get_actor(name))
        except ValueError:  # gone meanwhile
            pass


def heavy_rollout(config) -> str | None:
    """The rollout engine of ``config`` whose server class is heavy to load (vLLM, SGLang: verl's modules that import
    the engine), which the early actors import ahead; None for the pack's ``hf``, whose server class is light."""
    rollout = str(config.actor_rollout_ref.rollout.name)
    return None if rollout == "hf" else rollout


class WarmImport:
    """The module of a rollout engine's replica and server classes (verl's ``RolloutReplicaRegistry``), imported in a
    thread of this process: a process that later unpickles a handle to one of the engine's servers (Ray loads the
    actor's class for it) then finds the module loaded. :meth:`wait` before this process imports anything else, so
    that two threads never import at once."""

    def __init__(self, rollout: str) -> None:
        self._said = ""
        self._thread = threading.Thread(target=self._run, args=(rollout,), name="klppo-warm-import", daemon=True)
        self._thread.start()

    def _run(self, rollout: str) -> None:
        begun = time.perf_counter()
        try:
            from verl.workers.rollout.replica import RolloutReplicaRegistry  # lazy: the point is to import it here

            module = RolloutReplicaRegistry.get(rollout).__module__
        except Exception as error:  # noqa: BLE001 - the first handle then loads it, as without this
            self._said = f"{rollout}'s server module not imported ahead: {error}"
        else:
            self._said = f"{module} imported ahead in {time.perf_counter() - begun:.1f} s"

    def wait(self) -> str:
        """What the import did (the module and its seconds, or why not), once it is done."""
        self._thread.join()
        return self._said
