"""The Ray resources a run declares for the cluster it starts, against what verl 0.9.1's workers hold.

verl places each rank's workers in a placement-group bundle of ``{"CPU": 3, "GPU": 1}``
(``ResourcePoolManager.max_colocate_count`` = 3; ``RayResourcePool.get_placement_groups``), runs its ``TaskRunner``
with ``num_cpus=1``, and starts its agent-loop and reward-loop workers with Ray's default (one CPU to be scheduled,
none once running). Below that, Ray waits for the resources forever: with ``ray_kwargs.ray_init.num_cpus=4`` and
one rank the embedded default hung at its first step; with 5 it trained (2026-12-04, this 2-core machine).

Only where the run starts its own Ray cluster: joining one (``ray_kwargs.ray_init.address``, ``RAY_ADDRESS``),
the cluster's resources decide, and ``action=train`` checks what it can there (recipes/check/needs.py).
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

CPUS_PER_RANK = 3  # verl 0.9.1: ResourcePoolManager.max_colocate_count
CPUS_BESIDE = 2  # the TaskRunner's CPU, and one free to schedule the agent-loop and reward-loop workers


def cpus_needed(world: int) -> int:
    """The fewest CPUs a single-node Ray cluster needs for ``world`` ranks of verl's workers."""
    return CPUS_PER_RANK * world + CPUS_BESIDE


def resource_problems(cfg: DictConfig, world: int) -> list[str]:
    """One line per Ray resource the run declares for its own cluster that verl's workers cannot fit in."""
    if OmegaConf.select(cfg, "ray_kwargs.ray_init.address", default=None):
        return []
    nnodes = OmegaConf.select(cfg, "cluster.nnodes", default=1)
    if nnodes != 1:
        return []  # several nodes start no cluster here: recipes/check/needs.py refuses a GPU layout without one
    problems = []
    cpus = OmegaConf.select(cfg, "ray_kwargs.ray_init.num_cpus", default=None)
    if _number(cpus) and cpus < cpus_needed(world):
        problems.append(
            f"ray_kwargs.ray_init.num_cpus: {cpus} CPUs for the Ray cluster this run starts; verl's workers hold "
            f"{CPUS_PER_RANK} per rank x {world} rank{'s' * (world != 1)} + 1 (its TaskRunner) + 1 (to place the "
            f"agent-loop and reward workers) = {cpus_needed(world)}, and Ray would wait for them forever: "
            f"set it to {cpus_needed(world)} or more (null: every core of this machine)")
    gpus = OmegaConf.select(cfg, "ray_kwargs.ray_init.num_gpus", default=None)
    if _number(gpus) and gpus < world:
        problems.append(
            f"ray_kwargs.ray_init.num_gpus: {gpus} GPUs for the Ray cluster this run starts; verl places one worker "
            f"per rank on a GPU: cluster.nnodes(1) * cluster.gpus_per_node({world}) = {world}, and Ray would wait "
            "for them forever")
    return problems


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
