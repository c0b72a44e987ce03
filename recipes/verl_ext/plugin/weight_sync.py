"""The actor -> hf rollout weight sync through the resharding executor (``hybrid_engine.reshard``).

verl 0.9.1's colocated sync (``ActorRolloutRefWorker.update_weights``, mode ``naive``) asks the FSDP engine for
``get_per_tensor_param()``: a generator in which **every** rank calls ``full_tensor()`` on every parameter, so every
rank receives the whole model, although only the first rank of each rollout replica hands it to a server. Here:

- :func:`export_sharded` (installed on ``FSDPEngine.get_per_tensor_param`` by ``patches``, and only in a process
  that hosts the ``hf`` rollout) returns :class:`~hybrid_engine.reshard.ShardedWeights`: verl's generator, untouched
  and not started, with the FSDP2 state dict (DTensor references, nothing copied) beside it. Anything that iterates
  it gets verl's own stream.
- :func:`export_megatron_sharded` (on ``MegatronEngine.get_per_tensor_param``, the same way) returns
  :class:`~hybrid_engine.reshard.megatron.MegatronShardedWeights`: verl's mbridge ``export_weights`` generator, not
  started, with the GPTModel's own parameters (Megatron names, fused ``linear_qkv`` / ``linear_fc1``, nothing
  copied) and the rank's (tp, pp) place beside it; the stream de-interleaves q/k/v and splits gate/up on the feeders.
- :func:`open_weight_stream` (called by the hf rollout adapter on every rank) streams it through
  :func:`~hybrid_engine.reshard.rollout_weight_stream`: each rank sends its rows to the feeders, so a feeder receives
  the model minus its own rows and every other rank receives nothing. Where the executor cannot take the state dict
  (LoRA, QAT, HSDP's 2-D mesh, MoE, a tensor the model spec does not know) it says why once and falls back to
  verl's stream; the refusal is decided before any collective, alike on every rank.
- :class:`SyncRecord`: what one rank received in one sync, measured at the collectives, beside the planner's bytes
  and what verl's ``full_tensor()`` path receives on that rank. With ``KLPPO_SYNC_LOG`` set (the recipes set
  it to ``<run dir>/weight_sync.jsonl``) each rank appends one JSON line per sync.
- The sync check (every sync): :func:`training_checksums` of the actor's weights on every rank (on device, one
  all-reduce), NaN/Inf there stops the sync (``StabilityFault[nan_weights]``); the feeder compares them with the
  checksums the rollout server reads back from its model after loading; the outcome is in the record
  (``extra.checksum``) and a mismatch stops the run naming the tensor (:class:`SyncCheckFailed`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from recipes import envvars

__all__ = [
    "SYNC_LOG_ENV",
    "SyncCheckFailed",
    "SyncRecord",
    "WeightSync",
    "append_record",
    "enable_sharded_export",
    "export_sharded",
    "open_weight_stream",
    "read_sync_log",
    "check_generation_side",
    "check_training_side",
    "training_checksums",
]

logger = logging.getLogger(__name__)

SYNC_LOG_ENV = envvars.SYNC_LOG
"""Path of a JSON-lines file each rank appends its :class:`SyncRecord` to after every weight sync."""

_SHARDED_EXPORT = False
_WARNED: set[str] = set()


def enable_sharded_export() -> None:
    """Called by the hf rollout adapter: from now on this process's FSDP and Megatron engines export sharded weights."""
    global _SHARDED_EXPORT
    _SHARDED_EXPORT = True


