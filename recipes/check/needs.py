"""What a training run needs from the machine it starts on, checked in the driver before Ray starts.

- The packages of the engines it names: vLLM or SGLang for ``rollout=vllm|sglang``, megatron-core and mbridge for
  ``strategy=megatron``; SGLang also at a release verl 0.9.1 can drive (:data:`SGLANG_DRIVEN`). ``action=validate``
  and ``action=plan`` need none of them (a run is checked and planned for a cluster from any machine): there a
  missing one, or one at another release, is a note; ``action=train`` stops on it.
- GPUs for a GPU layout: without a Ray cluster to join (``ray_kwargs.ray_init.address``, ``RAY_ADDRESS``, or one
  started here with ``ray start --head``), verl's workers would wait for GPUs this machine does not have, forever.
- The data and the checkpoint folder: ``data.train_files`` and ``data.val_files`` as local files (a remote URL,
  ``hdfs://`` or ``s3://``, is the cluster's), ``trainer.default_local_dir`` a folder this user can create and write.
  verl reads the first at the start of its trainer and writes the second at the first save, ``save_freq`` steps in.
- The model and the reward function: ``actor_rollout_ref.model.path`` (and ``critic.model.path`` where a critic
  trains) a folder here unless it is a hub id (``owner/name``: verl downloads it) or a URL; the custom reward
  function's file (``file://`` or a plain path; ``pkg://`` is checked as a module by recipes/check/lookups.py). At
  validate and plan a path not here is a note (it may be the cluster's); ``action=train`` here stops on it.

Each finding is one line naming the key and the install command or the arithmetic.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from hybrid_engine.model_spec import looks_like_hub_id
from recipes.check.lookups import PKG_PREFIX, module_file, reward_function

# SGLang for verl 0.9.1. verl's own `verl[sglang]` pins sglang==0.5.12, which pins transformers==5.6.0: the one
# release verl 0.9.1 excludes (transformers>=5.5.3,<5.11,!=5.6.0), so that extra does not resolve
# (scripts/gpu/results/2026-12-03-sglang/). SGLang runs inside verl's rollout workers, in the process that imports
# verl's transformers, so a release verl 0.9.1 can drive is one whose transformers pin verl accepts. verl 0.9.1's
# rollout code (verl/workers/rollout/sglang_rollout/) starts >=0.5.10 through Engine._launch_subprocesses and knows
# the 0.5.12 FA3 default and the 0.5.16 move of LocalSerializedTensor: its code spans these releases; the pins decide.
SGLANG_TRANSFORMERS = {
    "0.5.12": "5.6.0",  # uv's resolution of verl[sglang]==0.9.1 (scripts/gpu/results/2026-12-03-sglang/README.md)
    "0.5.12.post1": "5.6.0",  # NVIDIA-NeMo/RL#3344's table of what moves from 0.5.12.post1 to 0.5.13.post1
    "0.5.13": "5.8.1",  # its wheel's METADATA (read 2026-12-07; sgl-project/sglang#25451 moved 5.6.0 -> 5.8.1)
    "0.5.13.post1": "5.8.1",  # its wheel's METADATA (read 2026-12-07; also NVIDIA-NeMo/RL#3344)
    "0.5.14": "5.8.1",  # its wheel's METADATA (read 2026-12-07; sglang#29393's move to 5.12.1 came after it)
    "0.5.15": "5.12.1",  # sglang#29393, merged before 0.5.15 (2026-07-10)
    "0.5.23": "5.19.0",  # PyPI's JSON for sglang (its newest release, 2026-10-30)
}
"""The ``transformers==`` pin of each SGLang release read so far, with where it was read (the wheels of 0.5.13,
0.5.13.post1 and 0.5.14 were downloaded and read by scripts/gpu/pack_sglang.sh's work, docs/staging.md;
tests/recipes/test_sglang_extra.py holds the releases below against verl's installed requirements)."""
SGLANG_DRIVEN = ">=0.5.13,<0.5.15"
"""The SGLang releases verl 0.9.1 can drive: those whose transformers pin verl 0.9.1's requirement accepts."""
SGLANG_PIN = "0.5.13.post1"
"""The release the pack's ``[sglang]`` extra pins (pyproject.toml), with transformers==5.8.1 beside it."""


@dataclass(frozen=True)
class Need:
    key: str
    value: str
    modules: tuple[str, ...]
    what: str
    extra: str
    package: str = ""
    """the distribution whose installed version is checked against ``versions`` (empty: none is)"""
    versions: str = ""
    """the releases verl 0.9.1 drives, a PEP 440 specifier"""
    why: str = ""
    """why a release outside ``versions`` cannot be driven"""


NEEDS = (
    Need("actor_rollout_ref.rollout.name", "vllm", ("vllm",), "vLLM (vllm==0.24.0, as verl 0.9.1 pins it)", "vllm"),
    Need("actor_rollout_ref.rollout.name", "sglang", ("sglang",),
         f"SGLang (sglang=={SGLANG_PIN}, the extra's pin; verl 0.9.1 drives sglang{SGLANG_DRIVEN})", "sglang",
         package="sglang", versions=SGLANG_DRIVEN, why="verl 0.9.1 takes transformers>=5.5.3,<5.11,!=5.6.0"),
    Need("strategy.name", "megatron", ("megatron.core", "mbridge"), "megatron-core and mbridge", "megatron"),
)


def importable(module: str) -> bool:
    """Whether ``module`` can be imported here, without importing it (a missing parent package counts as missing)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def installed_version(package: str) -> str | None:
    """The version of the installed distribution ``package`` (its metadata; nothing is imported), or None."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def wrong_release(need: Need) -> str | None:
    """The installed release of ``need.package`` when it is outside ``need.versions``; None when it is inside, or
    when no version can be read (a source checkout without metadata: not refused on a guess)."""
    if not need.package or not need.versions:
        return None
    found = installed_version(need.package)
    if found is None:
        return None
    try:
        inside = SpecifierSet(need.versions).contains(Version(found), prereleases=True)
    except InvalidVersion:
        inside = False
    return None if inside else found


def missing_packages(cfg: DictConfig) -> list[str]:
    """One line per engine the config names whose package is not importable here, or is installed at a release
    verl 0.9.1 cannot drive."""
    lines = []
    for need in NEEDS:
        if str(OmegaConf.select(cfg, need.key, default="")) != need.value:
            continue
        install = f"pip install 'klppo-recipes[{need.extra}]' (in a checkout: pip install -e '.[{need.extra}]')"
        absent = [module for module in need.modules if not importable(module)]
        if absent:
            lines.append(f"{need.key}={need.value}: training needs {need.what}; not importable here "
                         f"({', '.join(absent)}): {install}")
            continue
        found = wrong_release(need)
        if found:
            pinned = SGLANG_TRANSFORMERS.get(found) if need.package == "sglang" else None
            reason = f"{found} pins transformers=={pinned}; " if pinned else ""
            lines.append(f"{need.key}={need.value}: {need.package} {found} is installed here; verl 0.9.1 drives "
                         f"{need.package}{need.versions} ({reason}{need.why}): {install}")
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


def _uses_critic(cfg: DictConfig) -> bool:
    """verl 0.9.1's rule: ``critic.enable`` where set, else a critic for GAE."""
    enable = OmegaConf.select(cfg, "critic.enable", default=None)
    return bool(enable) if enable is not None else OmegaConf.select(cfg, "algorithm.adv_estimator") == "gae"


def missing_models(cfg: DictConfig) -> list[str]:
    """One line per model folder the run loads that is not a folder here; a hub id (``owner/name``, downloaded by
    verl at the start) and a URL are not checked."""
    keys = ["actor_rollout_ref.model.path"] + (["critic.model.path"] if _uses_critic(cfg) else [])
    lines, seen = [], set()
    for key in keys:
        value = OmegaConf.select(cfg, key, default=None)
        if value is None or "://" in str(value) or looks_like_hub_id(str(value)) or str(value) in seen:
            continue  # the critic on the actor's folder (KL-PPO's default): one line, the actor's
        seen.add(str(value))
        if not Path(str(value)).expanduser().is_dir():
            lines.append(f"{key}: {value} is not a folder on this machine (verl loads the model's config, tokenizer "
                         "and weights from it when its workers start); name the folder, or a hub id owner/name")
    return lines


def missing_reward_file(cfg: DictConfig) -> str | None:
    """One line when the custom reward function's file is not a file here (verl imports it in the trainer); the
    section verl loads and the file found as recipes/check/lookups.py reads them, ``pkg://`` left to its module
    check."""
    def plain(key: str):
        node = OmegaConf.select(cfg, key, default=None)
        return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else None

    section, node = reward_function({"custom_reward_function": plain("custom_reward_function"),
                                     "reward": {"custom_reward_function": plain("reward.custom_reward_function")}})
    value = node.get("path")
    if not value or str(value).startswith(PKG_PREFIX) or module_file(str(value))[0] is not None:
        return None
    return (f"{section}.path: {value} is not a file on this machine (verl imports the reward function from it when "
            "the trainer starts)")


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
    problems = missing_packages(cfg) + missing_models(cfg) + missing_data(cfg)
    reward, unwritable = missing_reward_file(cfg), unwritable_checkpoint_dir(cfg)
    shortfall = gpu_shortfall(cfg, gpus_here())
    return problems + [line for line in (reward, unwritable, shortfall) if line]


def machine_notes(cfg: DictConfig) -> list[str]:
    """What ``action=validate`` and ``action=plan`` say of this machine (a run may be checked here for a cluster):
    one line for what is absent here and always is on a laptop (the engine packages, the data files), then a release
    verl cannot drive and a checkpoint folder that cannot be made, each a line of its own."""
    absent = [need for need in NEEDS if str(OmegaConf.select(cfg, need.key, default="")) == need.value
              and not all(importable(module) for module in need.modules)]
    files = [(key, path) for key in ("data.train_files", "data.val_files")
             for path in local_files(OmegaConf.select(cfg, key)) if not Path(path).expanduser().is_file()]
    parts = []
    if absent:
        extras = ",".join(need.extra for need in absent)
        parts.append(", ".join(need.what for need in absent) + f": pip install 'klppo-recipes[{extras}]' (in a "
                     f"checkout: pip install -e '.[{extras}]')")
    if files:
        parts.append("data files " + ", ".join(f"{path} ({key})" for key, path in files))
    lines = [f"not on this machine, which training here would need (validate and plan do not): {'; '.join(parts)}"
             ] if parts else []
    wrong = [line for line in missing_packages(cfg) if " is installed here; " in line]
    unwritable = unwritable_checkpoint_dir(cfg)
    return lines + wrong + ([unwritable] if unwritable else [])


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
            try:
                names = pq.read_schema(path).names
            except Exception:  # noqa: BLE001 - empty or not parquet: recipes.check.lookups reports it, in one line
                continue
            if column not in names:
                lines.append(f"{key}: {column!r} is not a column of {files_key} {path} (its columns: "
                             f"{', '.join(names)})")
                break
    return lines
