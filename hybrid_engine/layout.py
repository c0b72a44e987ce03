"""Parallel layouts of the actor: its training world (`layout.train`) and its generation world (`layout.infer`).

One validated object per world, in the spirit of torchtitan's ``ParallelDims``: the user writes degrees, ``-1`` for
``dp`` means "the ranks left over", and every error shows the arithmetic, e.g.::

    layout.train: dp(1)*tp(8)*pp(4)*cp(1)=32 != world_size 16 (cluster.nnodes 2 * cluster.gpus_per_node 8)

Rank order. An order string lists mesh axes fastest first. The Megatron order ``tp-cp-ep-dp-pp`` puts ``tp``
fastest, so with tp=8, pp=4, dp=1 the rank of (pp p_i, tp t_i) is ``8*p_i + t_i``. Expert parallelism does not add
ranks: as in Megatron-core, ``ep`` is carved out of the ``dp*cp`` ranks of one pipeline stage (the "ep" entry of the
order string only tells where the expert grid puts it), so ``world = dp*tp*pp*cp`` and ``ep`` must divide ``dp*cp``.
The FSDP order ``cp-dp-tp-pp`` follows verl's FSDP workers, whose device mesh is ``("dp", "sp")`` with the Ulysses
(context) axis fastest.

Nothing here imports torch: the recipes' config validation imports this module in the driver before anything starts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = [
    "FSDP_ORDER",
    "INFER_ORDER",
    "MEGATRON_ORDER",
    "InferLayout",
    "LayoutError",
    "TrainLayout",
    "check_compatible",
    "collect_layout_errors",
    "hybridflow_problems",
]

MEGATRON_ORDER = "tp-cp-ep-dp-pp"
"""Megatron-core's default rank order (fastest axis first)."""

FSDP_ORDER = "cp-dp-tp-pp"
"""verl FSDP workers: mesh ("dp", "sp") with the Ulysses axis fastest; tp and pp are 1 there."""

INFER_ORDER = "tp-pp-dp"
"""A standalone generation engine (vLLM / SGLang): TP ranks are consecutive, then pipeline stages, then replicas."""

_DENSE_AXES = ("tp", "cp", "dp", "pp")


class LayoutError(ValueError):
    """A layout that cannot run. ``problems`` holds one line per problem; ``str()`` joins them."""

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _degree_problems(key: str, degrees: dict[str, object], leftover: str | None) -> list[str]:
    """Each degree must be a positive int; the ``leftover`` axis may also be -1."""
    problems = []
    for name, value in degrees.items():
        if not _is_int(value):
            problems.append(f"{key}.{name}: must be an integer, got {value!r}")
        elif value == -1 and name == leftover:
            continue
        elif value < 1:
            hint = " (-1 means the ranks left over)" if name == leftover else ""
            problems.append(f"{key}.{name}: must be a positive integer{hint}, got {value}")
    return problems


def _world_suffix(world_size: int, world_desc: str | None) -> str:
    return f"world_size {world_size}" + (f" ({world_desc})" if world_desc else "")


def _parse_order(order: str, required: tuple[str, ...], allowed: tuple[str, ...], key: str) -> list[str]:
    axes = order.split("-")
    problems = []
    if len(set(axes)) != len(axes) or not set(axes) <= set(allowed) or not set(required) <= set(axes):
        problems.append(
            f"{key}.order: {order!r} must list each of {'-'.join(required)} once "
            f"(optionally {'/'.join(sorted(set(allowed) - set(required)))}), fastest axis first"
        )
    return problems


def _resolve_leftover(key: str, others: dict[str, int], world_size: int, world_desc: str | None) -> int:
    """The degree of the leftover axis: world_size divided by the product of the others, or a LayoutError."""
    product = 1
    for value in others.values():
        product *= value
    terms = "*".join(f"{name}({value})" for name, value in others.items())
    if world_size < 1:
        raise LayoutError(f"{key}: world_size must be positive, got {world_size}")
    if world_size % product:
        raise LayoutError(
            f"{key}: dp=-1 needs {terms}={product} to divide {_world_suffix(world_size, world_desc)}"
            f" (remainder {world_size % product})"
        )
    return world_size // product


