"""What a training run needs from the machine it starts on, checked in the driver before Ray starts.

- The packages of the engines it names: vLLM or SGLang for ``rollout=vllm|sglang``, megatron-core and mbridge for
  ``strategy=megatron``. ``action=validate`` and ``action=plan`` need none of them (a run is checked and planned for
  a cluster from any machine): there a missing one is a note; ``action=train`` stops on it.
- GPUs for a GPU layout: without a Ray cluster to join (``ray_kwargs.ray_init.address``, ``RAY_ADDRESS``, or one
  started here with ``ray start --head``), verl's workers would wait for GPUs this machine does not have, forever.

Each finding is one line naming the key and the install command or the arithmetic.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf


@dataclass(frozen=True)
class Need:
    key: str
    value: str
    modules: tuple[str, ...]
    what: str
    extra: str


NEEDS = (
    Need("actor_rollout_ref.rollout.name", "vllm", ("vllm",), "vLLM (vllm==0.24.0, as verl 0.9.1 pins it)", "vllm"),
    Need("actor_rollout_ref.rollout.name", "sglang", ("sglang",), "SGLang (sglang==0.5.12, as verl 0.9.1 pins it)",
         "sglang"),
    Need("strategy.name", "megatron", ("megatron.core", "mbridge"), "megatron-core and mbridge", "megatron"),
)


def importable(module: str) -> bool:
    """Whether ``module`` can be imported here, without importing it (a missing parent package counts as missing)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing_packages(cfg: DictConfig) -> list[str]:
    """One line per engine the config names whose package is not importable here."""
    lines = []
    for need in NEEDS:
        if str(OmegaConf.select(cfg, need.key, default="")) != need.value:
            continue
        absent = [module for module in need.modules if not importable(module)]
        if absent:
            lines.append(f"{need.key}={need.value}: training needs {need.what}; not importable here "
                         f"({', '.join(absent)}): pip install 'klppo-recipes[{need.extra}]' "
                         f"(in a checkout: pip install -e '.[{need.extra}]')")
    return lines


def cluster_to_join(cfg: DictConfig) -> str | None:
    """The Ray cluster verl's ``ray.init`` will join, if any: the config's address, RAY_ADDRESS, or a cluster started
    on this machine (``ray start --head`` writes its address where ``ray.init()`` looks for it)."""
    address = OmegaConf.select(cfg, "ray_kwargs.ray_init.address") or os.environ.get("RAY_ADDRESS")
    if address:
        return str(address)
    from ray._private.utils import read_ray_address  # lazy: Ray loads only for a GPU layout on too few GPUs

    return read_ray_address()


def gpu_shortfall(cfg: DictConfig, gpus_here: int) -> str | None:
    """One line when a GPU layout would wait for GPUs forever: more than this machine has, and no cluster to join."""
    if str(OmegaConf.select(cfg, "trainer.device", default="cuda")) == "cpu":
        return None
    nnodes = int(OmegaConf.select(cfg, "trainer.nnodes", default=1))
    per_node = int(OmegaConf.select(cfg, "trainer.n_gpus_per_node", default=1))
    if nnodes == 1 and per_node <= gpus_here:
        return None
    if cluster_to_join(cfg):
        return None  # the cluster's resources decide
    needed = f"trainer.nnodes({nnodes}) * trainer.n_gpus_per_node({per_node}) = {nnodes * per_node} GPUs"
    return (f"trainer.n_gpus_per_node: this run needs {needed}; this machine has {gpus_here} and no Ray cluster is "
            "named (ray_kwargs.ray_init.address, RAY_ADDRESS, or ray start --head here), so Ray would wait for them "
            "forever. Check it here with action=validate or action=plan; run it on the cluster with launcher=ray "
            "launcher.address=http://HEAD:8265" + ("; or leave out parallel=/cluster= for the embedded CPU default"
                                                   if gpus_here == 0 else ""))


def gpus_here() -> int:
    import torch  # lazy: only a training run asks

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def train_problems(cfg: DictConfig) -> list[str]:
    """Everything that stops ``action=train`` on this machine before Ray starts (launcher=local)."""
    problems = missing_packages(cfg)
    shortfall = gpu_shortfall(cfg, gpus_here())
    return problems + ([shortfall] if shortfall else [])
