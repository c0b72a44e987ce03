"""What a training run needs from the machine it starts on, checked in the driver before Ray starts.

- The packages of the engines it names: vLLM or SGLang for ``rollout=vllm|sglang``, megatron-core and mbridge for
  ``strategy=megatron``. ``action=validate`` and ``action=plan`` need none of them (a run is checked and planned for
  a cluster from any machine): there a missing one is a note; ``action=train`` stops on it.
- GPUs for a GPU layout: without a Ray cluster to join (``ray_kwargs.ray_init.address``, ``RAY_ADDRESS``, or one
  started here with ``ray start --head``), verl's workers would wait for GPUs this machine does not have, forever.
- The data and the checkpoint folder: ``data.train_files`` and ``data.val_files`` as local files (a remote URL,
  ``hdfs://`` or ``s3://``, is the cluster's), ``trainer.default_local_dir`` a folder this user can create and write.
  verl reads the first at the start of its trainer and writes the second at the first save, ``save_freq`` steps in.

Each finding is one line naming the key and the install command or the arithmetic.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

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


def local_files(value) -> list[str]:
    """The local paths of a ``data.*_files`` value (one path or a list); URLs (``scheme://``) are left out."""
    paths = list(value) if isinstance(value, (list, tuple)) or OmegaConf.is_list(value) else [value]
    return [str(p) for p in paths if p is not None and "://" not in str(p)]


def missing_data(cfg: DictConfig) -> list[str]:
    """One line per local data file that is not a file here."""
    lines = []
    for key in ("data.train_files", "data.val_files"):
        for path in local_files(OmegaConf.select(cfg, key)):
            if not Path(path).expanduser().is_file():
                lines.append(f"{key}: {path} is not a file on this machine (verl's RLHFDataset reads it when the "
                             "trainer starts); make it with the task's preprocessing script, or name another")
    return lines


def unwritable_checkpoint_dir(cfg: DictConfig) -> str | None:
    """One line when ``trainer.default_local_dir`` cannot be created or written by this user."""
    value = OmegaConf.select(cfg, "trainer.default_local_dir")
    if value is None or "://" in str(value):
        return None
    path = Path(str(value)).expanduser().absolute()
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is None:
        return None
    if not existing.is_dir():
        return (f"trainer.default_local_dir: {path} cannot be made: {existing} is a file (verl writes its "
                "checkpoints there)")
    if not os.access(existing, os.W_OK | os.X_OK):
        return (f"trainer.default_local_dir: {path} cannot be {'written' if existing == path else 'made'}: this "
                f"user may not write {existing} (verl writes its checkpoints there at the first save)")
    return None


NO_TE_NOTE = (
    "TransformerEngine not installed: strategy=megatron runs with Megatron's local layer spec "
    "(mbridge, padded batches, unfused softmax)"
)


def engine_notes(cfg: DictConfig) -> list[str]:
    """What a valid run is told of its engine here: strategy=megatron with megatron-core and mbridge importable and
    TransformerEngine not (the pack's no-TE path, recipes/verl_ext/plugin/patches.py, runs it)."""
    megatron = str(OmegaConf.select(cfg, "strategy.name", default="")) == "megatron"
    if megatron and importable("megatron.core") and importable("mbridge") and not importable("transformer_engine"):
        return [NO_TE_NOTE]
    return []


def train_problems(cfg: DictConfig) -> list[str]:
    """Everything that stops ``action=train`` on this machine before Ray starts (launcher=local)."""
    problems = missing_packages(cfg) + missing_data(cfg)
    unwritable = unwritable_checkpoint_dir(cfg)
    shortfall = gpu_shortfall(cfg, gpus_here())
    return problems + [line for line in (unwritable, shortfall) if line]


def machine_notes(cfg: DictConfig) -> list[str]:
    """What ``action=validate`` and ``action=plan`` say of this machine (a run may be checked here for a cluster):
    the engine packages, the data files and the checkpoint folder that training here would stop on."""
    unwritable = unwritable_checkpoint_dir(cfg)
    return missing_packages(cfg) + missing_data(cfg) + ([unwritable] if unwritable else [])


# the columns verl 0.9.1 reads by a key's name (RLHFDataset: the prompt; the reward loop: the data source)
COLUMN_KEYS = (("data.prompt_key", "prompt"), ("data.reward_fn_key", "data_source"))


def column_problems(cfg: DictConfig) -> list[str]:
    """One line per column key that names no column of a local parquet file (its schema only is read)."""
    import pyarrow.parquet as pq  # lazy: only where a local parquet file is named

    lines = []
    for key, default in COLUMN_KEYS:
        column = str(OmegaConf.select(cfg, key, default=default))
        for files_key in ("data.train_files", "data.val_files"):
            paths = [p for p in local_files(OmegaConf.select(cfg, files_key)) if p.endswith(".parquet")]
            path = next((Path(p).expanduser() for p in paths if Path(p).expanduser().is_file()), None)
            if path is None:
                continue
            names = pq.read_schema(path).names
            if column not in names:
                lines.append(f"{key}: {column!r} is not a column of {files_key} {path} (its columns: "
                             f"{', '.join(names)})")
                break
    return lines
