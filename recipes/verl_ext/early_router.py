"""verl's request router, started by the driver while verl's task runner is still starting, adopted by its server
manager.

verl 0.9.1 creates its router (``GlobalRequestLoadBalancer``, a Ray actor) when the server manager is built, just
before step 1, with the rollout servers' actor handles as its argument. Ray loads an actor's class to unpickle a
handle to it, and the class of a vLLM or SGLang server lives in a module that imports verl, torch's dynamo,
transformers' model registry and the engine: on an H100 machine the router spent about 20 s in ``__init__`` doing
that while every agent-loop worker's first request waited for it (py-spy stacks in
scripts/gpu/results/2026-12-07-h100-vs-verl-portverl/). Each agent-loop worker then loads the same class when the
router hands it a server.

:func:`start` starts the router from the driver's early-start thread (:mod:`recipes.verl_ext.early_start`) with no
servers, and its process imports the rollout's module in a thread of its own while verl builds its workers and the
servers start (:class:`recipes.verl_ext.early_actors.WarmImport`; the early agent-loop workers do the same).
The patched ``get_router_handle`` (:func:`adopt`, installed by ``recipes.verl_ext.plugin.patches``) waits for that
import, hands the router the servers with ``add_servers`` (verl's own method for hybrid scaling) and returns it in
place of a new one. The router is verl's class, unchanged but for that constructor.

Only for verl's default routing (no ``router_config_path``, no ``load_balancer_cls``) with the same
``full_determinism``, and only for engines other than the pack's ``hf`` (its server class is the pack's own, light
to load); otherwise the early router is ended and verl creates its own, as without this.
"""

from __future__ import annotations

import logging

from recipes.verl_ext import early_actors

logger = logging.getLogger(__name__)

NAME = "klppo_early_router"
_adopted: set[str] = set()  # in verl's task runner: a second router (a teacher's) is verl's own


def router_class():
    """verl's ``GlobalRequestLoadBalancer``, built with no servers; its process imports the rollout's module in the
    background (the class keeps verl's name: Ray's log prefix and process title stay verl's)."""
    from verl.workers.rollout.router import GlobalRequestLoadBalancer as Verls  # lazy: verl's router module

    class GlobalRequestLoadBalancer(Verls):
        def __init__(self, rollout: str, **kwargs) -> None:
            super().__init__(servers={}, **kwargs)
            self._klppo_deterministic = bool(kwargs.get("full_determinism", False))
            self._klppo_warm = early_actors.WarmImport(rollout)

        def klppo_ready(self) -> tuple[bool, str]:
            """Its ``full_determinism``, and the background import waited for: what it says (the module and its
            seconds, or why it failed). Nothing else imports in this process meanwhile."""
            return self._klppo_deterministic, self._klppo_warm.wait()

    return GlobalRequestLoadBalancer


def wanted(config) -> bool:
    """Whether ``config`` has verl build its default router for an engine whose server class is heavy to load."""
    return early_actors.heavy_rollout(config) is not None and not config.actor_rollout_ref.rollout.get(
        "router_config_path")


def launch(rollout: str, full_determinism: bool):
    """The early router for ``rollout`` (non-blocking; the caller holds the handle for the run), named
    :data:`NAME`, as verl's ``_create_global_sticky_inflight`` builds it."""
    import ray  # lazy: only a training run starts Ray
    from verl.workers.rollout.router import DEFAULT_ROUTING_CACHE_SIZE  # lazy: verl's router module

    return ray.remote(router_class()).options(name=NAME).remote(
        rollout, max_cache_size=DEFAULT_ROUTING_CACHE_SIZE, full_determinism=bool(full_determinism))


def start(config) -> list:
    """The early router for ``config``, where :func:`wanted`, as a list of handles."""
    if not wanted(config):
        return []
    rollout = config.actor_rollout_ref.rollout
    return [launch(str(rollout.name), bool(rollout.get("full_determinism", False)))]


def adopt(servers: dict, router_config_path, full_determinism: bool, load_balancer_cls):
    """The early router with ``servers`` added, for verl's ``get_router_handle`` with these arguments, or None:
    then the early router is ended and verl creates its own."""
    import ray  # lazy: runs in verl's task runner

    present = early_actors.named_with(NAME)
    if not present or NAME in _adopted:
        return None
    router = ray.get_actor(NAME)
    default = router_config_path is None and load_balancer_cls is None  # else no need to wait for its import
    deterministic, warmed = ray.get(router.klppo_ready.remote()) if default else (None, "")
    if default and bool(full_determinism) == deterministic:
        try:
            ray.get(router.add_servers.remote(servers))
        except Exception as error:  # noqa: BLE001 - verl's own router then, as without the early start
            logger.warning("the early request router failed to take the servers (%s); verl starts its own", error)
        else:
            _adopted.add(NAME)
            print(f"request router: verl's server manager takes the router started early ({NAME}; {warmed})",
                  flush=True)
            return router
    early_actors.end(present)
    logger.warning("early request router not adopted (router_config_path %s, load_balancer_cls %s, full_determinism "
                   "%s); verl starts its own", router_config_path,
                   getattr(load_balancer_cls, "__name__", load_balancer_cls), full_determinism)
    return None
