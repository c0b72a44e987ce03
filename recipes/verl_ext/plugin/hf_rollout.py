"""The ``hf`` rollout backend: HF-transformers generation behind verl's server-mode rollout interfaces.

verl 0.9.1 generates through *servers*: an agent loop asks a ``RolloutReplica``'s server actor for
``generate(prompt_ids, sampling_params, ...) -> TokenOutput``; after each training step the actor workers push their
weights into the rollout through a worker-side ``BaseRollout`` adapter. The three pieces, with plain
``transformers`` so verl's real trainer runs where vLLM/SGLang cannot (a CPU):

- the server (:class:`recipes.verl_ext.plugin.hf_server.HFServer`, run by Ray behind the shell of
  :mod:`recipes.verl_ext.hf_server_actor`): an HF model that batches the requests arriving together, in fp32 as the
  actor's stream hands it over, so the sync check compares the same bits; generate's cache is freed after each
  batch.
- :class:`HFReplica`: verl's ``RolloutReplica`` for ``rollout.name=hf``; one server per replica, on the node of the
  replica's first worker.
- :class:`HFRolloutAdapter`: the ``BaseRollout`` in each actor worker. ``update_weights`` drains the actor's weight
  stream on every rank and the replica's first rank hands the full state dict to its server: :func:`hand_off_weights`
  is that hand-off, in one place. The stream is the resharding executor's (``weight_sync``): each rank sends its
  FSDP2 rows to the feeders only, so a rank that feeds no server receives nothing (verl's own path, kept as the
  fallback, all-gathers every tensor on every rank). Each rank's bytes per sync go to ``$KLPPO_SYNC_LOG``.

Weight sync can be switched off with ``KLPPO_SYNC_WEIGHTS=0`` (the rollout then keeps its initial weights,
and verl's ``training/rollout_probs_diff_*`` metrics show the actor drifting away from it).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable

import ray
import torch
from omegaconf import OmegaConf
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import CONTROL_METHOD_CONCURRENCY, RolloutReplica

from recipes import envvars
from recipes.verl_ext import hf_server_actor
from recipes.verl_ext.plugin.packed_weights import PackedWeights, pack
from recipes.verl_ext.plugin.weight_sync import (
    SyncCheckFailed,
    check_generation_side,
    check_training_side,
    enable_sharded_export,
    open_weight_stream,
    training_checksums,
)

__all__ = [
    "ROLLOUT_NAME",
    "SYNC_WEIGHTS_ENV",
    "HFReplica",
    "HFRolloutAdapter",
    "hand_off_weights",
    "server_name",
    "weight_sync_enabled",
]

logger = logging.getLogger(__name__)

ROLLOUT_NAME = "hf"
SYNC_WEIGHTS_ENV = envvars.SYNC_WEIGHTS


def weight_sync_enabled() -> bool:
    """False when ``KLPPO_SYNC_WEIGHTS`` is ``0``/``false``/``no``/``off``; true otherwise."""
    return not envvars.is_off(SYNC_WEIGHTS_ENV)


def server_name(replica_rank: int) -> str:
    """Ray actor name of a replica's server; the adapter finds its server by it."""
    return f"{ROLLOUT_NAME}_server_{replica_rank}"


def hand_off_weights(weights: Iterable[tuple[str, torch.Tensor]], keep: bool) -> PackedWeights | None:
    """Drain the actor's ``(name, full tensor)`` stream; return it packed in one host buffer where ``keep``, else None.

    Every rank must drain the stream, because its collectives run while it is yielded (the resharder's all-to-all,
    or verl's per-tensor ``full_tensor()``); only the rank that feeds a server keeps the tensors. This is the single
    place where weights leave the actor for the rollout (``packed_weights``: Ray moves one buffer ~10x faster than a
    dict of tensors).
    """
    if keep:
        return pack(weights)
    for _ in weights:
        pass
    return None


class HFReplica(RolloutReplica):
    """One :class:`HFServer` per replica (``rollout.tensor_model_parallel_size`` workers, usually 1)."""

    async def launch_servers(self) -> None:
        name = server_name(self.replica_rank) + self.name_suffix
        server = started_server(name)
        if server is not None:  # started by the driver while verl started its workers (recipes/verl_ext/early_start.py)
            print(f"hf rollout: replica {self.replica_rank} takes the server {name} started early", flush=True)
        else:
            if self.workers:
                node_id = await self.workers[0].__ray_call__.remote(
                    lambda worker: ray.get_runtime_context().get_node_id()
                )
            else:
                node_id = ray.get_runtime_context().get_node_id()
            server = start_server(name, node_id, self.max_concurrency, self.config, self.model_config,
                                  self.replica_rank)
        self.servers = [server]
        self._server_handle = server
        self._server_address = name  # no HTTP endpoint: the load balancer only needs a unique key

    def rollout_worker_use_gpu(self) -> bool:
        return False


def worker_device_uuid() -> str | None:
    """The UUID of this worker's current GPU (what the server moves to), or None on a machine without CUDA."""
    if not torch.cuda.is_available():
        return None
    return str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)


def started_server(name: str):
    """The handle of a server of that name already started in this Ray job, or None."""
    try:
        return ray.get_actor(name)
    except ValueError:
        return None


