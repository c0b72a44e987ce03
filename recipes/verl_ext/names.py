"""The names verl 0.9.1 looks up only once a run is going (in a worker, after Ray, the model load and the first
rollout), checked at validation against verl's own registries and the lists its code tests a name against.

Each :class:`Name` is one key: where verl keeps a registry (advantage estimators, policy losses, tracking backends)
the choices are read from it; where verl tests a name against a chain of ``if``s, the list below is that chain
(tests/recipes/verl_ext/test_names.py runs verl's own function on every listed name and on a wrong one, so the list
cannot drift). A key whose ``when`` does not hold (verl reads it only then), a key this config does not have, or one
inside a section verl does not build in this run, is not checked: what verl 0.9.1 accepts, the pack accepts.

Importing the registries imports verl (seconds): :func:`name_problems` runs in the validator's verl phase.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

from recipes.verl_ext.types import _at, _inside

# verl/trainer/ppo/core_algos.py kl_penalty_forward: the estimators it computes ("full" raises NotImplementedError);
# kl_penalty() takes each with a trailing "+" (the straight-through k2 gradient)
KL_ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
# verl/trainer/ppo/core_algos.py get_kl_controller
KL_CONTROLLERS = ("fixed", "adaptive")
# verl/utils/checkpoint/checkpoint_handler.py _determine_resume_path
RESUME_MODES = ("auto", "disable", "resume_path")
# verl/utils/checkpoint/checkpoint_manager.py should_save_* / should_load_*
CHECKPOINT_CONTENTS = ("model", "optimizer", "extra", "hf_model")
# verl/workers/config/optimizer.py FSDPOptimizerConfig.__post_init__ (an AssertionError with no text otherwise)
LR_SCHEDULERS = ("constant", "cosine")
# verl/utils/torch_functional.py postprocess_data
TRUNCATIONS = ("error", "left", "right", "middle")

_A, _C = "actor_rollout_ref.actor", "critic"
_FSDP_OPTIM = "verl.workers.config.FSDPOptimizerConfig"


def _kl_estimators() -> tuple[str, ...]:
    return KL_ESTIMATORS + tuple(name + "+" for name in KL_ESTIMATORS)


def _adv_estimators() -> tuple[str, ...]:
    from verl.trainer.ppo import core_algos  # lazy: verl imports in seconds; only the verl phase of validation asks

    return tuple(sorted(core_algos.ADV_ESTIMATOR_REGISTRY))


def _policy_losses() -> tuple[str, ...]:
    from verl.trainer.ppo import core_algos  # lazy: verl imports in seconds; only the verl phase of validation asks

    return tuple(sorted(core_algos.POLICY_LOSS_REGISTRY))


def _loggers() -> tuple[str, ...]:
    from verl.utils.tracking import Tracking  # lazy: verl imports in seconds; only the verl phase of validation asks

    return tuple(Tracking.supported_backend)


@dataclass(frozen=True)
class Name:
    """One key whose value verl looks up by name; ``items``: a list whose every item is such a name."""

    key: str
    what: str
    choices: Callable[[], tuple[str, ...]]
    when: tuple[str, object] | None = None
    items: bool = False
    target: str | None = None
    """checked only where the key's node is built as this class (``_target_``): the FSDP optimizer's list"""


def _fixed(names: tuple[str, ...]) -> Callable[[], tuple[str, ...]]:
    return lambda: names


NAMES: tuple[Name, ...] = (
    Name("algorithm.adv_estimator", "advantage estimators", _adv_estimators),
    Name("algorithm.kl_penalty", "KL estimators", _kl_estimators, when=("algorithm.use_kl_in_reward", True)),
    Name("algorithm.kl_ctrl.type", "KL controllers", _fixed(KL_CONTROLLERS), when=("algorithm.use_kl_in_reward", True)),
    Name(f"{_A}.kl_loss_type", "KL estimators", _kl_estimators, when=(f"{_A}.use_kl_loss", True)),
    Name(f"{_A}.policy_loss.loss_mode", "policy losses", _policy_losses),
    Name("trainer.resume_mode", "resume modes", _fixed(RESUME_MODES)),
    Name("trainer.logger", "tracking backends", _loggers, items=True),
    Name("data.truncation", "truncation modes", _fixed(TRUNCATIONS)),
    *(Name(f"{section}.checkpoint.{which}", "checkpoint contents", _fixed(CHECKPOINT_CONTENTS), items=True)
      for section in (_A, _C) for which in ("save_contents", "load_contents")),
    *(Name(f"{section}.optim.{key}", "learning-rate schedules", _fixed(LR_SCHEDULERS), target=_FSDP_OPTIM)
      for section in (_A, _C) for key in ("lr_scheduler_type", "warmup_style")),
)
"""The names verl 0.9.1 looks up at run time, one per key."""


def _suggest(value: str, choices: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(value, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _line(name: Name, value, choices: tuple[str, ...]) -> str:
    shown = ", ".join(choices)
    item = "each item " if name.items else ""
    hint = _suggest(value, choices) if isinstance(value, str) else ""
    return f"{name.key}: {item}must be one of verl 0.9.1's {name.what}: {shown}{hint}; got {value!r}"


def _node_target(container: dict, key: str) -> str:
    node = _at(container, key.rsplit(".", 1)[0], {})
    return str(node.get("_target_", "")) if isinstance(node, dict) else ""


def _values(name: Name, value) -> list:
    if not name.items:
        return [value]
    return list(value) if isinstance(value, (list, tuple)) else [value]


def name_problems(container: dict, inactive: frozenset[str] = frozenset()) -> dict[str, str]:
    """Full key -> problem line for every :data:`NAMES` entry whose value verl 0.9.1 would not find (imports verl)."""
    out = {}
    for name in NAMES:
        if _inside(name.key, inactive):
            continue
        if name.when is not None and _at(container, name.when[0]) != name.when[1]:
            continue
        if name.target is not None and _node_target(container, name.key) != name.target:
            continue
        value = _at(container, name.key)
        if value is None:
            continue  # unset: verl's default
        choices = name.choices()
        wrong = [v for v in _values(name, value) if v not in choices]
        if wrong:
            out[name.key] = _line(name, wrong[0] if name.items else value, choices)
    out.update(optimizer_problems(container, inactive))
    return out


def optimizer_problems(container: dict, inactive: frozenset[str] = frozenset()) -> dict[str, str]:
    """The FSDP optimizer class, as verl's ``build_optimizer`` finds it: ``getattr(import_module(optimizer_impl),
    optimizer)``. A package this machine lacks (torchao, bitsandbytes on a CPU box) is left to the cluster; a
    module of a package it has that does not import (``torch.optimz``) is a problem."""
    out = {}
    for section in (_A, _C):
        key = f"{section}.optim"
        node = _at(container, key)
        if _inside(key, inactive) or not isinstance(node, dict) or node.get("_target_") != _FSDP_OPTIM:
            continue
        module_name, cls = node.get("optimizer_impl"), node.get("optimizer")
        if not isinstance(module_name, str) or not isinstance(cls, str):
            continue
        if importlib.util.find_spec(module_name.split(".")[0]) is None:
            continue  # a package this machine lacks (torchao, bitsandbytes): the cluster's to have
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            out[f"{key}.optimizer_impl"] = f"{key}.optimizer_impl: cannot import {module_name!r} ({error})"
            continue
        if not hasattr(module, cls):
            classes = tuple(sorted(n for n in dir(module) if n[:1].isupper()))
            out[f"{key}.optimizer"] = (f"{key}.optimizer: {module_name} has no optimizer {cls!r}"
                                       f"{_suggest(cls, classes)} (verl 0.9.1 builds getattr({module_name}, "
                                       f"optimizer))")
    return out
