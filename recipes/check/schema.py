"""The pack's own keys, typed: one dataclass per group whose keys Python reads, with units and ranges.

``load_schema(cfg)`` turns the resolved config into a :class:`PackConfig` and collects every problem as one line
naming the full key (``cluster.gpu.memory_gib: must be > 0, got -1``), raised as :class:`SchemaError`; a value of
the wrong kind (``cluster.gpu=foo`` where a mapping is expected) is a problem line like any other, never a traceback.
Each class's ``__post_init__`` checks its fields' types (from the annotations) and ranges (``metadata`` of the
field), so an instance built in Python is held to the same rules. Defaults here are the only defaults of these keys
in Python: code that reads a pack key reads it from these classes (:func:`load_section`), not with
``.get(key, default)``. verl's keys are typed by verl's own classes (:mod:`recipes.verl_ext.types`).

Keys a group does not declare are left alone (nothing in Python reads them).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from omegaconf import DictConfig, ListConfig, OmegaConf

from recipes.run import gc_threshold
from recipes.verl_ext.types import MISSING_VALUE, Expect, conforms, describe, expectation

# -- bounds -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Bound:
    """A range for one numeric field: ``> low`` or ``>= low`` (and ``high`` likewise); ``also``: values allowed
    outside it (with what they mean)."""

    low: float | None = None
    low_open: bool = False
    high: float | None = None
    high_open: bool = False
    also: tuple[tuple[float, str], ...] = ()

    def text(self) -> str:
        parts = []
        if self.low is not None and self.high is not None:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            parts.append(f"in {left}{_num(self.low)}, {_num(self.high)}{right}")
        elif self.low is not None:
            parts.append(f"{'>' if self.low_open else '>='} {_num(self.low)}")
        elif self.high is not None:
            parts.append(f"{'<' if self.high_open else '<='} {_num(self.high)}")
        for value, meaning in self.also:
            parts.append(f"or {_num(value)} ({meaning})")
        return " ".join(parts)

    def holds(self, value) -> bool:
        if any(value == allowed for allowed, _ in self.also):
            return True
        if self.low is not None and not (value > self.low if self.low_open else value >= self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _bounded(bound: Bound, **kw):
    return field(metadata={"bound": bound}, **kw)


POSITIVE = Bound(low=0, low_open=True)
AT_LEAST_ONE = Bound(low=1)
NON_NEGATIVE = Bound(low=0)
UNIT_INTERVAL = Bound(low=0, high=1, low_open=True)


class SchemaError(ValueError):
    """Problems of one config (or one instance): full-key lines, or ``(field, message)`` pairs from
    ``__post_init__`` before the caller prefixes the key."""

    def __init__(self, problems: list):
        self.problems = list(problems)
        super().__init__("\n".join(p if isinstance(p, str) else f"{p[0]}: {p[1]}" for p in self.problems))


# -- the checks every class runs ----------------------------------------------------------------------------------


@functools.cache
def _expectations(cls: type) -> dict[str, tuple[Expect | None, Bound | None]]:
    hints = typing.get_type_hints(cls)
    return {f.name: (expectation(hints[f.name]), f.metadata.get("bound")) for f in dataclasses.fields(cls)}


def field_problems(cls: type, values: Mapping) -> list[tuple[str, str]]:
    """``(field, message)`` for each value of ``values`` that does not fit ``cls``'s field: its type, then its
    bound. A nested schema instance (or a mapping of them) was checked when it was built."""
    out = []
    for name, (expect, bound) in _expectations(cls).items():
        if name not in values:
            continue
        value = values[name]
        if _holds_instances(value, expect):
            continue
        if not conforms(value, expect):
            out.append((name, f"expected {describe(expect)}, got {_show(value)}"))
        elif bound is not None and value is not None and not bound.holds(value):
            out.append((name, f"must be {bound.text()}, got {_show(value)}"))
    return out


def _holds_instances(value, expect: Expect | None) -> bool:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return True
    return (expect is not None and expect.kind == "dict" and isinstance(value, dict)
            and all(dataclasses.is_dataclass(v) for v in value.values()) and bool(value))


class _Checked:
    """``__post_init__``: every field's type and range; SchemaError with ``(field, message)`` pairs."""

    __slots__ = ()

    def __post_init__(self):
        problems = field_problems(type(self), {f.name: getattr(self, f.name) for f in dataclasses.fields(self)})
        if problems:
            raise SchemaError(problems)


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# -- the groups ---------------------------------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class TrainAxes(_Checked):
    """``layout.train``: the training layout (Megatron/FSDP degrees); world_size = dp * tp * pp * cp."""

    dp: int = _bounded(Bound(low=1, also=((-1, "the other degrees do not divide the world size"),)))
    """data-parallel replicas, ranks; derived: world_size / (tp * pp * cp); 1: every rank holds the same slice"""
    tp: int = _bounded(AT_LEAST_ONE, default=1)
    """tensor-parallel shards per layer, ranks (Megatron only); 1: no tensor parallelism"""
    pp: int = _bounded(AT_LEAST_ONE, default=1)
    """pipeline stages, ranks (Megatron only); 1: no pipeline"""
    cp: int = _bounded(AT_LEAST_ONE, default=1)
    """context-parallel ranks (Megatron context parallel, FSDP Ulysses); 1: whole sequences per rank"""
    ep: int = _bounded(AT_LEAST_ONE, default=1)
    """expert-parallel ranks (MoE), carved out of dp * cp; 1: every rank holds all experts"""
    etp: int | None = _bounded(AT_LEAST_ONE, default=None)
    """expert tensor parallel ranks (Megatron MoE parallel folding); null: tp, Megatron's default"""