def _train_ep_problems(key: str, dp: int, cp: int, ep: int, tp: int = 1, etp: int | None = None) -> list[str]:
    """Megatron-core's rule: the expert layers' ep * etp ranks tile the dp * cp * tp ranks of a stage. With etp =
    tp (its default) that is ep | dp * cp; MoE parallel folding (etp < tp) lets experts span tensor ranks too."""
    if etp is None or etp == tp:
        if (dp * cp) % ep:
            return [
                f"{key}.ep: ep({ep}) must divide dp({dp})*cp({cp})={dp * cp}"
                " (experts are sharded over the data-parallel ranks of a stage)"
            ]
        return []
    if (dp * cp * tp) % (ep * etp):
        return [
            f"{key}.ep: ep({ep})*etp({etp})={ep * etp} must divide dp({dp})*cp({cp})*tp({tp})={dp * cp * tp}"
            " (Megatron's expert layers tile the ranks of a stage)"
        ]
    return []


def _infer_ep_problems(key: str, tp: int, dp: int, ep: int) -> list[str]:
    if (tp * dp) % ep:
        return [
            f"{key}.ep: ep({ep}) must divide tp({tp})*dp({dp})={tp * dp}"
            " (experts are sharded over the tensor- and data-parallel ranks of a stage)"
        ]
    return []


def _coords_from_rank(rank: int, order: list[str], sizes: dict[str, int]) -> dict[str, int]:
    coords = {}
    for axis in order:
        coords[axis] = rank % sizes[axis]
        rank //= sizes[axis]
    return coords


