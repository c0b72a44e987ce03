"""Compose a recipe's config the way `python -m recipes.<name>` does, and turn Hydra's errors into one line each."""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig, OmegaConf

from recipes.compose import hydra_cache
from recipes.compose.confdir import conf_dir, group_options, pack_groups, recipe_defaults
from recipes.compose.layout_keys import ROLE_STRATEGY_KEYS
from recipes.compose.overrides import CommandLine, Override
from recipes.compose.resolvers import register_resolvers
from recipes.errors import ConfigError

RECIPES = ("grpo", "kl_ppo")


def compose_recipe(recipe: str, overrides: list[str] | None = None) -> DictConfig:
    """The composed (unresolved) config of `recipe` with command-line style `overrides`; ConfigError if it fails.
    After the first, compositions in this process reuse the config files Hydra parsed
    (recipes/compose/hydra_cache.py)."""
    if recipe not in RECIPES:
        raise ConfigError(f"recipe: unknown recipe {recipe!r}; choose from {', '.join(RECIPES)}")
    register_resolvers()
    command, _ = adopt_verl_primary(CommandLine.parse(overrides or []))
    command, _ = adopt_engine_switch(command, recipe)
    refuse_mixed_engines(command, recipe)
    command, _ = adopt_batching(command)
    refuse_shared_parts(command)
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=None, job_name=recipe):
            return compose(config_name=recipe, overrides=list(command.args))
    except HydraException as error:
        raise ConfigError(explain_hydra_error(error, command, recipe)) from None
    finally:
        hydra_cache.install()  # not before the first: keeping the files costs a copy each, once


# verl 0.9.1's other primary configs of main_ppo, each its ppo_trainer with one switch
VERL_PRIMARY_CONFIGS = {"ppo_megatron_trainer": "model_engine=megatron", "ppo_trainer": None}


def adopt_verl_primary(argv: Sequence[str] | CommandLine) -> tuple[CommandLine, list[str]]:
    """verl's ``--config-name=ppo_megatron_trainer`` (``-cn``, with or without ``.yaml``), as some of its example
    scripts pass it, is verl's ppo_trainer with ``model_engine=megatron``: the recipes extend ppo_trainer, so the
    flag becomes that override (``ppo_trainer`` itself is dropped). Any other config name is left to Hydra."""
    command = CommandLine.parse(argv)
    items, notes, i = command.items, [], 0
    out: list[tuple[str, Override | None]] = []
    while i < len(items):
        flag, sep, value = items[i][0].partition("=")
        if flag in ("--config-name", "-cn"):
            if not sep and i + 1 < len(items):
                i, value = i + 1, items[i + 1][0]
            name = value.strip().removesuffix(".yaml")
            if name in VERL_PRIMARY_CONFIGS:
                switch = VERL_PRIMARY_CONFIGS[name]
                if switch:
                    out += CommandLine.parse([switch]).items
                    notes.append(f"note: --config-name={value} is verl's ppo_trainer with {switch}")
                i += 1
                continue
            out += CommandLine.parse([f"{flag}={value}"]).items
            i += 1
            continue
        out.append(items[i])
        i += 1
    return CommandLine(tuple(out)), notes


# verl 0.9.1's engine switch (its config group ``model_engine``) -> the pack's strategies that are that engine
ENGINE_STRATEGIES = {"dp": ("fsdp2", "fsdp"), "megatron": ("megatron",), "veomni": ("veomni",)}