@dataclass(kw_only=True, slots=True)
class InferAxes(_Checked):
    """``layout.infer``: the generation layout (vLLM / SGLang / hf); world_size = dp * tp * pp."""

    tp: int = _bounded(AT_LEAST_ONE, default=1)
    """generation tensor parallel, ranks per replica; 1: one GPU per replica"""
    pp: int = _bounded(AT_LEAST_ONE, default=1)
    """generation pipeline stages; 1: no pipeline"""
    dp: int = _bounded(Bound(low=1, also=((-1, "tp * pp does not divide the world size"),)))
    """generation replicas; derived: world_size / (tp * pp); 1: one engine for all ranks"""
    ep: int = _bounded(AT_LEAST_ONE, default=1)
    """generation expert parallel, ranks; 1: no expert parallelism"""


@dataclass(kw_only=True, slots=True)
class Layout(_Checked):
    """``layout``: the training and generation layouts (the parallel/ group fills them)."""

    train: TrainAxes
    """the training layout"""
    infer: InferAxes
    """the generation layout"""


@dataclass(kw_only=True, slots=True)
class GPU(_Checked):
    """``cluster.gpu``: one accelerator's numbers, for the plan's memory and time estimates."""

    name: str
    """accelerator type (the cluster/ option's name); informational"""
    memory_gib: float = _bounded(POSITIVE)
    """memory per accelerator, GiB (2**30 bytes); 1: one GiB"""
    nvlink_GBps: float = _bounded(POSITIVE)
    """intra-node bandwidth per GPU, GB/s (10**9 bytes) each way; the plan divides by it"""
    network_GBps: float = _bounded(POSITIVE)
    """inter-node bandwidth per GPU, GB/s each way (one NIC per GPU); the plan divides by it"""


@dataclass(kw_only=True, slots=True)
class Cluster(_Checked):
    """``cluster``: nnodes nodes of gpus_per_node accelerators each."""

    nnodes: int = _bounded(AT_LEAST_ONE)
    """nodes in the Ray cluster; 1: a single node (no inter-node traffic)"""
    gpus_per_node: int = _bounded(AT_LEAST_ONE)
    """accelerators (ranks) per node; 1: one rank per node"""
    world_size: int = _bounded(AT_LEAST_ONE)
    """total ranks, nnodes * gpus_per_node (derived)"""
    gpu: GPU
    """the accelerator"""
    host_memory_gib: float | None = _bounded(POSITIVE, default=None)
    """CPU memory of one node in GiB, where offloaded states live; null: not known (not checked)"""


KLMode = Literal["fixed", "adaptive", "ramp"]
KL_MODES: tuple[str, ...] = typing.get_args(KLMode)


@dataclass(kw_only=True, slots=True)
class KLRamp(_Checked):
    """``kl.ramp`` (kl=ramp): a target that rises linearly from start to end."""

    start: float = _bounded(NON_NEGATIVE, default=0.1)
    """target KL per token (nats) at step 0; 0: no KL pressure at the start"""
    end: float = _bounded(NON_NEGATIVE, default=0.3)
    """target KL per token (nats) once the ramp is over"""
    steps: int = _bounded(NON_NEGATIVE, default=200)
    """training steps the ramp takes; 0: the target is ``end`` from the first step"""


