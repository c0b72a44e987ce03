"""Start what verl's task runner waits for while the task runner itself is still importing verl.

verl 0.9.1's ``TaskRunnerV1.run`` begins with ``transfer_queue.init``: it creates TransferQueue's controller actor,
waits for it, then the storage units, and waits for them; later its trainer builds the actor workers, and only then
the rollout replicas start their servers and wait for them. Each of these is a fresh Ray worker process that imports
torch (2.5 to 5 s on 2 cores), one after the other, while the other core idles. :class:`EarlyStart` stands for the
task-runner class in verl's ``run_ppo``: when verl creates the task runner, a thread of this process first runs the
same ``transfer_queue.init`` (the controller and the storage start while the task runner imports verl), then starts
the ``hf`` rollout's servers (they start while the task runner builds its workers). The task runner's ``tq.init``
finds the controller (TransferQueue's own "attach to an existing controller" path); the ``hf`` replicas find their
servers by name (:func:`recipes.verl_ext.plugin.hf_rollout.started_server`).

Nothing else changes: the same config, actors, names and options. If an early start fails, its half-made controller
is removed and verl starts what is missing itself, as without this.
"""

from __future__ import annotations

import logging
import sys
import threading
import time

logger = logging.getLogger(__name__)

MARKER = "early start"  # the line it writes to verl.log begins so


class EarlyStart:
    """``task_runner_class`` for verl's ``run_ppo``: ``remote()`` starts TransferQueue here, then the task runner."""

    def __init__(self, runner_class, config) -> None:
        self.runner_class = runner_class
        self.config = config
        self.started: list = []  # handles of what the thread started: held for the run (Ray ends unheld actors)

    def options(self, **options):
        """verl's profiler path calls ``options(...).remote()``: the same early start, with the options kept."""
        return EarlyStart(self.runner_class.options(**options), self.config)

    def remote(self, *args, **kwargs):
        threading.Thread(target=start_early, args=(self.config, self.started), name="early-start", daemon=True).start()
        return self.runner_class.remote(*args, **kwargs)


def start_early(config, started: list) -> None:
    """TransferQueue, then the hf rollout's servers (they start while verl's task runner builds its workers), then
    verl's reward-loop workers (recipes/verl_ext/early_reward.py), the agent-loop workers' processes
    (recipes/verl_ext/early_agent_loop.py) and the request router (recipes/verl_ext/early_router.py); the handles
    go into ``started``."""
    begun = time.perf_counter()
    tq_ok = start_transfer_queue(config.transfer_queue)
    servers = _started("the hf rollout's servers", "verl's replicas start them", _hf_servers, config, started)
    rewarders = _started("the reward-loop workers", "verl starts them", _reward_workers, config, started)
    agents = _started("the agent-loop workers", "verl starts them", _agent_loop_workers, config, started)
    routers = _started("the request router", "verl starts it", _router, config, started)
    print(f"{MARKER}: TransferQueue {'up' if tq_ok else 'left to the task runner'} after "
          f"{time.perf_counter() - begun:.1f} s; hf rollout servers started: {len(servers)}; reward-loop workers "
          f"started: {len(rewarders)}; agent-loop workers started: {len(agents)}; request router started: "
          f"{len(routers)}", flush=True)


def _started(what: str, otherwise: str, start, config, started: list) -> list:
    """``start(config)``'s handles, added to ``started``; none where it fails (verl then starts its own)."""
    try:
        handles = start(config)
    except Exception as error:  # noqa: BLE001 - verl starts what is missing itself, as without the early start
        logger.warning("early start of %s failed (%s); %s", what, error, otherwise)
        return []
    started.extend(handles)
    return handles


def _hf_servers(config) -> list:
    from recipes.verl_ext.plugin.hf_rollout import start_servers  # lazy: imports transformers

    return start_servers(config)


def _reward_workers(config) -> list:
    from recipes.verl_ext.early_reward import start  # lazy: imports verl's reward loop

    return start(config)


def _agent_loop_workers(config) -> list:
    from recipes.verl_ext.early_agent_loop import start  # lazy: for training only

    return start(config)


def _router(config) -> list:
    from recipes.verl_ext.early_router import start  # lazy: for training only

    return start(config)


def start_transfer_queue(conf) -> bool:
    """``transfer_queue.init(conf)`` as the task runner would call it (``enable`` set); on failure, no leftovers."""
    import ray  # lazy: only a training run starts Ray
    import transfer_queue as tq  # lazy: imports torch
    from omegaconf import OmegaConf

    conf = OmegaConf.create(OmegaConf.to_container(conf, resolve=True))
    conf.enable = True  # what TaskRunnerV1.run sets before its own tq.init
    try:
        tq.init(conf)
        return True
    except Exception as error:  # the task runner's own tq.init starts it then
        logger.warning("early TransferQueue start failed (%s); verl's task runner starts it", error)
        try:
            ray.kill(ray.get_actor("TransferQueueController", namespace="transfer_queue"))
        except Exception:  # noqa: BLE001 - nothing was created
            pass
        return False


def close_transfer_queue() -> None:
    """This process's TransferQueue client and storage handles released (the next run of a sweep starts fresh)."""
    tq = sys.modules.get("transfer_queue")
    if tq is None:
        return
    kill_storage_units()
    try:
        tq.close()
    except Exception as error:  # noqa: BLE001 - Ray may already be down; the actors died with it
        logger.debug("TransferQueue close: %s", error)


def kill_storage_units() -> None:
    """The storage units this process started, killed, and TransferQueue told they are gone.

    TransferQueue's ``close()`` asks each SimpleStorage unit to stop and waits for it; the unit joins its worker
    thread, which polls its socket once a second: about 1 s at the end of every run, though the units hold nothing
    the run still needs and ``ray.shutdown`` ends them as surely. Here they are killed (``ray.kill`` does not wait)
    and TransferQueue's record of them (``transfer_queue.interface._TQ_STORAGE``, the TransferQueue verl 0.9.1
    installs) is cleared, so ``close()`` goes on to the client and the controller only. Other backends are left to
    ``close()``."""
    interface = sys.modules.get("transfer_queue.interface")
    storage = getattr(interface, "_TQ_STORAGE", None)
    if not storage or set(storage) != {"SimpleStorage"}:
        return
    import ray  # lazy: only a training run has started Ray

    for handle in storage["SimpleStorage"].values():
        try:
            ray.kill(handle)
        except Exception as error:  # noqa: BLE001 - already gone with Ray; nothing else to release
            logger.debug("TransferQueue storage unit: %s", error)
    interface._TQ_STORAGE = None