def export_sharded(engine, per_tensor_param):
    """Wrap verl's ``per_tensor_param`` with the engine's FSDP2 state dict, or return it as it is.

    Wrapped only for a plain FSDP2 module: no LoRA (its adapter path is verl's), no QAT (the rollout must get the
    quantised tensors) and no parameter offload to the host (the executor moves device tensors in place)."""
    # lazy: ~50 ms; train.py imports this module for read_sync_log, only an FSDP weight export needs the resharder
    from hybrid_engine.reshard import ShardedWeights

    if not _SHARDED_EXPORT:
        return per_tensor_param
    # lazy: a second to import; train.py imports this module for read_sync_log, only an hf rollout's export needs it
    from verl.utils.fsdp_utils import fsdp_version
    from verl.utils.model import convert_weight_keys  # lazy: a second to import, only an hf rollout's export needs it

    module = engine.module
    inner = getattr(module, "_fsdp_wrapped_module", module)
    reason = None
    if fsdp_version(module) != 2:
        reason = f"FSDP{fsdp_version(module)} (the executor takes FSDP2 DTensors)"
    elif hasattr(inner, "peft_config"):
        reason = "LoRA"
    elif getattr(engine, "_qat_enabled", False):
        reason = "QAT"
    elif getattr(engine, "_is_offload_param", False) and torch.device(_device_of(module)).type != "cpu":
        reason = "parameter offload"
    if reason is not None:
        _log_fallback_once(reason)
        return per_tensor_param
    state_dict = convert_weight_keys(module.state_dict(), inner)
    return ShardedWeights(state_dict, fallback=per_tensor_param, hf_config=engine.model_config.hf_config.to_dict())


def export_megatron_sharded(engine, per_tensor_param):
    """Wrap the Megatron engine's ``per_tensor_param`` (mbridge's ``export_weights``) with the GPTModel's own
    parameters (Megatron names, nothing copied) and this rank's (tp, pp) place, or return it as it is.

    Wrapped only for one model chunk (no virtual pipeline), no LoRA, no QAT, no parameter offload to the host, no
    context or expert parallelism; the parameters must be the Megatron layout of the model spec
    (``hybrid_engine.reshard.megatron``). With tp*pp > 1 the ranks agree (one all-reduce) before any is wrapped."""
    if not _SHARDED_EXPORT:
        return per_tensor_param
    # lazy: megatron-core, present only where verl's Megatron engine runs; only its weight export needs it
    from megatron.core import parallel_state as mpu

    # lazy: ~50 ms; train.py imports this module for read_sync_log, only a Megatron weight export needs the resharder
    from hybrid_engine.reshard.megatron import MegatronRank, MegatronShardedWeights

    reason = _megatron_refusal(engine, mpu)
    weights = None
    if reason is None:
        where = MegatronRank(
            tp=mpu.get_tensor_model_parallel_world_size(),
            tp_rank=mpu.get_tensor_model_parallel_rank(),
            pp=mpu.get_pipeline_model_parallel_world_size(),
            stage=mpu.get_pipeline_model_parallel_rank(),
        )
        state_dict = dict(_unwrap_gpt_model(engine.module[0]).named_parameters())
        hf_config = engine.model_config.hf_config.to_dict()
        weights = MegatronShardedWeights(state_dict, per_tensor_param, hf_config, where)
        reason = _layout_refusal(weights)
        if where.tp * where.pp > 1 and not _all_ranks_agree(reason is None, _device_of(engine.module[0])):
            reason = reason or "another rank's parameters are not the resharder's Megatron layout"
    if reason is not None:
        _log_fallback_once(reason)
        return per_tensor_param
    return weights


def _megatron_refusal(engine, mpu) -> str | None:
    """Why the Megatron engine's export stays verl's (decided from the config: alike on every rank), or None."""
    if len(engine.module) != 1:
        return f"virtual pipeline ({len(engine.module)} model chunks)"
    if getattr(engine, "peft_cls", None) is not None:
        return "LoRA"
    if getattr(engine, "_qat_enabled", False):
        return "QAT"
    if getattr(engine, "_is_offload_param", False) and torch.device(_device_of(engine.module[0])).type != "cpu":
        return "parameter offload"
    if mpu.get_context_parallel_world_size() > 1:
        return "context parallelism"
    if mpu.get_expert_model_parallel_world_size() > 1 or mpu.get_expert_tensor_parallel_world_size() > 1:
        return "expert parallelism"
    return None


def _unwrap_gpt_model(module):
    """The GPTModel inside verl's wrappers (megatron-core's DistributedDataParallel, Float16Module: ``.module``)."""
    while hasattr(module, "module"):
        module = module.module
    return module