@dataclass(kw_only=True, slots=True)
class KLGuard(_Checked):
    """``kl.guard``: the KL guard in the actor's update loop."""

    max_kl: float | None = _bounded(NON_NEGATIVE, default=0.5)
    """policy KL per token (nats) past which a step's remaining PPO mini-batches are skipped; None: no guard;
    0: every step stops after its first mini-batch"""


KLRule = Literal["pi", "proportional"]


@dataclass(kw_only=True, slots=True)
class KLController(_Checked):
    """``kl.controller`` (kl=adaptive|ramp): how the coefficients follow the target."""

    rule: KLRule = "pi"
    """pi: proportional-integral on log(KL / target), both coefficients | proportional: verl's adaptive rule
    (Ziegler et al.) on the loss-side coefficient, verl's own controller on the in-reward one"""
    kp: float = _bounded(NON_NEGATIVE, default=0.5)
    """pi: gain on the change of the error since the last step"""
    ki: float = _bounded(NON_NEGATIVE, default=0.1)
    """pi: gain on the error itself (the integral part: the coefficient keeps moving while KL is off target)"""
    max_step: float = _bounded(POSITIVE, default=0.2)
    """pi: the largest change of log(coefficient) in one step (0.2: at most x1.22 or /1.22 a step)"""
    lookahead: float = _bounded(NON_NEGATIVE, default=1.0)
    """pi: steps over which the KL's last change is extrapolated before it meets the target (the coefficient set
    after a step weighs the next update, whose KL shows a step later); 0: the measured KL"""
    reward_smoothing: float = _bounded(UNIT_INTERVAL, default=0.4)
    """pi, KL in the reward: the weight of the newest step's in-reward KL in the exponential average the in-reward
    coefficient follows (1: the step's own KL). That KL is one batch's mean and noisy; read raw, it drove the
    coefficient by the full max_step nearly every step (x1.82 up, then down, on the tiny demo)"""


@dataclass(kw_only=True, slots=True)
class KL(_Checked):
    """``kl``: KL control (the kl/ group); verl's own KL keys interpolate from it."""

    mode: KLMode = "fixed"
    """fixed: a constant coefficient | adaptive: the coefficient follows ``target`` | ramp: a rising target"""
    target: float | None = _bounded(NON_NEGATIVE, default=None)
    """target KL per token (nats); None: no target (fixed); 0: the controller does not drive the coefficient"""
    ramp: KLRamp = field(default_factory=KLRamp)
    """the ramp's schedule (kl=ramp)"""
    guard: KLGuard = field(default_factory=KLGuard)
    """the KL guard"""
    controller: KLController = field(default_factory=KLController)
    """the rule that moves the coefficients toward the target"""


@dataclass(kw_only=True, slots=True)
class Batching(_Checked):
    """``batching``: fixed micro-batches or token-balanced dynamic ones (factors: dynamic only)."""

    mode: Literal["fixed", "dynamic"] = "fixed"
    """fixed: ppo_micro_batch_size_per_gpu sequences per micro-batch | dynamic: a token budget per GPU"""
    actor_factor: float | None = _bounded(POSITIVE, default=None)
    """actor update token budget per GPU, in sequences of prompt+response; 1: one full sequence"""
    logprob_factor: float | None = _bounded(POSITIVE, default=None)
    """log-prob passes' (rollout, ref) token budget per GPU, in sequences of prompt+response"""
    critic_factor: float | None = _bounded(POSITIVE, default=None)
    """critic's token budget per GPU, in sequences of prompt+response"""


@dataclass(kw_only=True, slots=True)
class Band(_Checked):
    """``monitor.bands.<name>``: one monitoring band over a step's metrics."""

    keys: list[str] = field(default_factory=list)
    """metric names: the first present one is the value; with ``of``: their sum divided by ``of``. Needed when the
    monitor is on; a band with none (a bound a task or cluster option sets under monitor=off) is never judged"""
    low: float | None = None
    """lower edge, in the metric's unit; None: no lower edge"""
    high: float | None = None
    """upper edge, in the metric's unit; None: no upper edge"""
    unstable: Literal["low", "high"] | None = None
    """which side counts toward a rollback (stability=auto); None: neither"""
    of: str | None = None
    """a metric to divide by (a share: 0.1 = 10 % of it); None: the value itself"""
    unit: str = ""
    """unit shown in warnings (e.g. s)"""


