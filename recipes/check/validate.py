"""Validation in the driver, before Ray starts: the pack's checks first, then verl's own validator.

Every problem names its full key and shows the arithmetic; all problems are collected and raised together as one
ConfigError (the entry point prints them and exits 2).
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from hybrid_engine.layout import FSDP_ORDER, InferLayout, TrainLayout, collect_layout_errors
from hybrid_engine.model_spec import (
    MODEL_CONFIG_DIR,
    ModelArch,
    ModelSpecError,
    load_arch,
    longest_sequence,
    looks_like_hub_id,
    shipped_models,
    shipped_name_of_folder,
    shipped_name_of_hub_id,
)
from hybrid_engine.plan.settings import FSDP_FAMILY
from recipes.check.fit import check_memory
from recipes.check.lookups import lookup_problems, lookup_warnings, registry_problems
from recipes.check.plan import ARTICLE_FACTORS, BUDGET_FALLBACKS
from recipes.check.schema import PackConfig, check_schema, depends_on, resolve
from recipes.cluster.ray_resources import resource_problems
from recipes.compose.confdir import recipe_defaults
from recipes.compose.layout_keys import Adoption, adopt, find_adoptions
from recipes.compose.overrides import override_key, override_value
from recipes.errors import ConfigError
from recipes.verl_ext import api as verl
from recipes.verl_ext import names as verl_names
from recipes.verl_ext import types as verl_types
from recipes.verl_ext.stability.entropy import entropy_warnings
from recipes.verl_ext.stability.kl_control import MAX_ERROR, one_step_factors, sequences_per_step

FSDP_STRATEGIES = FSDP_FAMILY


@dataclass(frozen=True)
class ValidatedRun:
    """What validation established, for the planner and the launcher; immutable (its config is read-only)."""

    cfg: DictConfig
    """the resolved config, verl keys with the layout's values filled in (read-only); the unresolved input when
    the checks found problems before resolving"""
    train: TrainLayout | None
    infer: InferLayout | None
    arch: ModelArch | None
    """the policy's architecture, as checked against the layouts"""
    warnings: tuple[str, ...]
    problems: tuple[str, ...]
    adopted: tuple[Adoption, ...] = ()
    """verl layout keys typed on the command line whose values became the layout's (the pack key interpolates)"""
    use_critic: bool = False
    use_ref: bool = False
    pack: PackConfig | None = None
    """the pack's own keys, typed (recipes.check.schema); None when they have problems"""


def _get(cfg: DictConfig, key: str, problems: list[str]):
    try:
        return OmegaConf.select(cfg, key, throw_on_missing=True)
    except Exception as error:  # noqa: BLE001 - interpolation/resolver errors become one problem line
        problems.append(f"{key}: cannot resolve: {error}".splitlines()[0])
        return None


