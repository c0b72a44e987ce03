"""verl 0.9.1's registries, read to check names before Ray starts (recipes/check/lookups.py, issue 49): the rollout
engines, the reward managers and the devices verl can start. Read only; each read is a row of
recipes/verl_ext/patch_table.py. Each function imports verl (seconds), so validation calls them in its verl phase
only."""

from __future__ import annotations

__all__ = ["device_names", "reward_manager_names", "rollout_names"]


def rollout_names() -> tuple[str, ...]:
    """The engines verl 0.9.1 can start: a server replica (RolloutReplicaRegistry) with a worker adapter
    (``_ROLLOUT_REGISTRY``, async mode); the pack's plugin adds ``hf`` to both."""
    from verl.workers.rollout import base, replica  # lazy: verl imports in seconds

    servers = set(replica.RolloutReplicaRegistry._registry)
    adapters = {name for name, mode in base._ROLLOUT_REGISTRY if mode == "async"}
    return tuple(sorted(servers & adapters))


def reward_manager_names() -> tuple[str, ...]:
    """The reward managers verl 0.9.1's reward loop finds by name (``source: register``)."""
    import verl.experimental.reward_loop.reward_manager  # noqa: F401 - lazy: its imports register the managers
    from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER

    return tuple(sorted(REWARD_MANAGER))


def device_names() -> tuple[str, ...]:
    """The ``trainer.device`` values verl 0.9.1 runs on: the device of each platform in its PlatformRegistry, and the
    pack's CPU platform (registered only where it is wanted)."""
    from verl.plugin.platform.platform_manager import PlatformRegistry  # lazy: verl imports in seconds

    from recipes.verl_ext.plugin.platform import PlatformCPU  # lazy: it imports verl, as the line above

    names = {PlatformCPU().device_name}
    for platform in PlatformRegistry.registered_names():
        try:
            names.add(PlatformRegistry.get(platform)().device_name)
        except Exception:  # noqa: BLE001, S112 - a vendor platform that cannot even be described here
            continue
    return tuple(sorted(names))