def _layout_refusal(weights) -> str | None:
    """Why the resharder cannot take these parameters (this rank's view), or None."""
    # lazy: as export_megatron_sharded
    from hybrid_engine.reshard.executor import spec_of

    try:
        weights.shards(spec_of(weights.hf_config))
    except (KeyError, NotImplementedError, TypeError, ValueError) as error:
        return f"{type(error).__name__}: {error}"
    return None


def _all_ranks_agree(ok: bool, device: str) -> bool:
    """True when ``ok`` on every rank (one all-reduce over the default group, on the parameters' device)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return ok
    flag = torch.tensor([int(ok)], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def _device_of(module) -> str:
    for parameter in module.parameters():
        return str(parameter.device)
    return "cpu"


def warn_once(message: str) -> None:
    """A warning the first time this process meets ``message``: a fallback or a check that cannot run repeats every
    sync, and one line says it."""
    if message not in _WARNED:
        _WARNED.add(message)
        logger.warning("%s", message)


def _log_fallback_once(reason: str, consequence: str = "verl's own export is used (every rank receives the model)"):
    warn_once(f"weight sync: {reason}; {consequence}")


@dataclass
class SyncRecord:
    """One rank's share of one weight sync. Bytes are payload bytes of the tensors' dtype."""

    global_steps: int | None
    rank: int
    world_size: int
    rollout_world_size: int
    feeder: bool
    scheme: str  # "gather_to_feeders" (the executor) or "verl_full_tensor" (verl's path)
    tensors: int = 0  # tensors this rank handed on (a feeder: the whole model; others: 0)
    received_bytes: int | None = None  # measured at the collectives (None on verl's path: not instrumented)
    planned_bytes: int | None = None  # the planner's bytes for this rank
    full_tensor_bytes: int = 0  # what verl's full_tensor() path receives on this rank: the model minus own rows
    model_bytes: int = 0
    seconds: float = 0.0
    fallback_reason: str | None = None
    extra: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def _megatron_bytes(weights) -> tuple[int, int]:
    """(model bytes, bytes verl's mbridge export receives on this rank: the model minus this rank's own shard)."""
    # lazy: as export_megatron_sharded
    from hybrid_engine.reshard.executor import spec_of
    from hybrid_engine.reshard.shards import box_numel  # lazy: as the line above

    spec = spec_of(weights.hf_config)
    shards = weights.shards(spec)
    size = shards.dtype.itemsize
    own = sum(box_numel(segment.box) for segments in shards.segments.values() for segment in segments)
    return spec.numel * size, (spec.numel - own) * size


def _dtensor_bytes(state_dict) -> tuple[int, int]:
    """(model bytes, bytes verl's ``full_tensor()`` path receives on this rank) over a state dict of DTensors.

    The model counts a tied tensor once; verl's path gathers every state-dict entry, a tied lm_head included."""
    total = lacking = 0
    seen: set[int] = set()
    for value in state_dict.values():
        size = value.numel() * value.element_size()
        local = value.to_local() if isinstance(value, DTensor) else value
        if local.data_ptr() not in seen or local.numel() == 0:
            seen.add(local.data_ptr())
            total += size
        if isinstance(value, DTensor):
            lacking += size - local.numel() * value.element_size()
    return total, lacking


@dataclass
class WeightSync:
    """One sync in progress: the ``stream`` every rank must drain, then :meth:`finish`."""

    stream: Iterator[tuple[str, torch.Tensor]]
    record: SyncRecord
    started: float
    stats_out: list = field(default_factory=list)  # the resharder's ReshardStats, once the stream is drained

    def finish(self, tensors: int, seconds: float | None = None) -> SyncRecord:
        """Fill in what the drained stream measured (``seconds``: the sync's time, measured by the caller when more
        came after it); append the record to ``$KLPPO_SYNC_LOG`` if set."""
        record = self.record
        record.seconds = time.perf_counter() - self.started if seconds is None else seconds
        record.tensors = tensors
        if self.stats_out:
            measured = self.stats_out[0]
            record.received_bytes = measured.received_bytes
            record.planned_bytes = measured.planned.received if measured.planned is not None else None
            record.extra["peak_extra_bytes"] = measured.peak_extra_bytes
            record.extra["buckets"] = measured.buckets
        append_record(record)
        return record


def append_record(record: SyncRecord) -> None:
    """Append ``record`` to ``$KLPPO_SYNC_LOG`` where it is set."""
    path = envvars.getenv(SYNC_LOG_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as log:  # one short line per write: appends do not interleave
            log.write(record.to_json() + "\n")


def open_weight_stream(
    weights,
    *,
    global_steps: int | None,
    rollout_world_size: int,
    feeder: bool,
    bucket_bytes: int | None = None,
) -> WeightSync:
    """Start one sync on this rank: the resharder's stream where it takes ``weights``, else verl's.

    ``weights``: what the actor's engine exported (:class:`ShardedWeights`, or any ``(name, tensor)`` iterable).
    ``feeder``: this rank hands the weights to a rollout server. ``bucket_bytes``: full bytes of the tensors moved
    per round (verl's ``rollout.update_weights_bucket_megabytes``); None: the resharder's default."""
    # lazy: ~50 ms; train.py imports this module for read_sync_log, only a weight sync needs the resharder
    from hybrid_engine.reshard import ShardedWeights, rollout_weight_stream
    from hybrid_engine.reshard.megatron import MegatronShardedWeights, megatron_rollout_weight_stream  # lazy: as above

    record = SyncRecord(
        global_steps=global_steps,
        rank=dist.get_rank() if dist.is_initialized() else 0,
        world_size=dist.get_world_size() if dist.is_initialized() else 1,
        rollout_world_size=rollout_world_size,
        feeder=feeder,
        scheme="verl_full_tensor",
    )
    started = time.perf_counter()
    if not isinstance(weights, ShardedWeights):
        return WeightSync(iter(weights), record, started)
    stats_out: list = []
    options = {"rollout_world_size": rollout_world_size, "stats_out": stats_out}
    if bucket_bytes is not None:
        options["bucket_bytes"] = bucket_bytes
    try:
        if isinstance(weights, MegatronShardedWeights):
            record.model_bytes, record.full_tensor_bytes = _megatron_bytes(weights)
            stream = megatron_rollout_weight_stream(weights, **options)
        else:
            record.model_bytes, record.full_tensor_bytes = _dtensor_bytes(weights.state_dict)
            stream = rollout_weight_stream(weights.state_dict, hf_config=weights.hf_config, **options)
    except (KeyError, NotImplementedError, TypeError, ValueError) as error:
        record.fallback_reason = f"{type(error).__name__}: {error}"
        _log_fallback_once(record.fallback_reason)
        return WeightSync(iter(weights.fallback), record, started)
    record.scheme = "gather_to_feeders"
    return WeightSync(stream, record, started, stats_out)


class SyncCheckFailed(RuntimeError):
    """The weight sync's check failed: the message names the tensor (NaN/Inf weights carry the rollback's
    ``StabilityFault[nan_weights]`` marker, recipes.verl_ext.stability.faults)."""


def training_checksums(weights, dtype: torch.dtype | None = None) -> dict[str, tuple[int, int, int]] | None:
    """Every rank: the checksums of the actor's weights (hybrid_engine.reshard.checksum), each rank's FSDP2 rows
    (or, for Megatron weights, the boxes of its shard no lower rank holds) summed by one all-reduce, on device; None
    for verl's own stream (no state dict beside it) and where a TP slice splits the checksum's words (alike on
    every rank). ``dtype``: of the weights as the generation side holds them (FSDP2's fp32 rows are cast one tensor
    at a time; Megatron's parameters in another dtype give None)."""
    # lazy: ~50 ms; train.py imports this module for read_sync_log, only a weight sync needs the resharder
    from hybrid_engine.reshard import ShardedWeights
    from hybrid_engine.reshard.checksum import checksums, wrap  # lazy: as the line above
    from hybrid_engine.reshard.executor import spec_of  # lazy: as the line above
    from hybrid_engine.reshard.megatron import MegatronShardedWeights, megatron_checksums  # lazy: as the line above

    if not isinstance(weights, ShardedWeights):
        return None
    if isinstance(weights, MegatronShardedWeights):
        spec = spec_of(weights.hf_config)
        shards = weights.shards(spec)
        if dtype is not None and shards.dtype != dtype:
            return None  # the caller takes the stream's checksums in that dtype
        try:
            names, sums = megatron_checksums(shards, spec, weights.groups())
        except NotImplementedError as error:
            _log_fallback_once(str(error), "the sync is not checked (no training-side checksum)")
            return None
    else:
        if _host_sums_over_nccl(weights.state_dict):
            _log_fallback_once("the actor's weights are on the host (CPU offload) and NCCL sums device tensors only",
                               "the training side is not checksummed")
            return None
        names, sums = checksums(weights.state_dict if dtype is None else _Cast(weights.state_dict, dtype))
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(sums)  # integer sums, alike in any order: exact
        wrap(sums)
    return {name: tuple(row) for name, row in zip(names, sums.tolist(), strict=True)}


def _host_sums_over_nccl(state_dict) -> bool:
    """True where the checksums would lie on the host (FSDP2's CPU offload) and the all-reduce is NCCL's, which
    takes device tensors only (alike on every rank: the offload is one config)."""
    first = next(iter(state_dict.values()), None)
    if first is None or first.device.type != "cpu" or not dist.is_initialized() or dist.get_world_size() == 1:
        return False
    return dist.get_backend() == "nccl"


class _Cast(Mapping):
    """A state dict whose tensors read as ``dtype``, each cast when it is read (one tensor's copy at a time)."""

    def __init__(self, state_dict: Mapping[str, torch.Tensor], dtype: torch.dtype) -> None:
        self.state_dict, self.dtype = state_dict, dtype

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.state_dict[name].to(self.dtype)

    def __contains__(self, name: object) -> bool:  # Mapping's own would read (cast) the tensor to answer
        return name in self.state_dict

    def __iter__(self):
        return iter(self.state_dict)

    def __len__(self) -> int:
        return len(self.state_dict)


def check_training_side(train: dict | None, global_steps: int | None) -> None:
    """Every rank alike (the sums are all-reduced): NaN/Inf in the training weights stops the sync before any
    collective of the stream."""
    # lazy: as training_checksums
    from hybrid_engine.reshard.checksum import nonfinite

    bad = nonfinite(train) if train else None
    if bad:
        raise SyncCheckFailed(f"StabilityFault[nan_weights] weight sync for step {global_steps}: {bad} on the "
                              "training side")


def check_generation_side(record: SyncRecord, train: dict | None, generation, seconds: float) -> str | None:
    """Compare the generation side's checksums (what the rollout holds after loading) with the training side's;
    the outcome goes into the sync's record. Returns the mismatch, in one line, or None."""
    # lazy: as training_checksums
    from hybrid_engine.reshard.checksum import first_mismatch

    entry: dict = {"train_seconds": round(seconds, 6)}
    if train is None:
        entry["checked"] = "no: verl's full_tensor() path"
    elif not isinstance(generation, dict):
        entry["checked"] = "training side only (this rank feeds no rollout)"
        entry["tensors"] = len(train)
    else:
        # what the stream handed over (a tied lm_head is not; the server refuses a hand-off missing a tensor)
        mismatch = first_mismatch({n: train[n] for n in train if n in generation}, generation)
        entry.update(checked="both sides", tensors=len(generation), match=mismatch is None)
        if mismatch:
            entry["mismatch"] = mismatch
        record.extra["checksum"] = entry
        return mismatch
    record.extra["checksum"] = entry
    return None


def read_sync_log(path) -> list[dict]:
    """The records of a ``weight_sync.jsonl`` (an empty list if there is none)."""
    try:
        text = open(path, encoding="utf-8").read()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]