def start_servers(config) -> list:
    """The hybrid replicas' servers, started as :meth:`HFReplica.launch_servers` would start them, from the driver.

    Only for one node (each server must sit on its replica's first worker's node; on one node that is this node)
    and the colocated hybrid engine (``LLMServerManager`` then makes ``n_gpus_per_node * nnodes / (tp * dp * pp)``
    replicas, ranks from 0, no name suffix). Returns the handles; the replicas adopt them by name. The caller keeps
    the handles for the whole run: Ray ends an actor once no handle to it is left in its owner.
    """
    config = OmegaConf.create(OmegaConf.to_container(config, resolve=True))  # what verl's task runner hands on
    rollout = config.actor_rollout_ref.rollout
    if rollout.name != ROLLOUT_NAME or int(config.trainer.nnodes) != 1 or not config.actor_rollout_ref.hybrid_engine:
        return []
    per_replica = (
        int(rollout.tensor_model_parallel_size)
        * int(rollout.data_parallel_size)
        * int(rollout.pipeline_model_parallel_size)
    )
    node_id = ray.get_runtime_context().get_node_id()
    concurrency = max(1000, int(rollout.max_num_seqs) + CONTROL_METHOD_CONCURRENCY)  # RolloutReplica.max_concurrency
    return [
        start_server(server_name(rank), node_id, concurrency, rollout, config.actor_rollout_ref.model, rank)
        for rank in range(int(config.trainer.n_gpus_per_node) // per_replica)
    ]


def start_server(name: str, node_id: str, max_concurrency: int, config, model_config, replica_rank: int):
    """One :class:`HFServer` actor of that name on that node (no CPU reserved: generation shares the node). Ray
    gets the shell class of :mod:`recipes.verl_ext.hf_server_actor`: a holder of the handle (verl's load balancer)
    then loads no torch and no verl."""
    return ray.remote(hf_server_actor.HFServer).options(
        name=name,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
        max_concurrency=max_concurrency,
        num_cpus=0,
    ).remote(config=config, model_config=model_config, replica_rank=replica_rank)


class HFRolloutAdapter(BaseRollout):
    """The rollout side of each actor worker: receives the actor's weights every step."""

    def __init__(self, config, model_config, device_mesh, *args, replica_rank: int = -1, **kwargs) -> None:
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", "0"))
        rollout_world_size = (
            self.config.tensor_model_parallel_size
            * self.config.data_parallel_size
            * self.config.pipeline_model_parallel_size
        )
        self.replica_rank = rank // rollout_world_size if replica_rank < 0 else replica_rank
        self.rollout_rank = rank % rollout_world_size
        self.rollout_world_size = rollout_world_size
        # the resharder moves the weights in buckets of verl's rollout.update_weights_bucket_megabytes
        bucket_mb = getattr(self.config, "update_weights_bucket_megabytes", None)
        self.bucket_bytes = int(float(bucket_mb) * 2**20) if bucket_mb else None
        self.sync_weights = weight_sync_enabled()
        self._server = None
        self.device_uuid = worker_device_uuid()  # the server generates on this GPU (None: no CUDA here)
        enable_sharded_export()  # the actor engine now exports its FSDP2 state dict / Megatron parameters too
        if not self.sync_weights and rank == 0:
            logger.warning("%s=0: the hf rollout keeps its initial weights (weight sync is off)", SYNC_WEIGHTS_ENV)

    @property
    def server(self):
        if self._server is None:
            self._server = ray.get_actor(server_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]) -> None:
        return None

    async def release(self) -> None:
        return None

    async def update_weights(
        self, weights, global_steps: int | None = None, wire_format: str = "named_tensors", **kwargs
    ):
        if wire_format != "named_tensors":
            raise NotImplementedError(f"the hf rollout takes wire_format='named_tensors', got {wire_format!r}")
        if kwargs.get("peft_config") is not None:
            raise NotImplementedError("the hf rollout takes merged weights only (model.lora.merge=True)")
        feeds_server = self.rollout_rank == 0
        if not self.sync_weights:  # every rank skips alike: nothing is gathered, no collective runs
            if feeds_server and global_steps is not None:
                await self.server.set_global_steps.remote(global_steps, self.device_uuid)
            return
        check_started = time.perf_counter()
        train = training_checksums(weights)  # every rank, on device; NaN/Inf stops here, before the stream
        check_seconds = time.perf_counter() - check_started
        check_training_side(train, global_steps)
        sync = open_weight_stream(
            weights,
            global_steps=global_steps,
            rollout_world_size=self.rollout_world_size,
            feeder=feeds_server,
            bucket_bytes=self.bucket_bytes,
        )
        state = hand_off_weights(sync.stream, keep=feeds_server)
        seconds = time.perf_counter() - sync.started
        generation = (
            await self.server.update_weights.remote(state, global_steps, self.device_uuid)
            if state is not None
            else None
        )
        mismatch = check_generation_side(sync.record, train, generation, check_seconds)
        sync.finish(tensors=len(state) if state is not None else 0, seconds=seconds)
        if mismatch:
            raise SyncCheckFailed(f"weight sync for step {global_steps}: {mismatch}")