def _rank_from_coords(coords: dict[str, int], order: list[str], sizes: dict[str, int], key: str) -> int:
    unknown = set(coords) - set(order)
    if unknown:
        raise LayoutError(f"{key}: unknown axes {sorted(unknown)}; axes are {order}")
    rank, stride = 0, 1
    for axis in order:
        value = coords.get(axis, 0)
        if not 0 <= value < sizes[axis]:
            raise LayoutError(f"{key}: {axis} coordinate {value} outside [0, {sizes[axis]})")
        rank += value * stride
        stride *= sizes[axis]
    return rank


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainLayout:
    """The actor's training world: ``world = dp * tp * pp * cp``; ``ep`` is carved out of ``dp * cp``."""

    dp: int = -1
    """Data-parallel replicas (FSDP: the sharding group). 1 = no data parallelism; -1 = the ranks left over."""
    tp: int = 1
    """Tensor-parallel shards of each layer (Megatron column/row split). 1 = no tensor parallelism."""
    pp: int = 1
    """Pipeline stages (consecutive blocks of layers). 1 = the whole model on every rank."""
    cp: int = 1
    """Context-parallel shards of the sequence (Megatron CP, verl Ulysses sequence parallel). 1 = off."""
    ep: int = 1
    """Expert-parallel shards of MoE experts, taken from the dp*cp ranks of a stage. 1 = every rank holds all."""
    etp: int | None = None
    """Megatron's expert tensor parallel size (MoE parallel folding); None = tp, Megatron's default. With etp < tp
    the experts span tensor ranks too (ep * etp | dp * cp * tp); the pack's resharder then leaves the weight sync
    to verl."""
    order: str = MEGATRON_ORDER
    """Rank order, fastest axis first: ``tp-cp-ep-dp-pp`` (Megatron) or ``cp-dp-tp-pp`` (verl FSDP)."""

    def __post_init__(self):
        problems = self.problems()
        if problems:
            raise LayoutError(problems)

    def problems(self, key: str = "layout.train") -> list[str]:
        """Problems that need no world size: degrees, order string, ep vs dp*cp."""
        problems = _degree_problems(key, self._degrees(), leftover="dp")
        if not isinstance(self.order, str):
            return problems + [f"{key}.order: must be a string, got {self.order!r}"]
        problems += _parse_order(self.order, _DENSE_AXES, _DENSE_AXES + ("ep",), key)
        if self.etp is not None and (not _is_int(self.etp) or self.etp < 1):
            problems.append(f"{key}.etp: must be a positive integer or null (= tp), got {self.etp!r}")
        elif not problems and self.dp != -1:
            problems += _train_ep_problems(key, self.dp, self.cp, self.ep, self.tp, self.etp)
        return problems

    def _degrees(self) -> dict[str, object]:
        return {"dp": self.dp, "tp": self.tp, "pp": self.pp, "cp": self.cp, "ep": self.ep}

    @property
    def resolved(self) -> bool:
        """True once dp is a number (not -1)."""
        return self.dp != -1

    def resolve(self, world_size: int, *, world_desc: str | None = None, key: str = "layout.train") -> TrainLayout:
        """This layout with dp=-1 filled in, checked against ``world_size`` (``world_desc`` explains it)."""
        if self.dp == -1:
            dp = _resolve_leftover(key, {"tp": self.tp, "pp": self.pp, "cp": self.cp}, world_size, world_desc)
            problems = _train_ep_problems(key, dp, self.cp, self.ep, self.tp, self.etp)
            if problems:
                raise LayoutError(problems)
            resolved = replace(self, dp=dp)
        else:
            resolved = self
        product = resolved.dp * resolved.tp * resolved.pp * resolved.cp
        if product != world_size:
            raise LayoutError(
                f"{key}: dp({resolved.dp})*tp({resolved.tp})*pp({resolved.pp})*cp({resolved.cp})={product}"
                f" != {_world_suffix(world_size, world_desc)}"
            )
        return resolved

    @property
    def world_size(self) -> int:
        """dp * tp * pp * cp (needs a resolved dp)."""
        self._require_resolved()
        return self.dp * self.tp * self.pp * self.cp

    @property
    def axes(self) -> list[str]:
        """The dense mesh axes in rank order, fastest first (``ep`` is not one: it lives inside dp*cp)."""
        return [axis for axis in self.order.split("-") if axis != "ep"]

    def _sizes(self) -> dict[str, int]:
        return {"tp": self.tp, "cp": self.cp, "dp": self.dp, "pp": self.pp}

    def _require_resolved(self) -> None:
        if self.dp == -1:
            raise LayoutError("layout.train: dp=-1 is not resolved yet; call resolve(world_size) first")

    def coords(self, rank: int) -> dict[str, int]:
        """Coordinates of ``rank``: tp, cp, dp, pp, plus ep and edp (expert-data-parallel) from Megatron's expert grid.

        The expert grid numbers the dp*cp ranks of one (pp, tp) position as ``cp_i + cp*dp_i`` and splits that
        index into ``ep_i + ep*edp_i`` (ep fastest), like Megatron-core with expert TP equal to tp.
        """
        self._require_resolved()
        if not 0 <= rank < self.world_size:
            raise LayoutError(f"layout.train: rank {rank} outside [0, {self.world_size})")
        coords = _coords_from_rank(rank, self.axes, self._sizes())
        data_index = coords["cp"] + self.cp * coords["dp"]
        coords["ep"] = data_index % self.ep
        coords["edp"] = data_index // self.ep
        return {axis: coords[axis] for axis in ("tp", "cp", "ep", "edp", "dp", "pp")}

    def rank_of(self, **coords: int) -> int:
        """The rank at ``tp=.., cp=.., dp=.., pp=..`` (axes left out are 0)."""
        self._require_resolved()
        return _rank_from_coords(coords, self.axes, self._sizes(), "layout.train")

    def to_dict(self) -> dict:
        return {"dp": self.dp, "tp": self.tp, "pp": self.pp, "cp": self.cp, "ep": self.ep, "order": self.order}