def adopt_engine_switch(overrides: Sequence[str] | CommandLine, recipe: str) -> tuple[CommandLine, list[str]]:
    """verl's ``model_engine=<engine>`` (as its example scripts type it) becomes the pack's ``strategy=`` choice of
    that engine, so the pack's strategy keys match verl's engine configs. Returns the overrides without the switch
    and a note per adoption; ConfigError for an engine the pack has no strategy for, or a ``strategy=`` that
    disagrees. A sweep (``model_engine=dp,megatron``) maps each value."""
    command = CommandLine.parse(overrides)
    switches = [o for o in command.typed("model_engine") if not o.deletes]
    if not switches:
        return command, []
    rest = command.without(o.text for o in switches)
    typed = switches[-1].value.strip()
    engines = [e.strip() for e in typed.split(",")]
    for engine in engines:
        if engine not in ENGINE_STRATEGIES:
            raise ConfigError(f"model_engine={engine}: the pack trains with verl's engines "
                              f"{', '.join(ENGINE_STRATEGIES)} (strategy={'|'.join(group_options('strategy'))})")
    chosen = [o.value.strip() for o in rest.typed("strategy")]
    if chosen:
        if len(engines) > 1 or chosen[-1] not in ENGINE_STRATEGIES[engines[0]]:
            raise ConfigError(f"model_engine={typed} and strategy={chosen[-1]} disagree: verl's {typed} engine is "
                              f"strategy={'|'.join(s for e in engines for s in ENGINE_STRATEGIES[e])}")
        return rest, []
    default = recipe_defaults(recipe).get("strategy")
    picks = [default if default in ENGINE_STRATEGIES[e] else ENGINE_STRATEGIES[e][0] for e in engines]
    if picks == [default]:
        return rest, [f"note: model_engine={typed} (verl's engine switch) is the recipe's strategy={default}"]
    return rest.plus([f"strategy={','.join(picks)}"]), [f"note: model_engine={typed} (verl's engine switch) "
                                                         f"chooses strategy={','.join(picks)}"]


def _engine_of(strategy: str) -> str:
    """verl's engine of a strategy name (fsdp, fsdp2 and verl's fsdp_turbo are its dp engine)."""
    return next((e for e, names in ENGINE_STRATEGIES.items() if strategy in names),
                "dp" if strategy.startswith("fsdp") else strategy)


def refuse_mixed_engines(overrides: Sequence[str] | CommandLine, recipe: str) -> None:
    """ConfigError where a typed role strategy (verl's ``actor_rollout_ref.actor.strategy=``...) names another engine
    than the run's ``strategy=`` (typed, adopted from ``model_engine=``, or the recipe's default): the pack sets every
    role's engine from ``strategy=``, so the two would train a mixed config. Within one engine (fsdp beside fsdp2)
    the typed value stands, as in verl."""
    command = CommandLine.parse(overrides)
    chosen = [o.value.strip() for o in command.typed("strategy")]
    strategy = chosen[-1] if chosen else str(recipe_defaults(recipe).get("strategy") or "fsdp2")
    for override in command.overrides:
        key = override.key
        if key not in ROLE_STRATEGY_KEYS or override.deletes or "," in strategy:
            continue
        typed = override.value.strip()
        if _engine_of(typed) != _engine_of(strategy):
            source = "strategy=" + strategy if chosen else f"the recipe's strategy={strategy}"
            raise ConfigError(f"{key}={typed} and {source} disagree: the pack sets the actor's, reference's and "
                              f"critic's engine from strategy=; type strategy={typed} (or model_engine=) and leave "
                              f"{key} out")


MICRO_BATCH_KEYS = ("micro_batch_size_per_gpu", "micro_batch_size")


def adopt_batching(overrides: Sequence[str] | CommandLine) -> tuple[CommandLine, list[str]]:
    """A verl script's batching mode follows its own keys: micro-batch sizes typed without ``use_dynamic_bsz`` (or
    with every ``use_dynamic_bsz`` typed false) mean verl's fixed micro-batches, ``batching=fixed``, where the pack's
    default is token-balanced. A typed ``batching=`` decides alone. Returns the overrides and the note."""
    command = CommandLine.parse(overrides)
    keys = {o.key: o.value.strip().lower() for o in command.overrides if not o.deletes}
    if "batching" in keys:
        return command, []
    dynamic = [value for key, value in keys.items() if key and key.rsplit(".", 1)[-1].endswith("use_dynamic_bsz")]
    micro = [key for key, value in keys.items()
             if key and key.rsplit(".", 1)[-1].endswith(MICRO_BATCH_KEYS) and value not in ("null", "none", "")]
    if any(value in ("true", "1") for value in dynamic) or not (micro or dynamic):
        return command, []
    why = f"{micro[0]} typed without use_dynamic_bsz" if not dynamic else "use_dynamic_bsz typed false"
    return command.plus(["batching=fixed"]), [f"note: {why}: batching=fixed, verl's fixed micro-batches "
                                              "(batching=dynamic for the pack's token-balanced ones)"]