def _world(cfg: DictConfig, problems: list[str]) -> tuple[int | None, str]:
    nnodes = _get(cfg, "cluster.nnodes", problems)
    per_node = _get(cfg, "cluster.gpus_per_node", problems)
    for key, value in (("cluster.nnodes", nnodes), ("cluster.gpus_per_node", per_node)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            problems.append(f"{key}: must be a positive integer, got {value!r}")
            return None, ""
    return nnodes * per_node, f"cluster.nnodes {nnodes} * cluster.gpus_per_node {per_node}"


def _layout_dict(cfg: DictConfig, key: str, problems: list[str]) -> dict:
    node = _get(cfg, key, problems)
    if node is None:
        return {}
    out = {}
    for axis in node.keys():
        out[str(axis)] = _get(cfg, f"{key}.{axis}", problems)
    return out


def load_model_arch(
    cfg: DictConfig, problems: list[str], warnings: list[str] | None = None, *, model_chosen: bool | None = None
) -> ModelArch | None:
    """The architecture of the model that runs, read from where verl reads it: ``actor_rollout_ref.model.path``
    (or ``hf_config_path`` when set), with ``arch.source`` saying where the numbers came from.

    - a local folder (or config file): its ``config.json`` (a malformed one is one problem naming the file and field);
    - a hub id the pack ships (``SHIPPED_HUB_IDS``): that shipped config; with ``model=<name>`` of another model
      chosen too, a warning says which one is checked (the one at the path);
    - another hub id, or a path not on this machine: nothing to read offline. With ``model=<name>`` chosen, that
      shipped config is checked (a warning says so); without, a warning (a problem for ``action=plan``) that the
      shape checks and the plan need ``model=<name>`` or a local folder, and None: no other model's numbers;
    - no path: the shipped ``model.name``.

    ``model_chosen``: whether ``model=`` was chosen explicitly; None decides it (``_model_chosen``).
    """
    warnings = [] if warnings is None else warnings
    name = OmegaConf.select(cfg, "model.name", default=None)
    chosen = _model_chosen(cfg) if model_chosen is None else model_chosen
    key = "actor_rollout_ref.model.hf_config_path"
    where = _get(cfg, key, problems) if OmegaConf.select(cfg, key, default=None) is not None else None
    if not where:
        key = "actor_rollout_ref.model.path"
        where = _get(cfg, key, problems)
    shipped = None
    if name:
        try:
            shipped = load_arch(str(name))
        except ModelSpecError as error:
            if not where or chosen:
                problems.append(f"model.name: {error}".splitlines()[0])
                return None
    if not where:
        if shipped is None:
            problems.append(f"model.name: not set and {key} is empty; choose model=<name> "
                            f"({', '.join(shipped_models())}) or set {key} to a folder with config.json")
            return None
        return replace(shipped, source=f"model.name {name}, shipped config")
    text = str(where)
    local = Path(text).expanduser()
    if local.is_dir() or local.is_file():
        if local.is_dir() and not (local / "config.json").is_file():
            problems.append(f"{key}: {local} has no config.json (verl reads the model's config from it)")
            return None
        try:
            arch = load_arch(local)
        except ModelSpecError as error:
            problems.append(f"{key}: {error}".splitlines()[0])
            return None
        if shipped is not None and replace(arch, name=shipped.name) == shipped:
            arch = replace(arch, name=shipped.name)  # the same numbers as the shipped config (the tiny demo model)
        elif shipped is not None and chosen:
            warnings.append(f"model.name: model={name} is not the model that runs: {key} {local} holds another "
                            f"architecture; checking {local / 'config.json'}")
        return replace(arch, source=f"local folder {local}")
    hub = shipped_name_of_hub_id(text)
    if hub is not None:
        if chosen and name and str(name) != hub:
            warnings.append(f"model.name: model={name} is not the model that runs: {key}={text} is {hub}; "
                            f"checking {hub} (the model at the path)")
        return replace(load_arch(hub), source=f"hub id {text}, shipped config")
    what = "a hub id the pack does not ship" if looks_like_hub_id(text) else "not a folder on this machine"
    if chosen and shipped is not None:
        warnings.append(f"{key}: {text} is {what}; checking model={name}'s shipped config in its place (it must "
                        f"be the same architecture)")
        return replace(shipped, source=f"model={name}, shipped config; {text} not read")
    named = None if looks_like_hub_id(text) else shipped_name_of_folder(text)
    if named is not None:
        folder_model, hub = named
        warnings.append(f"{key}: {text} is not a folder on this machine; its name is {hub}'s: checking "
                        f"{folder_model}'s shipped config (model=<name> or a local folder with config.json "
                        f"checks another)")
        return replace(load_arch(folder_model), source=f"folder named {hub}, shipped config; {text} not read")
    message = (f"{key}: {text} is {what}, so its config.json cannot be read offline: the shape checks and the plan "
               f"need model=<name> of the same architecture ({', '.join(shipped_models())}) or a local folder "
               f"with config.json")
    if OmegaConf.select(cfg, "action", default=None) == "plan":
        problems.append(message)
    else:
        warnings.append(f"{message}; heads, kv heads, layers and experts are not checked against the layouts")
    return None


def _model_chosen(cfg: DictConfig) -> bool:
    """Whether ``model=<name>`` was chosen rather than left at the recipe's default: a model.name other than the
    default option (the command line, an experiment or the embedded default chose it), or the default option typed
    on this Hydra run's command line (``hydra.overrides.task``; outside a Hydra run nothing was typed)."""
    name = OmegaConf.select(cfg, "model.name", default=None)
    if name is None:
        return False
    try:
        default = recipe_defaults(str(OmegaConf.select(cfg, "run.name"))).get("model")
    except Exception:  # noqa: BLE001 - no conf/ defaults to compare with: only the command line can say
        default = None
    if default is not None and str(name) != default:
        return True
    if not HydraConfig.initialized():
        return False
    try:
        task = list(HydraConfig.get().overrides.task)
    except Exception:  # noqa: BLE001 - a Hydra config without overrides: nothing was typed
        return False
    return any(override_key(arg) == "model" and override_value(arg).strip() == str(name) for arg in task)


def _fsdp_layout(cfg, train: dict, problems: list[str]) -> dict:
    """FSDP strategies train with tp = pp = 1: report otherwise; the layout to check further, as if they were 1 (no
    cascade of follow-on errors)."""
    train = dict(train)
    strategy = OmegaConf.select(cfg, "strategy.name")
    if strategy in FSDP_STRATEGIES:
        train.setdefault("order", FSDP_ORDER)
        for axis in ("tp", "pp"):
            value = train.get(axis)
            if isinstance(value, int) and value > 1:
                train[axis] = 1
                train["dp"] = -1
                problems.append(
                    f"layout.train.{axis}: {axis}({value}) > 1 needs strategy=megatron; verl's {strategy} engine "
                    f"shards over data parallel only (pick parallel=tp1/tp2/tp4/tp8 to generate with TP under FSDP)"
                )
        ep = train.get("ep")
        if isinstance(ep, int) and ep > 1 and strategy != "veomni":
            problems.append(f"layout.train.ep: ep({ep}) > 1 needs strategy=megatron or veomni under verl 0.9.1")
    return train


def _actor_dp(train: TrainLayout) -> int:
    """Ranks that each hold a different slice of the batch: dp (Ulysses/context-parallel ranks share sequences)."""
    return train.dp


def _check_batches(cfg, train: TrainLayout, use_critic: bool, problems: list[str],
                   warnings: list[str] | None = None) -> None:
    g = lambda key: _get(cfg, key, problems)  # noqa: E731
    batch, n = g("data.train_batch_size"), g("actor_rollout_ref.rollout.n")
    mini = g("actor_rollout_ref.actor.ppo_mini_batch_size")
    dp = _actor_dp(train)
    if not all(isinstance(v, int) and v > 0 for v in (batch, n, mini)):
        for key, v in (("data.train_batch_size", batch), ("actor_rollout_ref.rollout.n", n),
                       ("actor_rollout_ref.actor.ppo_mini_batch_size", mini)):
            if not (isinstance(v, int) and v > 0):
                problems.append(f"{key}: must be a positive integer, got {v!r}")
        return
    if batch < mini or batch % mini:
        problems.append(
            f"actor_rollout_ref.actor.ppo_mini_batch_size: data.train_batch_size({batch}) must be a multiple of "
            f"ppo_mini_batch_size({mini}): {batch} % {mini} = {batch % mini}"
        )
    # train_batch_size is a multiple of the mini-batch, so this also splits the whole rollout batch evenly
    if (mini * n) % dp:
        problems.append(
            f"actor_rollout_ref.actor.ppo_mini_batch_size: ppo_mini_batch_size({mini}) * rollout.n({n}) = {mini * n} "
            f"does not split over dp({dp}): {mini * n} % {dp} = {(mini * n) % dp}"
        )
    sections = [("actor_rollout_ref.actor", "ppo_micro_batch_size_per_gpu", "use_dynamic_bsz")]
    if use_critic:
        sections.append(("critic", "ppo_micro_batch_size_per_gpu", "use_dynamic_bsz"))
    for section, micro_key, dyn_key in sections:
        if g(f"{section}.{dyn_key}"):
            continue
        micro = g(f"{section}.{micro_key}")
        if not (isinstance(micro, int) and micro > 0):
            problems.append(f"{section}.{micro_key}: must be a positive integer with fixed batching, got {micro!r}")
            continue
        section_mini = mini if section != "critic" else (g("critic.ppo_mini_batch_size") or mini)
        per_gpu = section_mini * n // dp if (section_mini * n) % dp == 0 else None
        if per_gpu is not None and per_gpu % micro and warnings is not None:
            # verl 0.9.1 accepts it (its last micro-batch is shorter), so the pack does: a warning, not a refusal
            warnings.append(
                f"{section}.{micro_key}: the mini-batch per GPU, ppo_mini_batch_size({section_mini}) * rollout.n({n}) "
                f"/ dp({dp}) = {per_gpu}, is not a multiple of {micro_key}({micro}): {per_gpu} % {micro} = "
                f"{per_gpu % micro}, so the last micro-batch of each mini-batch holds {per_gpu % micro} sequences"
            )


def _check_token_budgets(cfg, train: TrainLayout, use_critic: bool, use_ref: bool, problems, warnings) -> None:
    g = lambda key: _get(cfg, key, problems)  # noqa: E731
    prompt, response = g("data.max_prompt_length"), g("data.max_response_length")
    if not (isinstance(prompt, int) and isinstance(response, int)):
        return
    seq = prompt + response
    cp = train.cp
    budgets = []
    if g("actor_rollout_ref.actor.use_dynamic_bsz"):
        budgets.append("actor_rollout_ref.actor.ppo_max_token_len_per_gpu")
    if g("actor_rollout_ref.rollout.log_prob_use_dynamic_bsz"):
        budgets.append("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu")
    if use_ref and g("actor_rollout_ref.ref.log_prob_use_dynamic_bsz"):
        budgets.append("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu")
    if use_critic and g("critic.use_dynamic_bsz"):
        budgets += ["critic.ppo_max_token_len_per_gpu", "critic.forward_max_token_len_per_gpu"]
    for key in budgets:
        budget = g(key)
        if not isinstance(budget, int):
            problems.append(f"{key}: must be an integer token count, got {budget!r}")
            continue
        if budget * cp < seq:
            problems.append(
                f"{key}: {budget} tokens * cp({cp}) = {budget * cp} < one sequence, data.max_prompt_length({prompt}) "
                f"+ data.max_response_length({response}) = {seq}"
            )
        elif budget * cp < 2 * seq:
            warnings.append(
                f"{key}: {budget} * cp({cp}) = {budget * cp} tokens is below 2x prompt+response ({2 * seq}); "
                f"the source article (blog.hotdry.top, 2025-12-02) recommends 2 to 3x for balanced micro-batches"
            )
    # the budgets were resolved by the reads above: an auto budget that could not be planned left its reason
    auto = [role for role in ("actor", "logprob", "critic") if OmegaConf.select(cfg, f"batching.{role}_factor") is None]
    if budgets and auto and OmegaConf.select(cfg, "batching.mode") == "dynamic" and BUDGET_FALLBACKS:
        factors = " / ".join(f"{ARTICLE_FACTORS[role]:g}x" for role in ("actor", "logprob", "critic"))
        warnings.append(f"batching: the auto token budgets could not be planned ({sorted(BUDGET_FALLBACKS)[0]}); the "
                        f"source article's factors stand in: {factors} of prompt + response for the actor, log-prob "
                        f"and critic (batching.*_factor to choose)")

def _check_model(
    arch: ModelArch, train: TrainLayout, infer: InferLayout, strategy: str, problems, warnings, rollout: str = ""
) -> None:
    name = arch.name
    heads, kv = arch.num_attention_heads, arch.num_key_value_heads
    if strategy == "megatron":
        if heads % train.tp:
            problems.append(f"layout.train.tp: {name} has {heads} attention heads, not divisible by tp({train.tp}): "
                            f"{heads} % {train.tp} = {heads % train.tp}")
        if kv % train.tp:
            # Megatron-core splits query groups over TP ranks: num_query_groups % tp == 0
            problems.append(f"layout.train.tp: Megatron needs tp({train.tp}) to divide {name}'s {kv} kv heads: "
                            f"{kv} % {train.tp} = {kv % train.tp}")
        if arch.num_hidden_layers % train.pp:
            problems.append(f"layout.train.pp: {name} has {arch.num_hidden_layers} layers, not divisible by "
                            f"pp({train.pp}): {arch.num_hidden_layers} % {train.pp} = "
                            f"{arch.num_hidden_layers % train.pp}")
    if rollout == "hf":
        # the hf rollout does not shard: infer.tp is the number of ranks per server (one feeds it), not a split of heads
        infer = replace(infer, tp=1, pp=1)
    if heads % infer.tp:
        problems.append(f"layout.infer.tp: {name} has {heads} attention heads, not divisible by tp({infer.tp}): "
                        f"{heads} % {infer.tp} = {heads % infer.tp}")
    if kv % infer.tp and infer.tp % kv:
        problems.append(f"layout.infer.tp: {name} has {kv} kv heads; tp({infer.tp}) must divide them or be a "
                        f"multiple of them")
    elif infer.tp > kv:
        warnings.append(f"layout.infer.tp: tp({infer.tp}) > {name}'s {kv} kv heads: each kv head is replicated "
                        f"{infer.tp // kv}x in generation")
    if arch.num_hidden_layers % infer.pp:
        problems.append(f"layout.infer.pp: {name} has {arch.num_hidden_layers} layers, not divisible by "
                        f"pp({infer.pp})")
    experts = getattr(arch, "num_experts", 0) or 0
    for layout, key in ((train, "layout.train.ep"), (infer, "layout.infer.ep")):
        if layout.ep > 1 and not experts:
            problems.append(f"{key}: ep({layout.ep}) > 1 but {name} is a dense model (no experts)")
        elif experts and experts % layout.ep:
            problems.append(f"{key}: {name} has {experts} experts, not divisible by ep({layout.ep}): "
                            f"{experts} % {layout.ep} = {experts % layout.ep}")


def sequence_problems(cfg: DictConfig, arch: ModelArch) -> list[str]:
    """Prompt + response (or a typed ``rollout.max_model_len``) longer than the model's positions: vLLM and SGLang
    refuse the engine at start-up, and past its positions the model's RoPE was never trained."""
    limit = longest_sequence(arch)
    prompt, response = (_int_or_none(cfg, f"data.max_{part}_length") for part in ("prompt", "response"))
    if not limit or prompt is None or response is None:
        return []
    stated = f"{arch.name}'s longest sequence is {limit:,} tokens ({_positions_source(arch, limit)})"
    if prompt + response > limit:
        return [f"data.max_response_length: data.max_prompt_length({prompt}) + data.max_response_length({response}) "
                f"= {prompt + response:,} tokens; {stated}: shorten them (the rollout engines refuse a longer one)"]
    typed = _int_or_none(cfg, "actor_rollout_ref.rollout.max_model_len")
    if typed is not None and typed > limit:
        return [f"actor_rollout_ref.rollout.max_model_len: {typed:,} tokens; {stated}: at most {limit:,}"]
    return []


def _positions_source(arch: ModelArch, limit: int) -> str:
    if limit == arch.max_position_embeddings:
        return "max_position_embeddings in its config.json"
    return "its config.json's RoPE scaling factor times its original positions"


def _int_or_none(cfg: DictConfig, key: str) -> int | None:
    value = _safe(lambda: OmegaConf.select(cfg, key), None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _admissible(cfg: DictConfig, arch: ModelArch | None, use_critic: bool):
    """Whether validation accepts another layout of this run (its batch splits, the model's heads per rank): for the
    layouts recipes.check.fit suggests."""
    strategy, rollout = OmegaConf.select(cfg, "strategy.name"), str(OmegaConf.select(cfg, "rollout.name"))

    def admissible(train: TrainLayout, infer: InferLayout) -> bool:
        found: list[str] = []
        _check_batches(cfg, train, use_critic, found)
        if arch is not None:
            _check_model(arch, train, infer, strategy, found, [], rollout)
        return not found

    return admissible


_OFFLINE_KEYS = ("hf_config_path", "load_tokenizer")
"""The model keys :func:`_offline_models` sets for verl's checks and puts back."""


@contextlib.contextmanager
def _offline_models(cfg: DictConfig, arch: ModelArch | None) -> Iterator[None]:
    """While open, ``cfg``'s models read their architecture from the shipped config.json instead of the hub.

    verl's HFModelConfig loads config and tokenizer from `path` while validating; when `path` is a hub id (weights
    not here yet) the check uses the pack's copy of the config and skips the tokenizer, so it runs offline. Each
    such model's ``hf_config_path`` and ``load_tokenizer`` are set in ``cfg`` (the check's own resolved copy) and put
    back as they were on the way out; a model whose path is a local folder is left alone (verl checks its config).
    """
    # an architecture the pack could not read (a hub id it does not ship): verl's conversion still loads a config,
    # so the tiny one stands in for verl's checks only; the pack's shape checks did not run (load_model_arch warns)
    shipped = MODEL_CONFIG_DIR / (str(arch.name) if arch is not None else "tiny")
    saved: list[tuple[DictConfig, dict]] = []
    if (shipped / "config.json").is_file():
        for section in ("actor_rollout_ref", "critic"):
            model = OmegaConf.select(cfg, f"{section}.model", default=None)
            if not isinstance(model, DictConfig) or Path(str(model.get("path"))).expanduser().is_dir():
                continue
            saved.append((model, {key: model[key] for key in _OFFLINE_KEYS if key in model}))
            model.hf_config_path, model.load_tokenizer = str(shipped), False
    try:
        yield
    finally:
        for model, before in saved:
            for key in _OFFLINE_KEYS:
                if key in before:
                    model[key] = before[key]
                else:
                    del model[key]


def _verl_checks(cfg: DictConfig, use_critic: bool, use_ref: bool, problems: list[str]) -> None:
    """verl 0.9.1's own validate_config and dataclass conversion, on the resolved config; its output is captured."""
    try:
        verl.validate_config(cfg, use_critic=use_critic, use_reference_policy=use_ref)
    except Exception as error:  # noqa: BLE001 - verl raises AssertionError/ValueError/TypeError with its own text
        text = " ".join(str(error).split()) or type(error).__name__
        problems.append(f"verl validate_config: {text}")


def validate(cfg: DictConfig, *, run_verl: bool = True) -> ValidatedRun:
    """Check everything; raise ConfigError with every problem, or return what was established."""
    run = check(cfg, run_verl=run_verl)
    if run.problems:
        raise ConfigError(list(run.problems))
    return run


def check(cfg: DictConfig, *, run_verl: bool = True) -> ValidatedRun:
    """Check everything and return what was established with the problems found (verl's checks only when none).

    The pack's checks, then, on the resolved values, the pack's schema (recipes.check.schema) and the range table
    (recipes.verl_ext.types.RANGES); verl's own checks (its annotations, then its validate_config) import verl and
    run once those found nothing; then the planned peak memory per GPU against the GPU's (recipes.check.fit).

    A pure function: ``cfg`` is not written to. verl layout keys typed directly are adopted into a copy (and come
    back as ``adopted``); the result's config is resolved and read-only.
    """
    BUDGET_FALLBACKS.clear()  # what this config's auto token budgets say when they cannot be planned
    adoptions, problems = find_adoptions(cfg)
    if adoptions:
        cfg = copy.deepcopy(cfg)  # the rest of the check only reads
        adopt(cfg, adoptions)
    warnings: list[str] = [f"note: {a.note}" for a in adoptions if a.changed]
    world, world_desc = _world(cfg, problems)
    train_d = _fsdp_layout(cfg, _layout_dict(cfg, "layout.train", problems), problems)
    infer_d = _layout_dict(cfg, "layout.infer", problems)
    train = infer = None
    if world is not None:
        train, infer, layout_problems = collect_layout_errors(
            train_d, infer_d, world, world_desc, gpus_per_node=OmegaConf.select(cfg, "cluster.gpus_per_node"))
        problems += layout_problems
    use_critic, use_ref = _safe(lambda: verl.roles(cfg), (False, False))
    arch = load_model_arch(cfg, problems, warnings)
    warnings.extend(entropy_warnings(cfg))  # entropy=clip_cov|kl_cov under strictly on-policy updates
    warnings.extend(_kl_rate_warnings(cfg))  # a horizon so short that one step can flip a KL coefficient's sign
    if train is not None:
        _check_batches(cfg, train, use_critic, problems, warnings)
        _check_token_budgets(cfg, train, use_critic, use_ref, problems, warnings)
        if arch is not None and infer is not None:
            strategy, rollout = OmegaConf.select(cfg, "strategy.name"), str(OmegaConf.select(cfg, "rollout.name"))
            _check_model(arch, train, infer, strategy, problems, warnings, rollout)
    if arch is not None:
        problems.extend(sequence_problems(cfg, arch))
    if world is not None:
        problems.extend(_safe(lambda: resource_problems(cfg, world), []))
    # the resolved values: the pack's schema and the range table; one line per key (the first problem of a key
    # wins; a value computed from a key already reported, ${kl.target}, is not reported again)
    container, unresolved = resolve(cfg)
    pack, schema_problems = check_schema(container)
    inactive = verl_types.inactive_sections(container, use_critic=use_critic, use_ref=use_ref)
    wrong_kind: dict[str, str] = {}  # a ranged key of a verl class holding a string ...: its type check names it
    ranges = verl_types.range_problems(container, inactive, deferred=wrong_kind)
    looked_up, looked_up_warnings = lookup_problems(container, arch, train and train.cp, use_critic)  # issue 49
    warnings.extend(looked_up_warnings + lookup_warnings(container, use_critic))
    # a value that cannot be computed last: where it names the key it was computed from, that key's own check says it
    # better (data.max_prompt_length=abc: "must be an integer >= 1")
    _merge(problems, cfg, [*schema_problems, *ranges.values(), *band_problems(pack), *looked_up,
                           *unresolved.values()])
    if not problems and run_verl:
        # verl's own annotations; they import verl (seconds), so, as verl's validator, once the pack's checks pass
        _merge(problems, cfg, verl_types.type_problems(container, inactive).values())
        _merge(problems, cfg, verl_names.name_problems(container, inactive).values())  # verl's registries
        _merge(problems, cfg, registry_problems(container, inactive).values())  # rollout, reward manager, device
    _merge(problems, cfg, wrong_kind.values())
    if problems:
        cfg = copy.deepcopy(cfg)  # handed on read-only: never the caller's own object
    else:
        checked, cfg = cfg, OmegaConf.create(container)
        if run_verl:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            with _offline_models(cfg, arch):
                _verl_checks(cfg, use_critic, use_ref, problems)
        # the planned peak memory per GPU against the GPU (recipes.check.fit), with the changes that fit when it
        # does not
        check_memory(checked, train, infer, arch, use_critic=use_critic, use_ref=use_ref,
                     allow_overcommit=pack is not None and pack.run.allow_overcommit,
                     admissible=_admissible(cfg, arch, use_critic), problems=problems, warnings=warnings)
    OmegaConf.set_readonly(cfg, True)
    return ValidatedRun(cfg=cfg, train=train, infer=infer, arch=arch, warnings=tuple(warnings),
                        problems=tuple(problems), adopted=tuple(adoptions), use_critic=use_critic, use_ref=use_ref,
                        pack=pack if not problems else None)


def band_problems(pack) -> list[str]:
    """Monitoring bands that could never judge a step as meant: a bound that is not a finite number, a lower edge
    above the upper one, an ``unstable`` side without a bound on it. Found here, before anything starts, not when the
    run's summary is written at its end."""
    if pack is None:
        return []
    out = []
    for name, band in pack.monitor.bands.items():
        key = f"monitor.bands.{name}"
        for side in ("low", "high"):
            value = getattr(band, side)
            if value is not None and not math.isfinite(value):
                out.append(f"{key}.{side}: {value} is not a finite number")
        low, high = band.low, band.high
        if low is not None and high is not None and math.isfinite(low) and math.isfinite(high) and low > high:
            out.append(f"{key}.low: {low:g} > {key}.high {high:g}: no value is inside the band")
        if band.unstable is not None and getattr(band, band.unstable) is None:
            out.append(f"{key}.unstable: {band.unstable!r} but {key}.{band.unstable} is null: that side has no "
                       "bound to leave")
    return out


def _merge(problems: list[str], cfg: DictConfig, lines) -> None:
    """Append each of ``lines`` whose key no problem names yet and whose value is not computed (by interpolation)
    from a key that a problem or another of ``lines`` names: one line per mistake, at the key that was typed."""
    lines = list(lines)
    named = {problem.split(":", 1)[0] for problem in problems}
    suspects = named | {line.split(":", 1)[0] for line in lines}
    for line in lines:
        key = line.split(":", 1)[0]
        if key in named or depends_on(cfg, key, suspects):
            continue
        problems.append(line)
        named.add(key)


def _kl_rate_warnings(cfg) -> list[str]:
    """One warning where a KL coefficient moved by verl's proportional rule (the in-reward one, or the pack's
    loss-side one) can reach 0 or below in one step: ``algorithm.kl_ctrl.horizon`` too short for the step's
    sequences. verl accepts such a horizon, and so does the pack; the warning says what it does."""
    in_reward = (OmegaConf.select(cfg, "algorithm.use_kl_in_reward", default=False) is True
                 and OmegaConf.select(cfg, "algorithm.kl_ctrl.type", default=None) == "adaptive")
    loss_side = (OmegaConf.select(cfg, "actor_rollout_ref.actor.use_kl_loss", default=False) is True
                 and OmegaConf.select(cfg, "kl.mode", default=None) in ("adaptive", "ramp"))
    values = _safe(lambda: (sequences_per_step(cfg), float(OmegaConf.select(cfg, "algorithm.kl_ctrl.horizon"))), None)
    if not (in_reward or loss_side) or values is None or values[1] <= 0:
        return []
    n, horizon = values
    prompts, samples = cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n
    low, high = one_step_factors(n, horizon)
    if low > 0:
        return []
    which = "in-reward" if in_reward else "loss-side"
    return [f"algorithm.kl_ctrl.horizon: {horizon:g} against {n} sequences a step (data.train_batch_size {prompts} x "
            f"actor_rollout_ref.rollout.n {samples}): one step of the adaptive rule multiplies the {which} KL "
            f"coefficient by 1 +- {MAX_ERROR:g} * {n}/{horizon:g}, between {low:.3g} and {high:.3g}, so a KL far below "
            f"its target sets it to 0 or below (a reward for leaving the reference); a horizon above "
            f"{n / MAX_ERROR:g} keeps it positive"]


def _safe(fn, default):
    try:
        return fn()
    except Exception:  # noqa: BLE001
        return default