@dataclass(frozen=True, kw_only=True, slots=True)
class InferLayout:
    """The generation engine's world: ``world = tp * pp * dp``; ``ep`` is carved out of ``tp * dp`` (as vLLM does)."""

    tp: int = 1
    """Tensor-parallel shards of the generation engine (vLLM tensor_parallel_size). 1 = no TP."""
    pp: int = 1
    """Pipeline stages of the generation engine. 1 = each engine holds all layers."""
    dp: int = -1
    """Generation engines (replicas) side by side. -1 = the ranks left over."""
    ep: int = 1
    """Expert-parallel shards of MoE experts over the tp*dp ranks of a stage. 1 = off."""
    order: str = INFER_ORDER
    """Rank order of a standalone engine, fastest first. The 3D-HybridEngine maps ranks itself (see groups.py)."""

    def __post_init__(self):
        problems = self.problems()
        if problems:
            raise LayoutError(problems)

    def problems(self, key: str = "layout.infer") -> list[str]:
        problems = _degree_problems(key, {"tp": self.tp, "pp": self.pp, "dp": self.dp, "ep": self.ep}, "dp")
        if not isinstance(self.order, str):
            return problems + [f"{key}.order: must be a string, got {self.order!r}"]
        problems += _parse_order(self.order, ("tp", "pp", "dp"), ("tp", "pp", "dp"), key)
        if not problems and self.dp != -1:
            problems += _infer_ep_problems(key, self.tp, self.dp, self.ep)
        return problems

    @property
    def resolved(self) -> bool:
        return self.dp != -1

    def resolve(self, world_size: int, *, world_desc: str | None = None, key: str = "layout.infer") -> InferLayout:
        """This layout with dp=-1 filled in, checked against ``world_size``."""
        if self.dp == -1:
            dp = _resolve_leftover(key, {"tp": self.tp, "pp": self.pp}, world_size, world_desc)
            problems = _infer_ep_problems(key, self.tp, dp, self.ep)
            if problems:
                raise LayoutError(problems)
            resolved = replace(self, dp=dp)
        else:
            resolved = self
        product = resolved.tp * resolved.pp * resolved.dp
        if product != world_size:
            raise LayoutError(
                f"{key}: tp({resolved.tp})*pp({resolved.pp})*dp({resolved.dp})={product}"
                f" != {_world_suffix(world_size, world_desc)}"
            )
        return resolved

    @property
    def world_size(self) -> int:
        if self.dp == -1:
            raise LayoutError("layout.infer: dp=-1 is not resolved yet; call resolve(world_size) first")
        return self.tp * self.pp * self.dp

    @property
    def engine_size(self) -> int:
        """GPUs of one generation engine: tp * pp."""
        return self.tp * self.pp

    @property
    def axes(self) -> list[str]:
        return self.order.split("-")

    def _sizes(self) -> dict[str, int]:
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp}

    def coords(self, rank: int) -> dict[str, int]:
        """Coordinates of ``rank`` in a standalone engine layout: tp, pp, dp."""
        if not 0 <= rank < self.world_size:
            raise LayoutError(f"layout.infer: rank {rank} outside [0, {self.world_size})")
        return _coords_from_rank(rank, self.axes, self._sizes())

    def rank_of(self, **coords: int) -> int:
        self.world_size  # noqa: B018  (raises when unresolved)
        return _rank_from_coords(coords, self.axes, self._sizes(), "layout.infer")

    def to_dict(self) -> dict:
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "ep": self.ep, "order": self.order}


def check_compatible(
    train: TrainLayout,
    infer: InferLayout,
    *,
    train_key: str = "layout.train",
    infer_key: str = "layout.infer",
    gpus_per_node: int | None = None,
) -> list[str]:
    """Why verl 0.9.1 cannot run generation ``infer`` beside training ``train``; [] when it can.

    verl's rule (``ActorRolloutRefWorker`` builds the rollout mesh and asserts the world divides into engines,
    ``RolloutReplica`` places the engines): the generation world is the training world (so every engine's tp*pp
    ranks divide it: ``InferLayout.resolve`` says so for dp=-1, the world comparison below for a given dp), and an
    engine larger than a node takes whole nodes. Nothing ties infer.tp to train.tp: verl's weight sync gathers the
    whole model on every rank (its Megatron "diff TP" example trains tp2 pp2 and generates with tp4). Whether the
    pack's resharder can take the layout instead is ``hybridflow_problems``. (``RolloutConfig`` adds its own rules,
    e.g. no rollout pp > 1 for vLLM/SGLang; validation runs verl's conversion for those.)
    """
    problems = []
    both_resolved = train.resolved and infer.resolved
    if both_resolved and infer.world_size != train.world_size:
        problems.append(
            f"{infer_key}: tp({infer.tp})*pp({infer.pp})*dp({infer.dp})={infer.world_size} != "
            f"{train_key} world dp({train.dp})*tp({train.tp})*pp({train.pp})*cp({train.cp})={train.world_size}"
            " (generation runs on the training GPUs)"
        )
    engine = infer.tp * infer.pp
    if gpus_per_node and engine > gpus_per_node and engine % gpus_per_node:
        problems.append(
            f"{infer_key}: an engine of tp({infer.tp})*pp({infer.pp})={engine} GPUs spans nodes of {gpus_per_node}"
            f" GPUs and must take whole nodes ({engine} % {gpus_per_node} = {engine % gpus_per_node})"
        )
    return problems


