"""The verl overrides that run ``python -m verl.trainer.main_ppo`` on the CPU with the tiny assets.

They are not written here: they are read from the recipes' embedded CPU default, the one place that holds them.
The recipe (``conf/grpo.yaml``) is composed with the embedded default's options (``parallel=cpu``, ``cluster=cpu``,
``rollout=hf``, ``model=tiny``, ``task=tiny``, see :mod:`recipes.compose.defaults`) and its default ``strategy`` (fsdp2:
verl would otherwise take FSDP1, which refuses modules on the CPU). The keys are every verl key that those options'
files set (with the files they include, e.g. ``cluster/_node.yaml``), plus the verl keys the recipes route from those
files' keys (``trainer.n_gpus_per_node: ${cluster.gpus_per_node}``,
``actor_rollout_ref.rollout.tensor_model_parallel_size: ${layout.infer.tp}``, ``critic.model.path:
${actor_rollout_ref.model.path}``); each takes its value in the recipe's resolved config. Keys whose value is verl's own
default already are left out (they would change nothing); a leading ``+`` marks a key that verl 0.9.1's tree
(``verl/trainer/config/ppo_trainer.yaml``) does not declare, so Hydra must add it. The tiny assets' paths stay
placeholders, ``{model_dir}``, ``{train_parquet}``, ``{val_parquet}``, ``{reward_py}``, filled from
:class:`recipes.verl_ext.demo.TinyAssets` by :func:`cli_overrides`. The reason for each key is the comment beside it in
its conf file (:data:`ORIGINS` names the file).

:data:`CPU_VERL_OVERRIDES` (all keys, in order, with the demo run's own settings last), :data:`GROUPS` (the same,
per conf option), :data:`ORIGINS` and :func:`world_size` are computed on first use (two Hydra compositions, a few
seconds). :data:`GRPO_DEMO` and :data:`KL_PPO_DEMO` are the deltas of the two demo runs, and the demo's own settings
(:data:`DEMO_RUN`: steps, logging, no checkpoints, the prompt order) are the only values kept here.

Checked end to end by ``tests/e2e/test_verl_cpu.py`` (KL-PPO with a critic at world size 2), and against both
recipes' resolved configs by ``tests/recipes/test_cpu_overrides_agree.py``.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from recipes.compose.compose import compose_recipe
from recipes.compose.confdir import conf_dir, config_defaults, included_files, recipe_defaults
from recipes.compose.defaults import EMBEDDED_DEFAULTS, embedded_defaults
from recipes.verl_ext.verl_tree import own_hydra

__all__ = [
    "CPU_VERL_OVERRIDES",
    "DEMO_RUN",
    "GROUPS",
    "GRPO_DEMO",
    "KL_PPO_DEMO",
    "ORIGINS",
    "cli_overrides",
    "world_size",
]

# computed on first use by the module's __getattr__ (importing this module composes nothing)
CPU_VERL_OVERRIDES: dict[str, Any]
"""Every derived key, then :data:`DEMO_RUN`, in order: what ``main_ppo`` needs on the CPU with the tiny assets."""
GROUPS: dict[str, dict[str, Any]]
"""The same keys per conf option they come from (``"cluster=cpu"``, ``"task=tiny"``, ...), and ``"demo run"``."""
ORIGINS: dict[str, Path]
"""bare key -> the conf file that sets it (the option's file, or ``conf/_base.yaml`` for a routed key)."""

# the recipe composed for the values; the groups' values win over the primary's, so either recipe gives the same
_RECIPE = "grpo"
# the recipe's default strategy is part of the CPU setup (FSDP2 runs over gloo; verl's default FSDP1 does not)
_ALSO_FROM = ("strategy",)
# ${pack.asset:KEY} -> the field of TinyAssets it names (as recipes.compose.resolvers does); the list holds "{field}"
# and cli_overrides fills it from the assets it is given
_ASSET_FIELDS = {"model": "model_dir", "train": "train_parquet", "val": "val_parquet", "reward": "reward_py"}
_ASSET = re.compile(r"^\$\{pack\.asset:(\w+)\}$")
_ROUTE = re.compile(r"^\$\{([A-Za-z_][\w]*(?:\.[\w]+)*)\}$")

DEMO_RUN: dict[str, Any] = {
    # the demo's length, logging and bookkeeping (the recipes' task/tiny trains 20 steps and checkpoints at the end)
    "trainer.total_training_steps": 20,
    "trainer.total_epochs": 1,
    "trainer.logger": ["console", "file"],
    "trainer.val_before_train": False,
    "trainer.test_freq": -1,
    "trainer.save_freq": -1,
    "trainer.resume_mode": "disable",
    "trainer.project_name": "klppo_cpu",
    "trainer.experiment_name": "tiny",
    # the plain verl demo's fixed prompt order (its measured figures use it; the recipes' task/tiny uses seed 1)
    "data.seed": 0,
}

GRPO_DEMO: dict[str, Any] = {
    "algorithm.adv_estimator": "grpo",
    # GRPO's baseline is the group mean: no critic (said explicitly, verl warns when it has to infer it).
    "critic.enable": False,
    # GRPO's group: 4 samples per prompt (the task's 10 prompts: 40 sequences a step; log-prob passes in 10s, which
    # divide each rank's share on one or two ranks, as verl's fixed micro-batches must).
    "actor_rollout_ref.rollout.n": 4,
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 10,
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 10,
    "actor_rollout_ref.actor.use_kl_loss": False,
    "algorithm.use_kl_in_reward": False,
}

KL_PPO_DEMO: dict[str, Any] = {
    "algorithm.adv_estimator": "gae",
    # PPO's baseline is a learned value model (the critic, a fourth FSDP model on the same ranks).
    "critic.enable": True,
    "actor_rollout_ref.rollout.n": 1,
    # KL to the reference policy both as a reward penalty and as a loss term (the reference is a third model).
    "algorithm.use_kl_in_reward": True,
    "algorithm.kl_ctrl.kl_coef": 0.01,
    "actor_rollout_ref.actor.use_kl_loss": True,
    "actor_rollout_ref.actor.kl_loss_coef": 0.01,
    # 20 prompts a step, one mini-batch; with the task's micro-batches of 10 and log-prob passes in 10s (verl's fixed
    # micro-batches must divide each rank's share: 20 on one rank, 10 on two)
    "data.train_batch_size": 20,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 20,
    "critic.ppo_mini_batch_size": 20,
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 10,
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 10,
}


# ---- reading the conf files ---------------------------------------------------------------------------------------


@cache
def _verl_tree():
    """verl's own trainer config, composed bare (what ``main_ppo`` starts from)."""
    with own_hydra(), initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose(config_name="ppo_trainer")


def _sources() -> list[tuple[str, Path]]:
    """(``group=option``, file) of the options the CPU values come from, in the recipes' defaults order."""
    chosen = recipe_defaults(_RECIPE)
    wanted = {group: chosen[group] for group in _ALSO_FROM} | EMBEDDED_DEFAULTS
    order = list(chosen)
    return [
        (f"{group}={wanted[group]}", conf_dir() / group / f"{wanted[group]}.yaml")
        for group in sorted(wanted, key=order.index)
    ]


def _file_values(path: Path) -> list[tuple[dict, Path]]:
    """The values of one option file and of the files of its group it includes, in merge order."""
    entries = config_defaults(path)
    if "_self_" not in entries:
        entries.append("_self_")
    parts: list[tuple[dict, Path]] = []
    for entry in entries:
        if entry == "_self_":
            own = OmegaConf.to_container(OmegaConf.load(path)) or {}
            own.pop("defaults", None)
            parts.append((own, path))
        elif isinstance(entry, str) and (path.parent / f"{entry}.yaml").is_file():
            parts.extend(_file_values(path.parent / f"{entry}.yaml"))
        elif isinstance(entry, dict) and (shared := _shared_file(entry)) is not None:
            parts.extend(_file_values(shared))
    return parts


_SHARED = re.compile(r"^(?:optional )?/(_\w+)@_global_$")
_CHOICE = re.compile(r"\$\{(\w+)\}")


def _shared_file(entry: dict) -> Path | None:
    """The file of a shared folder an option includes by a group's choice (strategy/fsdp2.yaml's
    ``optional /_schedule@_global_: fsdp_${model}``), with the embedded default's choices; None where there is none."""
    ((key, value),) = entry.items()
    match = _SHARED.match(str(key))
    if not match or value is None:
        return None
    name = _CHOICE.sub(lambda m: EMBEDDED_DEFAULTS.get(m.group(1), m.group(0)), str(value))
    path = conf_dir() / match.group(1) / f"{name}.yaml"
    return path if path.is_file() else None


def _leaves(values: dict, prefix: str = ""):
    for key, value in values.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield from _leaves(value, f"{dotted}.")
        else:
            yield dotted


def _verl_keys(values: dict, tree: dict, prefix: str = ""):
    """(dotted key, declared by verl) of every verl key in `values`: down to the leaves where verl declares the path,
    the whole subtree as one key where it does not (``+...mixed_precision={...}``)."""
    for key, value in values.items():
        dotted = f"{prefix}{key}"
        if key not in tree:
            yield dotted, False
        elif isinstance(value, dict) and value and isinstance(tree[key], dict):
            yield from _verl_keys(value, tree[key], f"{dotted}.")
        else:
            yield dotted, True


def _same(a, b) -> bool:
    return type(a) is type(b) and a == b


@cache
def _recipe_values(extra: tuple[str, ...]):
    """The recipe composed with the embedded CPU default (and `extra`), the tiny assets' paths as placeholders."""
    with own_hydra():
        composed = compose_recipe(_RECIPE, embedded_defaults([], accelerator=False) + list(extra))
    raw = OmegaConf.to_container(composed)

    def placeholders(node):
        if isinstance(node, dict):
            return {key: placeholders(value) for key, value in node.items()}
        if isinstance(node, list):
            return [placeholders(value) for value in node]
        match = _ASSET.match(node) if isinstance(node, str) else None
        return f"{{{_ASSET_FIELDS[match.group(1)]}}}" if match else node

    return raw, OmegaConf.create(placeholders(raw))


def _value(cfg, key: str):
    node = OmegaConf.select(cfg, key)
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


@cache
def _derived() -> tuple[dict[str, dict[str, str]], dict[str, bool], dict[str, Path]]:
    """label -> {bare key: spelled key}, bare key -> declared by verl, bare key -> the conf file that sets it."""
    tree = OmegaConf.to_container(_verl_tree())
    keys: dict[str, tuple[str, bool]] = {}  # bare key -> (label, declared); a later option's key wins
    origins: dict[str, Path] = {}
    set_by: dict[str, tuple[str, Path]] = {}  # every leaf the options set, verl's or the pack's -> (label, file)
    for label, path in _sources():
        for values, source in _file_values(path):
            for leaf in _leaves(values):
                set_by[leaf] = (label, source)
            for key, declared in _verl_keys({k: v for k, v in values.items() if k in tree}, tree):
                keys.pop(key, None)
                keys[key] = (label, declared)
                origins[key] = source
    # the verl keys the recipes set to one of those keys (trainer.n_gpus_per_node: ${cluster.gpus_per_node}),
    # read unresolved from the composed recipe
    raw, _ = _recipe_values(())
    verl_part = {k: v for k, v in raw.items() if k in tree}
    for leaf in _leaves(verl_part):
        text = _raw_leaf(verl_part, leaf)
        match = _ROUTE.match(text) if isinstance(text, str) else None
        if match and match.group(1) in set_by and leaf not in keys:
            label, _ = set_by[match.group(1)]
            keys[leaf] = (label, _declared(tree, leaf))
            origins[leaf] = _routing_file(leaf, text)
    groups: dict[str, dict[str, str]] = {label: {} for label, _ in _sources()}
    for key, (label, declared) in keys.items():
        groups[label][key] = key if declared else f"+{key}"
    return groups, {key: declared for key, (_, declared) in keys.items()}, origins


def _raw_leaf(tree: dict, dotted: str):
    node: Any = tree
    for part in dotted.split("."):
        node = node[part]
    return node


def _declared(tree: dict, dotted: str) -> bool:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _routing_file(key: str, text: str) -> Path:
    """The recipe's own file that writes `key: text`: the primary config or one it includes (conf/_base.yaml)."""
    primary = conf_dir() / f"{_RECIPE}.yaml"
    for path in [primary, *included_files(primary)]:
        loaded = OmegaConf.to_container(OmegaConf.load(path)) or {}
        try:
            if _raw_leaf(loaded, key) == text:
                return path
        except (KeyError, TypeError):
            continue
    return primary


@cache
def _resolved(extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """bare key -> value in the recipe's resolved config, for every derived key."""
    groups, _, _ = _derived()
    _, cfg = _recipe_values(extra)
    return {key: _value(cfg, key) for group in groups.values() for key in group}


@cache
def _groups() -> dict[str, dict[str, Any]]:
    groups, declared, _ = _derived()
    values = _resolved()
    defaults = _verl_tree()
    out: dict[str, dict[str, Any]] = {}
    for label, keys in groups.items():
        out[label] = {}
        for key, spelled in keys.items():
            if declared[key]:
                try:
                    if _same(_value(defaults, key), values[key]):
                        continue  # verl's default already
                except Exception:  # noqa: BLE001 - a default that does not resolve bare is not the same value
                    pass
            out[label][spelled] = values[key]
    out["demo run"] = dict(DEMO_RUN)
    return out


def world_size(n: int) -> dict[str, Any]:
    """The keys that set the number of actor processes (FSDP2 ranks over gloo): the derived keys whose value in the
    recipe changes with ``cluster.gpus_per_node=n`` (the ranks, Ray's logical GPUs, one hf server for all of them,
    fed by rank 0, as the recipes' ``parallel=cpu`` does)."""
    groups, _, _ = _derived()
    base, scaled = _resolved(), _resolved((f"cluster.gpus_per_node={int(n)}",))
    spelled = {key: name for group in groups.values() for key, name in group.items()}
    return {spelled[key]: value for key, value in scaled.items() if not _same(value, base[key])}


def __getattr__(name: str):
    if name == "GROUPS":
        return {label: dict(group) for label, group in _groups().items()}
    if name == "CPU_VERL_OVERRIDES":
        return {key: value for group in _groups().values() for key, value in group.items()}
    if name == "ORIGINS":
        return dict(_derived()[2])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---- the command line ---------------------------------------------------------------------------------------------


def _format(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_format(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{key}:{_format(item)}" for key, item in value.items()) + "}"
    return str(value)


def cli_overrides(assets, *deltas: dict[str, Any]) -> list[str]:
    """``key=value`` arguments for ``python -m verl.trainer.main_ppo``: CPU_VERL_OVERRIDES, then each delta in turn
    (a delta's ``key`` replaces a ``+key`` of the list, keeping the ``+``).

    ``assets`` is a :class:`recipes.verl_ext.demo.TinyAssets`; its paths fill the ``{...}`` placeholders.
    """
    fields = {f"{{{field}}}": getattr(assets, field) for field in _ASSET_FIELDS.values()}
    merged: dict[str, tuple[str, Any]] = {}  # bare key -> (spelled key, value)
    for delta in (__getattr__("CPU_VERL_OVERRIDES"), *deltas):
        for key, value in delta.items():
            bare = key.lstrip("+")
            spelled = merged[bare][0] if bare in merged and merged[bare][0].startswith("+") else key
            merged[bare] = (spelled, value)
    args = []
    for spelled, value in merged.values():
        text = _format(value)
        for placeholder, path in fields.items():
            text = text.replace(placeholder, str(path))
        args.append(f"{spelled}={text}")
    return args