@dataclass(kw_only=True, slots=True)
class Monitor(_Checked):
    """``monitor``: the monitoring bands."""

    enabled: bool = False
    """evaluate the bands (driver and trainer); False: no band warnings, no bands.txt"""
    bands: dict[str, Band] = field(default_factory=dict)
    """band name -> band"""

    def __post_init__(self):
        _Checked.__post_init__(self)
        if self.enabled:
            unnamed = [(f"bands.{name}.keys", "missing: name the metrics this band judges")
                       for name, band in self.bands.items() if not band.keys]
            if unnamed:
                raise SchemaError(unnamed)


Degradation = Literal["forward_prefetch_off", "batch_minus_20", "offload_on"]
DEGRADATIONS: tuple[str, ...] = typing.get_args(Degradation)


@dataclass(kw_only=True, slots=True)
class Inject(_Checked):
    """``stability.inject``: fault injection for tests."""

    nan_at_step: int | None = None
    """training step whose policy loss becomes NaN; None: none"""
    kill_at_step: int | None = None
    """training step at which the TaskRunner dies; None: none"""
    attempt: int = _bounded(NON_NEGATIVE, default=0)
    """the attempt nan_at_step and kill_at_step apply to; 0: the first"""
    oom_at_step: int | None = None
    """training step whose actor update raises torch's OutOfMemoryError in the worker (where a real one is raised);
    None: none"""
    oom_attempt: int = _bounded(NON_NEGATIVE, default=0)
    """the attempt oom_at_step applies to"""
    nan_weights_at_step: int | None = None
    """training step after whose actor update one weight tensor of the worker's model becomes NaN; None: none"""
    nan_weights_attempt: int = _bounded(NON_NEGATIVE, default=0)
    """the attempt nan_weights_at_step applies to"""


@dataclass(kw_only=True, slots=True)
class Stability(_Checked):
    """``stability``: rollback on NaN loss, repeated band violations or OOM."""

    mode: Literal["off", "auto"] = "off"
    """off: a failing run stops | auto: restart from the last checkpoint, degraded"""
    max_attempts: int = _bounded(NON_NEGATIVE, default=3)
    """restarts allowed after the first attempt; 0: none"""
    band_violations: int = _bounded(NON_NEGATIVE, default=0)
    """consecutive steps outside an ``unstable`` band that trigger a rollback; 0: bands never roll back"""
    degradations: list[Degradation] = field(default_factory=lambda: list(DEGRADATIONS))
    """applied one per restart, in this order"""
    attempt: int = _bounded(NON_NEGATIVE, default=0)
    """the attempt being run (the supervisor sets it); 0: the first"""
    inject: Inject = field(default_factory=Inject)
    """fault injection (tests)"""


Scalar = str | int | float | bool


@dataclass(kw_only=True, slots=True)
class Launcher(_Checked):
    """``launcher``: how the run reaches Ray."""

    name: Literal["local", "ray"] = "local"
    """local: ray.init in this process | ray: a Ray Job on an existing cluster"""
    address: str | None = None
    """the cluster's dashboard address (launcher=ray), http://HEAD:8265"""
    upload: bool = True
    """True: Ray uploads the launch folder; False: the cluster sees it at the same path"""
    excludes: list[str] = field(default_factory=list)
    """paths left out of the upload"""
    python: str = "python"
    """the Python that runs the job's driver on the cluster"""
    env_vars: dict[str, Scalar] = field(default_factory=dict)
    """more variables for the job's driver"""
    pip: list[str] | str | dict | None = None
    """pip requirements Ray installs for the job (a list, a requirements file, or Ray's pip mapping); None: the
    cluster's environment"""
    follow: bool = True
    """stream the job's log here while it runs"""
    timeout_s: float | None = _bounded(POSITIVE, default=None)
    """seconds to wait for the job, then stop it; None: no limit"""


@dataclass(kw_only=True, slots=True)
class NCCL(_Checked):
    """``nccl``: environment variables for every Ray worker."""

    env: dict[str, Scalar] = field(default_factory=dict)
    """exported in every worker"""
    megatron_env: dict[str, Scalar] = field(default_factory=dict)
    """exported only when a Megatron engine trains"""


