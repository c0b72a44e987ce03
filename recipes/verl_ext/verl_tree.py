"""verl 0.9.1's own composition of a command line, and what the pack's run changes of it.

A verl script pasted into a recipe keeps every value it types (tests/recipes/test_verl_examples.py). The values it
leaves unset are verl's defaults in verl's run and the pack's in the recipe's: ``changed_defaults`` lists each verl
key whose value in the pack's resolved config differs from verl's own composition of the same verl keys
(``verl/trainer/config/ppo_trainer.yaml`` with ``model_engine=`` from the strategy), with the override that gives
verl's value back. The launcher prints that list once, on stderr, when the command line carries a verl script's keys.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cache

from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from recipes.check.fit import on_cpu
from recipes.compose.layout_keys import LAYOUT_FED_KEYS
from recipes.compose.overrides import override_key, override_value

# the sections of verl's tree a pasted script sets (the run-length keys under trainer. alone do not make a script)
SCRIPT_SECTIONS = ("actor_rollout_ref", "critic", "algorithm", "data", "reward", "reward_model",
                   "custom_reward_function")
# the pack's strategies that are verl's engine switch (recipes/compose/compose.py ENGINE_STRATEGIES, the other way)
STRATEGY_ENGINE = {"megatron": "megatron", "veomni": "veomni"}
# values verl's code takes where its config has no key, which the pack's config sets: key -> verl's value
# (verl/trainer/ppo/v1/replay_buffer.py: ReplayBuffer's poll_interval=2.0; the plugin reads the key, patches.py)
CODE_DEFAULTS = {"trainer.v1.sampler.sampler_kwargs.poll_interval": 2.0}


@contextmanager
def own_hydra():
    """Room for a composition where Hydra is initialized already (the launcher's, inside ``initialize_config_dir``):
    the caller's Hydra is put aside and back."""
    outer = GlobalHydra.instance()
    saved = outer.hydra if outer.is_initialized() else None
    outer.clear()
    try:
        yield
    finally:
        current = GlobalHydra.instance()  # Hydra's initialize_* contexts swap the singleton on exit
        current.clear()
        if saved is not None:
            current.initialize(saved)


@cache
def verl_top_keys() -> frozenset[str]:
    """The top-level keys of verl's bare trainer config."""
    return frozenset(compose_verl(()).keys())


def compose_verl(overrides: Sequence[str]) -> DictConfig:
    """verl's ``ppo_trainer`` composed with ``overrides``, as ``python -m verl.trainer.main_ppo`` would."""
    with own_hydra(), initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose(config_name="ppo_trainer", overrides=list(overrides))


def verl_overrides(overrides: Sequence[str]) -> list[str]:
    """The overrides verl's own command line would take: its keys (not the pack's keys for values verl's code fixes,
    :data:`CODE_DEFAULTS`), and ``strategy=megatron|veomni`` as its engine switch (the pack adopted ``model_engine=``
    into ``strategy=``)."""
    top = verl_top_keys()
    out = []
    for arg in overrides:
        key = override_key(arg)
        if key is None:
            continue
        if key == "strategy" and override_value(arg) in STRATEGY_ENGINE:
            out.append(f"model_engine={STRATEGY_ENGINE[override_value(arg)]}")
        elif key.split(".", 1)[0] in top and key not in CODE_DEFAULTS:  # verl's config has no key for those
            out.append(arg)
    return out


def is_verl_script(overrides: Sequence[str]) -> bool:
    """Whether the command line carries a verl script's keys (a key under one of :data:`SCRIPT_SECTIONS`)."""
    return any((override_key(arg) or "").split(".", 1)[0] in SCRIPT_SECTIONS for arg in overrides)


_ONE_INTERPOLATION = re.compile(r"\$\{[^${}]*\}")  # a value that is one interpolation, nothing else

def _leaves(node, prefix: str = "") -> Iterator[tuple[str, object]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, node


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b and type(a) is type(b) or (isinstance(a, int | float) and isinstance(b, int | float)
                                             and not isinstance(a, bool) and not isinstance(b, bool) and a == b)


def changed_defaults(resolved: DictConfig, overrides: Sequence[str],
                     unused: Sequence[str] = ()) -> list[tuple[str, object, object]]:
    """(key, the run's value, verl's value) for each verl key the command line does not set whose value in
    ``resolved`` (the config verl's trainer receives) differs from verl's own composition of its keys; keys verl
    interpolates from another key, and keys under an ``unused`` section (``critic`` where verl starts no critic),
    are left out. Where verl's config has no key for a value its code fixes (:data:`CODE_DEFAULTS`), that value is
    verl's."""
    verl_args = verl_overrides(overrides)
    typed = {override_key(arg) for arg in verl_args}
    ours = dict(_leaves(OmegaConf.to_container(resolved, resolve=True)))
    composed = compose_verl(verl_args)
    # a key verl interpolates from another (rollout.n -> actor.rollout_n) follows it: its source's line covers it
    follows = {key for key, raw in _leaves(OmegaConf.to_container(composed, resolve=False))
               if isinstance(raw, str) and _ONE_INTERPOLATION.fullmatch(raw)}
    theirs = dict(_leaves(OmegaConf.to_container(composed, resolve=True)))
    theirs.update({key: value for key, value in CODE_DEFAULTS.items() if key not in theirs})
    return [(key, ours[key], value) for key, value in theirs.items()
            if key in ours and key not in typed and key not in follows and key.split(".", 1)[0] not in unused
            and not _same(ours[key], value)]


_PLAIN = re.compile(r"[A-Za-z0-9_./~-]*")


def hydra_value(value) -> str:
    """``value`` as a command-line override writes it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if isinstance(value, str) and (not _PLAIN.fullmatch(text) or text in ("", "null", "true", "false")):
        return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return text


def restoring_override(key: str, verl_value) -> str:
    """The override that gives ``key`` verl's value: the pack's layout key or group where one decides it, else the
    key itself."""
    last = key.rsplit(".", 1)[-1]
    if key in LAYOUT_FED_KEYS:  # the layout feeds it (and its repeats): the layout key restores it
        return f"{LAYOUT_FED_KEYS[key]}={hydra_value(verl_value)}"
    if last == "strategy" and key.count(".") <= 2:
        return f"strategy={verl_value}"
    if last.endswith("use_dynamic_bsz") and verl_value is False:
        return "batching=fixed"
    return f"{key}={hydra_value(verl_value)}"


def changed_defaults_lines(resolved: DictConfig, overrides: Sequence[str], unused: Sequence[str] = ()) -> list[str]:
    """The note: a line per changed verl default (keys one group override restores share a line), with the override
    that restores verl's value; [] when none."""
    rows: dict[str, list] = {}
    for key, ours, theirs in changed_defaults(resolved, overrides, unused):
        restore = restoring_override(key, theirs)
        shared = not restore.startswith(f"{key}=")
        rows.setdefault(restore if shared else key, [[], ours, theirs, restore])[0].append(key)
    if not rows:
        return []
    count = sum(len(keys) for keys, *_ in rows.values())
    head = (f"note: {count} of verl's defaults differ in this run (keys the command line leaves unset; each "
            "override restores verl's value):")
    return [head, *(f"  {', '.join(keys)}: {hydra_value(ours)} (verl: {hydra_value(theirs)})  ->  {restore}"
                    for keys, ours, theirs, restore in rows.values())]


def fallback_lines(cfg: DictConfig) -> list[str]:
    """The note for a pasted script that will train on GPUs where flash-attn is not installed (as in this process):
    the plugin stands in for verl's flash-attn paths there (``run.flash_attn_fallbacks``); [] elsewhere."""
    # lazy: the plugin package installs itself into verl on import; by now verl's composition has loaded it anyway
    from recipes.verl_ext.plugin.patches import flash_attn_installed

    if on_cpu(cfg) or OmegaConf.select(cfg, "run.flash_attn_fallbacks") is False or flash_attn_installed():
        return []
    return ["note: flash-attn is not installed here: on the GPUs the plugin runs padding-free attention and chunked "
            "log-probs where verl's code needs flash-attn or loops over rows; run.flash_attn_fallbacks=false keeps "
            "verl's code"]