def hybridflow_problems(
    train: TrainLayout, infer: InferLayout, *, train_key: str = "layout.train", infer_key: str = "layout.infer"
) -> list[str]:
    """Why the pack's zero-redundancy resharder (HybridFlow's micro-DP groups) cannot take this pair; [] when it can.

    Model-parallel training (tp or pp > 1) needs infer.tp | train.tp, infer.pp | train.pp and infer.ep | train.ep:
    each generation shard is then the union of whole training shards. Pure data-parallel training (tp = pp = 1,
    FSDP) reshards Shard(0) to any generation TP that ``check_compatible`` accepts. Where this returns problems,
    verl's own weight sync (the whole model gathered on every rank) still runs the layout.
    """
    problems = []
    if train.tp == 1 and train.pp == 1:
        return problems
    if train.etp is not None and train.etp != train.tp and train.ep > 1:
        problems.append(
            f"{train_key}.etp: experts split over etp({train.etp}) != tp({train.tp}) tensor ranks"
            " (MoE parallel folding); the resharder maps experts over data-parallel ranks only"
        )
    if train.tp % infer.tp:
        problems.append(
            f"{infer_key}.tp: infer.tp({infer.tp}) must divide {train_key}.tp({train.tp})"
            f" ({train.tp} % {infer.tp} = {train.tp % infer.tp})"
        )
    if train.pp % infer.pp:
        problems.append(
            f"{infer_key}.pp: infer.pp({infer.pp}) must divide {train_key}.pp({train.pp})"
            f" ({train.pp} % {infer.pp} = {train.pp % infer.pp})"
        )
    if infer.ep > 1 and train.ep % infer.ep:
        problems.append(
            f"{infer_key}.ep: infer.ep({infer.ep}) must divide {train_key}.ep({train.ep})"
            f" ({train.ep} % {infer.ep} = {train.ep % infer.ep})"
        )
    return problems


_TRAIN_KEYS = ("dp", "tp", "pp", "cp", "ep", "etp", "order")
_INFER_KEYS = ("tp", "pp", "dp", "ep", "order")


def _build(cls, values: dict, allowed: tuple[str, ...], key: str, problems: list[str]):
    if values is None:
        values = {}
    if not hasattr(values, "items"):
        problems.append(f"{key}: must be a mapping of {'/'.join(allowed)}, got {type(values).__name__}")
        return None
    values = dict(values)
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        problems.append(f"{key}: unknown keys {unknown}; allowed: {list(allowed)}")
    try:
        return cls(**{name: value for name, value in values.items() if name in allowed})
    except LayoutError as error:
        problems.extend(p if p.startswith(key) else f"{key}: {p}" for p in error.problems)
    return None


def collect_layout_errors(
    train: dict, infer: dict, world_size: int, world_desc: str | None = None, *, gpus_per_node: int | None = None
) -> tuple[TrainLayout | None, InferLayout | None, list[str]]:
    """Build, resolve and cross-check both layouts (``check_compatible``: what verl runs); never raises. Returns
    (train, infer, problems). ``gpus_per_node``, when given, also checks that an engine larger than a node takes
    whole nodes.

    A layout is None when it could not be built or resolved; every problem names its full key.
    """
    problems: list[str] = []
    train_layout = _build(TrainLayout, train, _TRAIN_KEYS, "layout.train", problems)
    infer_layout = _build(InferLayout, infer, _INFER_KEYS, "layout.infer", problems)
    if not _is_int(world_size) or world_size < 1:
        problems.append(f"world_size: must be a positive integer, got {world_size!r}")
        return None, None, problems
    resolved = []
    for layout, key in ((train_layout, "layout.train"), (infer_layout, "layout.infer")):
        try:
            resolved.append(None if layout is None else layout.resolve(world_size, world_desc=world_desc, key=key))
        except LayoutError as error:
            problems.extend(error.problems)
            resolved.append(None)
    if train_layout is not None and infer_layout is not None:
        # with whatever resolved: tp/pp/ep divisibility is still worth reporting when a world size is off
        problems.extend(
            check_compatible(resolved[0] or train_layout, resolved[1] or infer_layout, gpus_per_node=gpus_per_node)
        )
    return resolved[0], resolved[1], problems