@dataclass(kw_only=True, slots=True)
class Run(_Checked):
    """``run``: where the run's folder goes, and whether a plan over the GPU's memory may go on."""

    name: str
    """the recipe's name, a folder level"""
    root: str = "runs"
    """root of all run folders, relative to the launch folder"""
    dir: str
    """this run's folder (Hydra's output folder)"""
    verbose: bool = False
    """show verl's and Ray's own output on the terminal while training (it always goes to the run folder's
    verl.log)"""
    flash_attn_fallbacks: bool = True
    """on a GPU machine without flash-attn: the plugin's padding-free attention, chunked log-probs and value-model
    attention in place of verl's flash-attn paths; false: verl's own code (``KLPPO_FLASH_ATTN_FALLBACKS=0`` in every
    worker)"""
    resume: str | None = None
    """a run folder to continue in place (its last complete checkpoint, same step numbering, metrics appended);
    None: a new run folder"""
    record_dir: str | None = None
    """where this launch's record goes (set when the recipe runs: the run folder, or its resume_<n>/ under
    run.resume)"""
    allow_overcommit: bool = False
    """go on when the planned peak memory per GPU exceeds cluster.gpu.memory_gib: a warning instead of the error
    (recipes.check.fit; the planner's memory model is an estimate, for experts who know better)"""
    gc_threshold: list[int] | None = field(default_factory=lambda: list(gc_threshold.DEFAULT))
    """Python's garbage-collector thresholds (gen0, gen1, gen2, as gc.set_threshold takes them) in the launcher and
    in every Ray worker (recipes/run/gc_threshold.py); null: Python's own (700, 10, 10)"""

    def __post_init__(self):
        _Checked.__post_init__(self)
        value = self.gc_threshold
        if value is not None and (len(value) != 3 or min(value) < 0):
            raise SchemaError([("gc_threshold", "must be 3 integers >= 0 (gen0, gen1, gen2 of Python's "
                                                f"gc.set_threshold) or null, got {_show(value)}")])


PlanFormat = Literal["table", "json"]
PLAN_FORMATS: tuple[str, ...] = typing.get_args(PlanFormat)


@dataclass(kw_only=True, slots=True)
class Plan(_Checked):
    """``plan``: action=plan's output."""

    format: PlanFormat = "table"
    """table: for people | json: for machines"""
    picture: str | None = None
    """a PNG or SVG path for the rank grid; None: no picture"""
    solve: bool = False
    """true: search the layouts (strategy, parallel sizes, offload, token budgets, rollout share) and print the five
    fastest that fit, each with the command that runs it (recipes/check/solve.py); false: plan the configured layout"""


@dataclass(kw_only=True, slots=True)
class Named(_Checked):
    """A group whose option is named: ``strategy.name``, ``rollout.name`` (read by validation and planning)."""

    name: str
    """the option's name"""


@dataclass(kw_only=True, slots=True)
class OptionalName(_Checked):
    """``model.name`` / ``task.name``: the option's name; None: set by path instead."""

    name: str | None = None
    """the option's name"""


@dataclass(kw_only=True, slots=True)
class Overlap(_Checked):
    """``overlap``: FSDP forward prefetch."""

    forward_prefetch: bool = False
    """issue the next layer's all-gather during this layer's forward"""


@dataclass(kw_only=True, slots=True)
class Offload(_Checked):
    """``offload``: CPU offload of the training engine."""

    param: bool = False
    """parameters on the CPU between uses"""
    optimizer: bool = False
    """optimizer state on the CPU"""
    policy: bool = False
    """FSDP2's CPUOffloadPolicy"""


@dataclass(kw_only=True, slots=True)
class Entropy(_Checked):
    """``entropy``: entropy control (verl's policy-loss mode carries it)."""

    mode: str = "none"
    """none | clip_cov | kl_cov"""


