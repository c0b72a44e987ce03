"""The named Ray actors the driver starts early for verl (``early_reward``, ``early_agent_loop``): finding them and
ending those verl's managers do not take."""

from __future__ import annotations


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