def refuse_shared_parts(overrides: Sequence[str] | CommandLine) -> None:
    """ConfigError for ``group=_part``: a group's files starting with ``_`` are shared parts of its options
    (cluster/_node.yaml), not options."""
    for override in CommandLine.parse(overrides).overrides:
        group, option = override.key, override.value.strip()
        if option.startswith("_") and group in pack_groups() and not override.deletes:
            raise ConfigError(f"{group}={option}: no such option; choose from {', '.join(group_options(group))}")


def explain_hydra_error(error: Exception, overrides: Sequence[str] | CommandLine, recipe: str = "grpo") -> str:
    """One line that names the key and what to do, for Hydra's composition errors."""
    command = CommandLine.parse(overrides)
    text = str(error)
    if isinstance(error, MissingConfigException):
        match = re.search(r"Could not find '([^/']+)/([^']+)'", text)
        if match:
            group, option = match.groups()
            if group in pack_groups():
                return f"{group}={option}: no such option; choose from {', '.join(group_options(group))}"
            return f"{group}={option}: no such option in verl's config group {group!r}"
        match = re.search(r"Could not load '([^']+)'", text)
        if match:
            return f"{match.group(1)}: no such config"
    if isinstance(error, OverrideParseException):
        return f"command line: cannot parse override: {text.splitlines()[0]}"
    match = re.search(r"^(\S+) appears more than once in the final defaults list", text)
    if match and match.group(1) in pack_groups():  # +parallel=tp2: the group has its option already
        group = match.group(1)
        typed = next((o.value for o in command.typed(group)), "OPTION")
        return f"+{group}={typed}: the recipe chooses a {group} option already; write {group}={typed}"
    match = re.search(r"Could not append to config\. An item is already at '([^']+)'", text)
    if match and "." in match.group(1):  # +key=value on a key the config has: Hydra (and verl) refuse the '+'
        key = match.group(1)
        typed = next((o.value for o in command.typed(key)), "VALUE")
        return (f"+{key}={typed}: the key is already in the config; '+' adds a new key only: write {key}={typed} "
                f"(or ++{key}={typed}, which sets it either way)")
    match = match or re.search(r"Could not override '([^']+)'", text)
    if match:
        key = match.group(1)
        if "." not in key and key in pack_groups():
            choices = group_options(key)
            return f"{key}: needs an option, e.g. {key}={choices[0]}; choose from {', '.join(choices)}"
        group = difflib.get_close_matches(key, pack_groups(), n=1, cutoff=0.75) if "." not in key else []
        if group:  # a misspelt group (parallell=tp2): the group, not advice to add a key
            typed = next((o.value for o in command.typed(key)), "")
            return (f"{key}={typed}: no such key or config group (did you mean {group[0]}={typed}? its options: "
                    f"{', '.join(group_options(group[0]))})")
        return f"{key}: no such key{_suggest(key, command, recipe)}; to add a new key write +{key}=VALUE"
    match = re.search(r"Key '([^']+)' is not in struct", text)
    if match:
        return f"{match.group(1)}: no such key{_suggest(match.group(1), command, recipe)}"
    first = next((line for line in text.splitlines() if line.strip()), text)
    return f"config: {first}"


def _suggest(key: str, command: CommandLine, recipe: str) -> str:
    """' (did you mean a.b.c?)' from the keys beside the misspelt one in the composed config, when one is close."""
    parent, _, leaf = key.rpartition(".")
    try:
        remaining = [arg for arg, override in command.items if override is None or override.key != key]
        recipe_cfg = _compose_quietly(recipe, remaining)
    except Exception:  # noqa: BLE001 - a suggestion is optional
        return ""
    node = OmegaConf.select(recipe_cfg, parent) if parent else recipe_cfg
    if not isinstance(node, DictConfig):
        return ""
    close = difflib.get_close_matches(leaf, [str(k) for k in node.keys()], n=1, cutoff=0.6)
    return f" (did you mean {parent + '.' if parent else ''}{close[0]}?)" if close else ""


def _compose_quietly(recipe: str, overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        return compose(config_name=recipe, overrides=overrides)
