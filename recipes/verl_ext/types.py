"""verl 0.9.1's own types for the keys it reads, and the ranges its runtime needs, checked before Ray starts.

**Types, from the source.** Every node of the config whose ``_target_`` names a verl dataclass (the actor, ref,
rollout, critic, optimizer, engine, model, algorithm, ... nodes of verl's ``ppo_trainer`` tree) is checked leaf by
leaf against that class's annotations (``dataclasses.fields`` + ``typing.get_type_hints``): int, float (an int is
fine), bool, str, ``Optional``/unions, ``Literal``, lists/tuples, dicts, nested dataclasses (recursing, a nested node
with its own ``_target_`` by that class). An annotation this module does not understand is skipped. verl
instantiates these nodes with Hydra (``instantiate``), which checks no type, so a string where a float is expected
would only fail deep inside a training step. A field verl adds later is checked with no new code: the table is read
from the classes (once per class per process).

``None`` is accepted for every field: verl's own YAML writes ``null`` for "unset" also where the annotation is not
``Optional`` (``critic.forward_micro_batch_size: int``), and a missing value (``???``) is left to the checks that
need it. Keys that are not fields of the class are left alone (verl's own ``validate_config`` reports those it
reads). Sections verl never builds in this run are not checked (the critic without a critic, the reference policy
without KL, a disabled reward model or distillation teacher, the separate-async trainer's switch when another trainer
runs): what verl 0.9.1 accepts, the pack accepts.

**Ranges.** :data:`RANGES` is the one table of the value constraints verl 0.9.1 (or the engine and torch under it)
fails on at run time, each with its key and reason; :func:`range_problems` checks them on the resolved config.

Only the type table imports verl (function-local, ``import verl`` costs seconds); the ranges need nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import math
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

MISSING_VALUE = "???"

# -- annotations -> expectations ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Expect:
    """What an annotation allows, in the terms of a resolved config (plain dicts, lists and scalars).

    ``kind`` is one of int, float, bool, str, none, literal, list, tuple, dict, dataclass, union; ``args`` holds the
    element expectations (list: one, tuple: one per position, dict: the value's, union: the members), the literal
    values, or the dataclass (``cls``)."""

    kind: str
    args: tuple = ()
    cls: type | None = None


INT, FLOAT, BOOL, STR, NONE = Expect("int"), Expect("float"), Expect("bool"), Expect("str"), Expect("none")
_SCALARS = {int: INT, float: FLOAT, bool: BOOL, str: STR, type(None): NONE}
_NAMES = {"int": ("an integer", "integers"), "float": ("a float", "floats"), "bool": ("a boolean", "booleans"),
          "str": ("a string", "strings")}


def expectation(annotation) -> Expect | None:
    """The :class:`Expect` of a type annotation; None where it allows anything or is not understood (then skipped)."""
    if annotation in _SCALARS:
        return _SCALARS[annotation]
    if annotation is typing.Any or annotation is object:
        return None
    if dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
        return Expect("dataclass", cls=annotation)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return Expect("literal", args)
    if origin is typing.Union or origin is types.UnionType:
        members = tuple(expectation(arg) for arg in args)
        return None if any(m is None for m in members) else Expect("union", members)
    if annotation in (list, tuple, Sequence) or origin in (list, Sequence):
        inner = expectation(args[0]) if args else None
        return Expect("list", (inner,))
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return Expect("list", (expectation(args[0]),))
        return Expect("tuple", tuple(expectation(arg) for arg in args))
    if annotation in (dict, Mapping) or origin in (dict, Mapping):
        return Expect("dict", (expectation(args[1]) if len(args) == 2 else None,))
    return None


def conforms(value, expect: Expect | None) -> bool:
    """Whether ``value`` (a resolved config value) is what ``expect`` allows; None (unset) always is."""
    if expect is None or value is None:
        return True
    kind = expect.kind
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str)
    if kind == "none":
        return False
    if kind == "literal":
        return any(value == choice and type(value) is type(choice) for choice in expect.args)
    if kind == "list":
        return isinstance(value, (list, tuple)) and all(conforms(item, expect.args[0]) for item in value)
    if kind == "tuple":
        return (isinstance(value, (list, tuple)) and len(value) == len(expect.args)
                and all(conforms(item, e) for item, e in zip(value, expect.args, strict=True)))
    if kind in ("dict", "dataclass"):
        # a dataclass node's own leaves are checked one by one (see type_problems)
        return isinstance(value, dict) and (kind == "dataclass" or all(conforms(v, expect.args[0])
                                                                         for v in value.values()))
    if kind == "union":
        return any(conforms(value, member) for member in expect.args)
    return True


def describe(expect: Expect | None, plural: bool = False) -> str:
    """``a float``, ``one of 'a', 'b'``, ``a list of integers``, ``an integer or a string`` ..."""
    if expect is None:
        return "values" if plural else "any value"
    kind = expect.kind
    if kind in _NAMES:
        return _NAMES[kind][1 if plural else 0]
    if kind == "none":
        return "None"
    if kind == "literal":
        return f"{'values among' if plural else 'one of'} {', '.join(repr(choice) for choice in expect.args)}"
    if kind == "list":
        inner = expect.args[0]
        return ("lists" if plural else "a list") + ("" if inner is None else f" of {describe(inner, plural=True)}")
    if kind == "tuple":
        kinds = {describe(e, plural=True) for e in expect.args}
        each = kinds.pop() if len(kinds) == 1 else "values"
        return ("lists" if plural else "a list") + f" of {len(expect.args)} {each}"
    if kind == "dict":
        inner = expect.args[0]
        return ("mappings" if plural else "a mapping") + ("" if inner is None else f" to {describe(inner, True)}")
    if kind == "dataclass":
        return "mappings" if plural else "a mapping"
    members = [m for m in expect.args if m.kind != "none"]  # None is always accepted
    return " or ".join(describe(m, plural) for m in members) if members else "None"


def _dataclass_of(expect: Expect | None) -> type | None:
    """The one dataclass a (possibly Optional) expectation names, else None."""
    if expect is None:
        return None
    if expect.kind == "dataclass":
        return expect.cls
    if expect.kind == "union":
        found = [m.cls for m in expect.args if m.kind == "dataclass"]
        return found[0] if len(found) == 1 else None
    return None


# -- the type table, read from verl's classes ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TypedField:
    """One field of a verl dataclass: its expectation and where it is declared (``ActorConfig.clip_ratio``)."""

    name: str
    expect: Expect
    owner: str


def _owner(cls: type, name: str) -> str:
    for klass in cls.__mro__:
        if name in klass.__dict__.get("__annotations__", {}):
            return f"{klass.__name__}.{name}"
    return f"{cls.__name__}.{name}"


@functools.cache
def class_fields(cls: type) -> dict[str, TypedField]:
    """The typed fields of a dataclass (fields whose annotation is understood); read once per class."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - an unresolvable forward reference: fall back to the evaluated annotations
        hints = {}
    table = {}
    for item in dataclasses.fields(cls):
        annotation = hints.get(item.name, item.type)
        if isinstance(annotation, str):
            continue
        expect = expectation(annotation)
        if expect is not None and item.name != "_target_":
            table[item.name] = TypedField(item.name, expect, _owner(cls, item.name))
    return table


@functools.cache
def target_class(target: str) -> type | None:
    """The verl dataclass a ``_target_`` names (imported once); None for anything else."""
    if not target.startswith("verl."):
        return None
    module_name, _, name = target.rpartition(".")
    try:
        # lazy: import verl costs seconds; only a config without other problems reaches the type check
        module = importlib.import_module(module_name)
    except Exception:  # noqa: BLE001 - a target verl does not have: Hydra/verl report it when they instantiate
        return None
    cls = getattr(module, name, None)
    return cls if isinstance(cls, type) and dataclasses.is_dataclass(cls) else None


# -- sections verl does not build in this run ---------------------------------------------------------------------


def _at(container, key: str, default=None):
    node = container
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def inactive_sections(container: dict, *, use_critic: bool, use_ref: bool) -> frozenset[str]:
    """The sections of the resolved config that verl 0.9.1 does not instantiate in this run."""
    out = set()
    if not use_critic:
        out.add("critic")
    if not use_ref:
        out.add("actor_rollout_ref.ref")
    if not _at(container, "distillation.enabled", False):
        out.add("distillation")
    if not _at(container, "reward.reward_model.enable", False):
        out.add("reward.reward_model")
    if _at(container, "trainer.v1.trainer_mode") != "separate_async":
        out.add("trainer.v1.separate_async")
    return frozenset(out)


# -- the type check -----------------------------------------------------------------------------------------------


def typed_leaves(container: dict, inactive: frozenset[str] = frozenset()) -> Iterator[tuple[str, object, TypedField]]:
    """``(full key, value, field)`` of every leaf of the resolved config that a verl dataclass types (imports verl).

    A leaf is a value that is not a node of a dataclass; a dict-typed or list-typed value counts as one leaf."""

    def walk(node: dict, path: str, fields: dict[str, TypedField] | None):
        target = node.get("_target_")
        if isinstance(target, str):
            cls = target_class(target)
            fields = class_fields(cls) if cls is not None else None
        for key, value in node.items():
            if key == "_target_":
                continue
            child = f"{path}.{key}" if path else str(key)
            if child in inactive:
                continue
            field = fields.get(key) if fields is not None else None
            nested = _dataclass_of(field.expect) if field is not None else None
            if isinstance(value, dict) and (nested is not None or field is None):
                yield from walk(value, child, class_fields(nested) if nested is not None else None)
            elif field is not None:
                yield child, value, field
                if isinstance(value, dict):
                    yield from walk(value, child, None)

    yield from walk(container, "", None)


def type_problem(key: str, value, field: TypedField) -> str | None:
    """The problem line for one typed leaf, or None when it conforms."""
    if value == MISSING_VALUE or conforms(value, field.expect):
        return None
    return f"{key}: expected {describe(field.expect)} (verl's {field.owner}), got {_show(value)}"


def type_problems(container: dict, inactive: frozenset[str] = frozenset()) -> dict[str, str]:
    """Full key -> problem line for every leaf that does not match verl's annotation (imports verl)."""
    out = {}
    for key, value, field in typed_leaves(container, inactive):
        line = type_problem(key, value, field)
        if line is not None:
            out[key] = line
    return out


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# -- ranges -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Range:
    """A constraint verl's runtime needs of one key's value: ``low``/``high`` bounds (open or closed)."""

    key: str
    reason: str
    """what the value is, and where verl fails otherwise"""
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    """True: the value must be > low (else >= low)"""
    high_open: bool = False
    integer: bool = False
    """an integer count (a float or a boolean is a problem)"""
    optional: bool = False
    """None (unset) is fine"""
    when: tuple[str, object] | None = None
    """(key, value): checked only when that key has that value (verl reads the key only then)"""

    def right_kind(self, value) -> bool:
        """A number (an integer for a count), not a boolean."""
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return number and (isinstance(value, int) or not self.integer)

    def bounds(self) -> str:
        if self.low is not None and self.high is not None:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            return f"in {left}{_num(self.low)}, {_num(self.high)}{right}"
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {_num(self.low)}"
        return f"{'<' if self.high_open else '<='} {_num(self.high)}"

    def problem(self, value) -> str | None:
        """The problem line for ``value``, or None when it is in range."""
        if value is None and self.optional:
            return None
        if not self.right_kind(value):
            kind = "an integer" if self.integer else "a number"
            return f"{self.key}: must be {kind} {self.bounds()} ({self.reason}), got {_show(value)}"
        if not math.isfinite(value):  # inf passes every bound; nan fails every comparison but says nothing
            return f"{self.key}: must be a finite number {self.bounds()} ({self.reason}), got {_show(value)}"
        low_ok = self.low is None or (value > self.low if self.low_open else value >= self.low)
        high_ok = self.high is None or (value < self.high if self.high_open else value <= self.high)
        if low_ok and high_ok:
            return None
        return f"{self.key}: must be {self.bounds()} ({self.reason}), got {_show(value)}"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _count(key: str, reason: str = "a count", **kw) -> Range:
    return Range(key, reason, low=1, integer=True, **kw)


def _micro(section: str, key: str, dynamic_flag: str) -> Range:
    return _count(f"{section}.{key}", "a micro-batch size: sequences per forward", optional=True,
                  when=(f"{section}.{dynamic_flag}", False))


_A, _R, _REF = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref"

RANGES: tuple[Range, ...] = (
    # lengths and counts: verl's dataloader, tokenizer and engines take them as sizes
    _count("data.train_batch_size", "a count: prompts per step"),
    _count("data.max_prompt_length", "a count: tokens"),
    _count("data.max_response_length", "a count: tokens"),
    _count(f"{_R}.n", "a count: samples per prompt"),
    _count(f"{_R}.val_kwargs.n", "a count: samples per validation prompt"),
    _count(f"{_A}.ppo_mini_batch_size", "a count: prompts per PPO update"),
    _count(f"{_A}.ppo_epochs"),
    _count("critic.ppo_mini_batch_size", "a count: prompts per critic update"),
    _count("critic.ppo_epochs"),
    _count("trainer.total_epochs"),
    _count("trainer.total_training_steps", "a count: steps", optional=True),
    # micro-batch sizes, where verl splits by them (fixed batching)
    _micro(_A, "ppo_micro_batch_size", "use_dynamic_bsz"),
    _micro(_A, "ppo_micro_batch_size_per_gpu", "use_dynamic_bsz"),
    _micro(_R, "log_prob_micro_batch_size", "log_prob_use_dynamic_bsz"),
    _micro(_R, "log_prob_micro_batch_size_per_gpu", "log_prob_use_dynamic_bsz"),
    _micro(_REF, "log_prob_micro_batch_size", "log_prob_use_dynamic_bsz"),
    _micro(_REF, "log_prob_micro_batch_size_per_gpu", "log_prob_use_dynamic_bsz"),
    _micro("critic", "ppo_micro_batch_size", "use_dynamic_bsz"),
    _micro("critic", "ppo_micro_batch_size_per_gpu", "use_dynamic_bsz"),
    _micro("critic", "forward_micro_batch_size", "use_dynamic_bsz"),
    _micro("critic", "forward_micro_batch_size_per_gpu", "use_dynamic_bsz"),
    # fractions
    Range(f"{_R}.gpu_memory_utilization", "a fraction of each GPU's memory for the engine; vLLM and SGLang refuse "
          "others", low=0, high=1, low_open=True),
    Range(f"{_R}.top_p", "a probability mass; vLLM and SGLang refuse others", low=0, high=1, low_open=True),
    Range(f"{_R}.val_kwargs.top_p", "a probability mass; vLLM and SGLang refuse others", low=0, high=1,
          low_open=True),
    Range(f"{_R}.temperature", "a sampling temperature; vLLM refuses a negative one", low=0),
    Range(f"{_R}.val_kwargs.temperature", "a sampling temperature; vLLM refuses a negative one", low=0),
    # coefficients and clip ratios
    Range(f"{_A}.clip_ratio", "a clip ratio", low=0, low_open=True),
    Range(f"{_A}.clip_ratio_low", "a clip ratio", low=0, low_open=True),
    Range(f"{_A}.clip_ratio_high", "a clip ratio", low=0, low_open=True),
    Range(f"{_A}.clip_ratio_c", "the dual-clip bound; verl's policy loss asserts clip_ratio_c > 1", low=1,
          low_open=True),
    Range(f"{_A}.policy_loss.clip_cov_ratio", "a share of tokens; verl's clip_cov loss asserts it is > 0", low=0,
          low_open=True, when=(f"{_A}.policy_loss.loss_mode", "clip_cov")),
    Range(f"{_A}.entropy_coeff", "a coefficient", low=0),
    Range(f"{_A}.kl_loss_coef", "a KL coefficient", low=0),
    Range("algorithm.kl_ctrl.kl_coef", "a KL coefficient", low=0),
    Range("algorithm.kl_ctrl.target_kl", "a KL target per token", low=0),
    Range("algorithm.kl_ctrl.horizon", "verl's adaptive KL controller asserts horizon > 0", low=0, low_open=True,
          when=("algorithm.kl_ctrl.type", "adaptive")),
    # returns: verl's GAE and REINFORCE++ discount by gamma and lam; outside [0, 1] the advantages grow without bound
    Range("algorithm.gamma", "a discount factor", low=0, high=1),
    Range("algorithm.lam", "GAE's lambda", low=0, high=1),
    Range(f"{_R}.top_k", "vLLM and SGLang take -1 or 0 for off, else a count of tokens", low=-1, integer=True),
    # optimizers: torch's AdamW refuses a negative learning rate or weight decay
    *(entry for section in (_A, "critic") for entry in (
        Range(f"{section}.optim.lr", "a learning rate; torch's optimizers refuse a negative one", low=0),
        Range(f"{section}.optim.weight_decay", "torch's AdamW refuses a negative weight decay", low=0),
        Range(f"{section}.optim.clip_grad", "a gradient-norm bound; verl clips by it every step, and at 0 or "
              "below no update moves the weights", low=0, low_open=True),
        Range(f"{section}.optim.lr_warmup_steps_ratio", "a share of the run's steps", low=0, high=1),
        Range(f"{section}.optim.min_lr_ratio", "a share of the learning rate that the cosine schedule ends at",
              low=0, high=1, optional=True),
        Range(f"{section}.optim.num_cycles", "cosine cycles over the run", low=0),
    )),
)
"""The value constraints verl 0.9.1 fails on at run time, one per key."""

_ABSENT = object()


def _inside(key: str, sections: frozenset[str]) -> bool:
    return any(key == s or key.startswith(s + ".") for s in sections)


def _under_verl_target(container: dict, key: str) -> bool:
    """Whether ``key`` lies inside a node whose ``_target_`` names a verl class (so verl's annotations type it)."""
    node = container
    for part in key.split(".")[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and str(node.get("_target_", "")).startswith("verl."):
            return True
    return False


def range_problems(container: dict, inactive: frozenset[str] = frozenset(), ranges: Sequence[Range] = RANGES,
                   deferred: dict[str, str] | None = None) -> dict[str, str]:
    """Full key -> problem line for every :data:`RANGES` entry the resolved config breaks; a key this config does
    not have (another strategy's key), an inactive section, or an entry whose ``when`` does not hold is skipped.

    ``deferred``: where the lines for a value of the wrong kind inside a verl class's node go instead (verl's own
    type check names the class's field for them; these lines are for keys it does not type)."""
    out = {}
    for entry in ranges:
        if _inside(entry.key, inactive):
            continue
        if entry.when is not None and _at(container, entry.when[0], _ABSENT) != entry.when[1]:
            continue
        value = _at(container, entry.key, _ABSENT)
        if value is _ABSENT or value == MISSING_VALUE:
            continue
        line = entry.problem(value)
        if line is None:
            continue
        wrong_kind = value is not None and not entry.right_kind(value)
        if deferred is not None and wrong_kind and _under_verl_target(container, entry.key):
            deferred[entry.key] = line
        else:
            out[entry.key] = line
    return out