@dataclass(kw_only=True, slots=True)
class PackConfig(_Checked):
    """The pack's own keys of one run, typed and checked."""

    layout: Layout
    """training and generation layouts (parallel/)"""
    cluster: Cluster
    """the hardware (cluster/)"""
    run: Run
    """the run's folder"""
    strategy: Named
    """the training backend (strategy/): fsdp | fsdp2 | megatron"""
    rollout: Named
    """the generation engine (rollout/): vllm | sglang | hf"""
    kl: KL = field(default_factory=KL)
    """KL control (kl/)"""
    batching: Batching = field(default_factory=Batching)
    """micro-batching (batching/)"""
    monitor: Monitor = field(default_factory=Monitor)
    """monitoring bands (monitor/)"""
    stability: Stability = field(default_factory=Stability)
    """rollback (stability/)"""
    launcher: Launcher = field(default_factory=Launcher)
    """how the run reaches Ray (launcher/)"""
    nccl: NCCL = field(default_factory=NCCL)
    """NCCL environment (nccl/)"""
    plan: Plan = field(default_factory=Plan)
    """action=plan's output"""
    model: OptionalName = field(default_factory=OptionalName)
    """the policy's shipped architecture (model/)"""
    task: OptionalName = field(default_factory=OptionalName)
    """the task (task/)"""
    overlap: Overlap = field(default_factory=Overlap)
    """FSDP forward prefetch (overlap/)"""
    offload: Offload = field(default_factory=Offload)
    """CPU offload (offload/)"""
    entropy: Entropy = field(default_factory=Entropy)
    """entropy control (entropy/)"""


# -- loading ------------------------------------------------------------------------------------------------------


def _nested(expect: Expect | None) -> tuple[str, type] | None:
    """('one', cls) for a schema-class field, ('map', cls) for dict[str, cls]; None for a leaf."""
    if expect is None:
        return None
    if expect.kind == "dataclass":
        return "one", expect.cls
    if expect.kind == "dict" and expect.args[0] is not None and expect.args[0].kind == "dataclass":
        return "map", expect.args[0].cls
    return None


def _build(cls: type, values, key: str, problems: list[str]):
    """An instance of ``cls`` from a plain mapping, or None; every problem goes to ``problems`` as a full-key
    line."""
    if not isinstance(values, dict):
        problems.append(f"{key}: expected a mapping, got {_show(values)}")
        return None
    kwargs, ok = {}, True
    for item in dataclasses.fields(cls):
        child = f"{key}.{item.name}" if key else item.name
        if item.name not in values or values[item.name] == MISSING_VALUE:
            if item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING:
                problems.append(f"{child}: missing (no default)")
                ok = False
            continue
        value = values[item.name]
        nested = _nested(_expectations(cls)[item.name][0])
        if nested is None:
            kwargs[item.name] = value
            continue
        how, sub = nested
        if how == "one":
            built = _build(sub, value, child, problems)
        elif not isinstance(value, dict):
            problems.append(f"{child}: expected a mapping, got {_show(value)}")
            built = None
        else:
            built = {str(k): _build(sub, v, f"{child}.{k}", problems) for k, v in value.items()}
            if any(v is None for v in built.values()):
                built = None
        if built is None:
            ok = False
        else:
            kwargs[item.name] = built
    leaf_problems = field_problems(cls, {k: v for k, v in kwargs.items() if not _holds_instances(v, None)})
    problems.extend(f"{key + '.' if key else ''}{name}: {message}" for name, message in leaf_problems)
    if not ok or leaf_problems:
        return None
    try:
        return cls(**kwargs)
    except SchemaError as error:  # not reached: the same checks ran above; kept so no traceback can escape
        problems.extend(f"{key + '.' if key else ''}{name}: {message}" for name, message in error.problems)
        return None


def _plain(cfg) -> dict:
    if isinstance(cfg, (DictConfig, ListConfig)):
        return OmegaConf.to_container(cfg, resolve=True)
    return cfg


def check_schema(container: dict) -> tuple[PackConfig | None, list[str]]:
    """The :class:`PackConfig` of a resolved config (plain containers) and the problem lines; never raises."""
    problems: list[str] = []
    return _build(PackConfig, container, "", problems), problems


def load_schema(cfg) -> PackConfig:
    """The pack's keys of ``cfg`` (a DictConfig, resolved here, or plain containers), typed and checked;
    SchemaError with every problem as a full-key line."""
    built, problems = check_schema(_plain(cfg))
    if problems:
        raise SchemaError(problems)
    return built


def load_section(cls: type, node, key: str):
    """One group's instance from its node (None or absent: the defaults); SchemaError naming ``key`` otherwise.
    For code that runs with a partial config (the trainer, a Ray Job's driver)."""
    problems: list[str] = []
    built = _build(cls, {} if node is None else _plain(node), key, problems)
    if problems:
        raise SchemaError(problems)
    return built


# -- the resolved config, and where a value comes from ------------------------------------------------------------


def resolve(cfg: DictConfig) -> tuple[dict, dict[str, str]]:
    """The config as plain containers with every interpolation resolved, and ``key -> problem`` for each value
    that cannot be resolved (that value becomes ``???``). Resolves the whole tree at once when it can."""
    try:
        return OmegaConf.to_container(cfg, resolve=True), {}
    except Exception:  # noqa: BLE001 - find the keys that fail, one by one
        pass
    problems: dict[str, str] = {}

    def walk(node, path: str):
        keys = list(node.keys()) if isinstance(node, DictConfig) else range(len(node))
        out: dict | list = {} if isinstance(node, DictConfig) else []
        for k in keys:
            child = f"{path}.{k}" if path else str(k)
            try:
                value = node[k]
            except Exception as error:  # noqa: BLE001 - a missing value or a failing interpolation
                text = str(error).splitlines()[0] if str(error) else type(error).__name__
                if "Missing mandatory value" not in text:
                    problems[child] = _unresolved_line(cfg, child, text)
                value = MISSING_VALUE
            if isinstance(value, (DictConfig, ListConfig)):
                value = walk(value, child)
            if isinstance(out, dict):
                out[str(k)] = value
            else:
                out.append(value)
        return out

    return walk(cfg, ""), problems


def _unresolved_line(cfg: DictConfig, key: str, error: str) -> str:
    """The problem of a value whose interpolation or resolver fails: where the error quotes a value that exactly one
    literal key of the config holds (``max_num_seqs=not-a-value``, read by ``int()`` inside the resolver of the
    CUDA-graph sizes), that key, as typed; else the value that cannot be computed."""
    quoted = re.findall(r"'([^']+)'", error)
    holders = _literal_keys(cfg, quoted[-1]) if quoted else []
    if len(holders) == 1:
        return f"{holders[0]}: {quoted[-1]!r} is not a value {key} can be computed from ({error})"
    return f"{key}: cannot resolve: {error}"


def _literal_keys(node, value: str, path: str = "") -> list[str]:
    """The keys under ``node`` whose own (not interpolated) value is ``value``."""
    out: list[str] = []
    for k in (node.keys() if isinstance(node, DictConfig) else range(len(node))):
        child = f"{path}.{k}" if path else str(k)
        if OmegaConf.is_interpolation(node, k):
            continue
        item = node._get_node(k)
        if isinstance(item, (DictConfig, ListConfig)):
            out += _literal_keys(item, value, child)
        elif not OmegaConf.is_missing(node, k) and str(item._value()) == value:
            out.append(child)
    return out


_REFERENCE = re.compile(r"\$\{(\.*)([A-Za-z_][\w.]*)\}")
_SELECTED = re.compile(r"\$\{oc\.select:\s*([A-Za-z_][\w.]*)")


def references(cfg: DictConfig, key: str) -> list[str]:
    """The keys ``key``'s value is computed from: every ``${other.key}`` (relative ones made absolute) and
    ``${oc.select:other.key,...}`` in its interpolation, also inside a resolver's arguments; [] for a literal."""
    parent, _, leaf = key.rpartition(".")
    try:
        node = OmegaConf.select(cfg, parent, throw_on_resolution_failure=False) if parent else cfg
        if not isinstance(node, DictConfig) or leaf not in node or not OmegaConf.is_interpolation(node, leaf):
            return []
        raw = str(node._get_node(leaf)._value())
    except Exception:  # noqa: BLE001 - a key that is not a plain path: nothing to follow
        return []
    base = parent.split(".") if parent else []
    out = [match for match in _SELECTED.findall(raw)]
    for dots, target in _REFERENCE.findall(raw):
        if not dots:
            out.append(target)
        elif len(dots) - 1 <= len(base):
            out.append(".".join([*base[: len(base) - (len(dots) - 1)], target]))
    return out


def depends_on(cfg: DictConfig, key: str, others: set[str], limit: int = 64) -> bool:
    """Whether ``key``'s value is computed (through any chain of interpolations) from one of ``others``."""
    seen, todo = {key}, [key]
    while todo and len(seen) < limit:
        for ref in references(cfg, todo.pop()):
            if ref in others and ref != key:
                return True
            if ref not in seen:
                seen.add(ref)
                todo.append(ref)
    return False
