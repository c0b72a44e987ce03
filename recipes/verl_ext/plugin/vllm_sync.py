"""The actor -> vLLM weight sync, timed and checked: verl 0.9.1's own CUDA-IPC path with the pack's checksum around it.

verl's colocated sync into vLLM (``ServerAdapter.update_weights``) streams HF-named tensors in buckets over CUDA IPC
to the vLLM worker on the same GPU, which loads them with vLLM's own ``load_weights``: q/k/v rows go into one
``qkv_proj``, gate/up into ``gate_up_proj``, the embedding into a vocabulary padded to a multiple of 64, every tensor
cast to the engine's dtype. Nothing in verl checks what vLLM holds afterwards. With ``KLPPO_SYNC_LOG`` set (the
recipes set it), every sync here:

1. computes the checksums the engine should hold (``hybrid_engine.reshard.checksum``, in the rollout's dtype), before
   the stream starts: from the training engine's own parameters where the pack's export carries them (FSDP2's state
   dict, Megatron's GPTModel parameters: :func:`.weight_sync.training_checksums`, all-reduced over the ranks), so the
   check covers verl's export too; otherwise (FSDP1, parameter offload) from each tensor as verl's stream yields it;
   NaN/Inf on the training side stops the sync before anything moves;
2. runs verl's sync, timed, with its stream sent as vLLM will hold it: fp32 tensors in the rollout's dtype where
   the last read-back found vLLM holding them so (vLLM casts them on arrival anyway: half the bytes; the first sync
   sends verl's tensors as they are, and what vLLM keeps in fp32 stays fp32), a tied ``lm_head`` left out (vLLM
   loads the embedding into it);
3. asks each vLLM worker of the replica for the checksums of what it loaded (:func:`loaded_checksums`, installed on
   verl's worker extension as ``klppo_loaded_checksums``: the fused rows sliced back out by their ``output_sizes``,
   the padded vocabulary cut), compares them exactly and raises :class:`.weight_sync.SyncCheckFailed` naming the
   first tensor that differs;
4. appends a :class:`.weight_sync.SyncRecord` (scheme ``vllm_ipc``) to the sync log: seconds, bytes streamed, the
   check's outcome and its own time.

Why verl's path and not the resharder: into vLLM every training rank streams the whole model to the vLLM worker on its
own GPU (CUDA IPC moves no bytes between GPUs); the resharder (``hybrid_engine.reshard``) removes the redundant
gathers of the hf engine's hand-off, and on one GPU the training layout already holds the whole model. vLLM with
tensor parallelism (each worker holds a slice) is timed but not checked: the record says so.

A failure of the check's own machinery (not a mismatch) is logged once and recorded; it never stops a run.
"""

from __future__ import annotations

import functools
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping

import torch
import torch.distributed as dist

from recipes import envvars
from recipes.verl_ext.plugin.weight_sync import (
    SYNC_LOG_ENV,
    SyncCheckFailed,
    SyncRecord,
    append_record,
    check_training_side,
    training_checksums,
    warn_once,
)

__all__ = ["READBACK_METHOD", "SCHEME", "checked_update_weights", "loaded_checksums", "worker_loaded_checksums"]


SCHEME = "vllm_ipc"
READBACK_METHOD = "klppo_loaded_checksums"
"""The method the pack adds to verl's vLLM worker extension (``vLLMColocateWorkerExtension``)."""
WHY_NOT_RESHARDER = (
    "vLLM rollout: verl's CUDA-IPC stream, each training rank to the vLLM worker on its own GPU "
    "(the resharder feeds the hf engine)"
)


# ---- the generation side: in the vLLM worker ---------------------------------------------------------------------


def _fused_parts(model) -> dict[str, tuple[str, int]]:
    """HF module name -> (vLLM's fused module name, index) from the model class's ``packed_modules_mapping``."""
    packed = getattr(model, "packed_modules_mapping", None) or {}
    return {part: (fused, index) for fused, parts in packed.items() for index, part in enumerate(parts)}


def _loaded_rows(model, tensors: Mapping[str, torch.Tensor], parts, name: str) -> torch.Tensor | None:
    """The rows of vLLM's parameter that hold the HF tensor ``name``, or None where vLLM has no such parameter."""
    if name in tensors:
        return tensors[name]
    prefix, _, attr = name.rpartition(".")
    parent, _, leaf = prefix.rpartition(".")
    if leaf not in parts:
        return None
    fused, index = parts[leaf]
    try:
        module = model.get_submodule(f"{parent}.{fused}" if parent else fused)
    except AttributeError:
        return None
    sizes = getattr(module, "output_sizes", None)
    param = getattr(module, attr, None)
    if sizes is None or param is None:
        return None
    start = sum(sizes[:index])
    return param[start : start + sizes[index]]


def _dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``: how a dtype crosses to the vLLM worker and into the record."""
    return str(dtype).replace("torch.", "")


def loaded_checksums(model, shapes: Mapping[str, Iterable[int]], dtype: str | None = None) -> dict:
    """What ``model`` (a vLLM model, one worker's, unsharded) holds under each HF name in ``shapes``: ``{"sums":
    {name: [sum, weighted, nonfinite]}, "not_found": [names], "dtypes": {name: the dtype vLLM holds it in}}``.

    ``dtype`` (the rollout's, as the training side's checksums are taken): a parameter vLLM keeps in another
    floating dtype (fp32, as some keep a MoE router's gate) is cast to it first.

    A fused parameter's rows are sliced back by its module's ``output_sizes`` (``packed_modules_mapping`` names the
    parts); a parameter longer than the HF tensor in dim 0 with the same other dims (the vocabulary vLLM pads) is cut
    to the HF length. A name vLLM holds in another shape is ``not_found``, with its shape."""
    from hybrid_engine.reshard.checksum import checksum_rows  # lazy: runs in the vLLM worker only

    tensors = dict(model.named_parameters(remove_duplicate=False))
    tensors.update(model.named_buffers())
    parts = _fused_parts(model)
    found, not_found = {}, []
    for name, shape in shapes.items():
        shape = tuple(shape)
        rows = _loaded_rows(model, tensors, parts, name)
        padded = rows is not None and shape and rows.dim() and rows.shape[0] > shape[0]
        if padded and tuple(rows.shape[1:]) == shape[1:]:
            rows = rows[: shape[0]]
        if rows is None or tuple(rows.shape) != shape:
            not_found.append(name if rows is None else f"{name} {tuple(rows.shape)} != {shape}")
            continue
        found[name] = rows
    dtypes = {name: _dtype_name(rows.dtype) for name, rows in found.items()}
    if dtype is not None:
        wanted = getattr(torch, dtype)
        found = {name: rows.to(wanted) if rows.is_floating_point() else rows for name, rows in found.items()}
    # batched, and one copy to the host for all of them, not one device sync a tensor
    sums = dict(zip(found, checksum_rows(list(found.values())).tolist(), strict=True)) if found else {}
    return {"sums": sums, "not_found": not_found, "dtypes": dtypes}


def worker_loaded_checksums(self, shapes: dict, dtype: str | None = None) -> dict:
    """``klppo_loaded_checksums`` of verl's vLLM worker extension: :func:`loaded_checksums` of this worker's model,
    or why it is not read back (vLLM's tensor parallelism: each worker holds a slice)."""
    from vllm.distributed import get_tensor_model_parallel_world_size  # lazy: vLLM's worker process only

    tp = get_tensor_model_parallel_world_size()
    if tp > 1:
        return {"unchecked": f"vLLM tensor parallel {tp}: each worker holds a slice"}
    with torch.no_grad():
        return loaded_checksums(self.model_runner.model, shapes, dtype)


# ---- the training side: in the actor's process ----------------------------------------------------------------------


class _StreamChecksums:
    """verl's stream, counting each tensor's bytes and shape and, where no training-side checksums came first,
    taking each tensor's checksum in the rollout's dtype as it passes.

    ``cast``: names sent in the rollout's dtype where verl yields them in fp32: those vLLM held in that dtype at the
    last sync, whose ``load_weights`` casts them on arrival anyway (the same bits, half the bytes through verl's IPC
    buckets). verl sends every tensor as the engine holds it, because some parameters stay fp32 in vLLM (a MoE
    router's gate); the first sync learns which. ``skip``: names vLLM does not load (``lm_head.weight`` where the
    model ties it to the embedding, which is sent): not sent, but read back like the rest, so that a vLLM model that
    did not tie them fails the check instead of generating with a stale head."""

    def __init__(self, weights, dtype: torch.dtype, take_sums: bool, cast: frozenset[str] = frozenset(),
                 skip: frozenset[str] = frozenset()) -> None:
        self.weights, self.dtype, self.take_sums = weights, dtype, take_sums
        self.cast, self.skip = cast, skip
        self.shapes: dict[str, list[int]] = {}
        self.sent_cast = 0
        self.skipped: list[str] = []
        self._summed: list[str] = []  # the names in the batch's order
        self._batch = None  # hybrid_engine's ChecksumBatch, on the tensors' device until read: no device sync a tensor
        self.bytes = 0

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        from hybrid_engine.reshard.checksum import ChecksumBatch  # lazy: as in loaded_checksums

        self._batch, self._summed, self.skipped, self.sent_cast = ChecksumBatch(), [], [], 0
        for name, tensor in self.weights:
            if name in self.cast and tensor.dtype == torch.float32:
                tensor = tensor.to(self.dtype)
                self.sent_cast += 1
            self.shapes[name] = list(tensor.shape)
            if self.take_sums:
                self._batch.add(tensor.detach().to(self.dtype))  # verl's stream yields every tensor on one device
                self._summed.append(name)
            if name in self.skip:
                self.skipped.append(name)
                continue
            self.bytes += tensor.numel() * tensor.element_size()
            yield name, tensor

    @property
    def sums(self) -> dict[str, tuple[int, int, int]]:
        """The checksums taken as the stream passed, brought to the host in one copy."""
        if not self._summed:
            return {}
        return {name: tuple(row) for name, row in zip(self._summed, self._batch.result().tolist(), strict=True)}


_SEND_IN_ROLLOUT_DTYPE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""verl's adapter -> the names its next sync sends in the rollout's dtype (learned from the last read-back)."""


def _to_cast(replies: list, dtype: torch.dtype, config) -> frozenset[str]:
    """The names every worker holds in the rollout's dtype, where that dtype is 16-bit and nothing is quantized on
    load (a quantized rollout's scales are taken from what arrives: it gets verl's tensors as they are)."""
    if getattr(config, "quantization", None) or dtype not in (torch.bfloat16, torch.float16) or not replies:
        return frozenset()
    held = [reply.get("dtypes") or {} for reply in replies]
    wanted = _dtype_name(dtype)
    return frozenset(name for name in held[0] if all(h.get(name) == wanted for h in held))


def _not_loaded(adapter) -> frozenset[str]:
    """HF names vLLM's ``load_weights`` skips: ``lm_head.weight`` where the model ties it to the embedding."""
    hf_config = getattr(getattr(adapter, "model_config", None), "hf_config", None)
    return frozenset({"lm_head.weight"}) if getattr(hf_config, "tie_word_embeddings", False) else frozenset()


def _rollout_dtype(config) -> torch.dtype:
    name = str(getattr(config, "dtype", "bfloat16")).replace("torch.", "")
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "half": torch.float16, "fp32": torch.float32,
            "float": torch.float32}.get(name, getattr(torch, name, torch.bfloat16))


def _compare(expected: Mapping, replies: list, dtype: torch.dtype) -> tuple[dict, str | None]:
    """The check's record entry and the first mismatch (one line), from the workers' replies."""
    from hybrid_engine.reshard.checksum import first_mismatch  # lazy: as in loaded_checksums

    entry: dict = {"dtype": _dtype_name(dtype), "workers": len(replies)}
    unchecked = [r["unchecked"] for r in replies if "unchecked" in r]
    if unchecked or not replies:
        entry["checked"] = f"no: {unchecked[0] if unchecked else 'no vLLM worker replied'}"
        return entry, None
    mismatch = None
    for reply in replies:
        loaded = {name: tuple(row) for name, row in reply["sums"].items()}
        mismatch = mismatch or first_mismatch({n: expected[n] for n in loaded if n in expected}, loaded)
    entry.update(checked="both sides", tensors=len(replies[0]["sums"]), match=mismatch is None,
                 not_read_back=replies[0]["not_found"])
    if mismatch:
        entry["mismatch"] = mismatch
    return entry, mismatch


async def checked_update_weights(original, adapter, weights, global_steps=None, wire_format="named_tensors",
                                 **kwargs):
    """verl's ``ServerAdapter.update_weights`` (``original``), timed and checked as the module docstring says; verl's
    call as it is for LoRA adapters, delta updates, or with no sync log."""
    if wire_format != "named_tensors" or kwargs.get("peft_config") is not None or not envvars.getenv(SYNC_LOG_ENV):
        return await original(adapter, weights, global_steps=global_steps, wire_format=wire_format, **kwargs)
    dtype = _rollout_dtype(adapter.config)
    started = time.perf_counter()
    expected = training_checksums(weights, dtype=dtype)  # every rank alike (all-reduced); None: verl's stream
    check_training_side(expected, global_steps)
    check_seconds = time.perf_counter() - started
    stream = _StreamChecksums(weights, dtype, take_sums=expected is None,
                              cast=_SEND_IN_ROLLOUT_DTYPE.get(adapter, frozenset()), skip=_not_loaded(adapter))
    sync_started = time.perf_counter()
    result = await original(adapter, stream, global_steps=global_steps, wire_format=wire_format, **kwargs)
    seconds = time.perf_counter() - sync_started
    record = SyncRecord(
        global_steps=global_steps,
        rank=dist.get_rank() if dist.is_initialized() else 0,
        world_size=dist.get_world_size() if dist.is_initialized() else 1,
        rollout_world_size=adapter.config.tensor_model_parallel_size,
        feeder=bool(getattr(adapter, "_has_server", True)),
        scheme=SCHEME,
        tensors=len(stream.shapes),
        model_bytes=stream.bytes,
        seconds=seconds,
        fallback_reason=WHY_NOT_RESHARDER,
    )
    record.extra["sent"] = {"in_rollout_dtype": stream.sent_cast, "skipped": stream.skipped}
    mismatch = None
    if record.feeder:
        read_started = time.perf_counter()
        try:
            replies = await adapter._execute_method(READBACK_METHOD, kwargs={"shapes": stream.shapes,
                                                                             "dtype": _dtype_name(dtype)})
            replies = list(replies or [])
            entry, mismatch = _compare(expected or stream.sums, replies, dtype)
            if entry["checked"] == "both sides":  # what the workers hold decides what the next sync casts
                _SEND_IN_ROLLOUT_DTYPE[adapter] = _to_cast(replies, dtype, adapter.config)
            entry["source"] = "training engine's parameters" if expected is not None else "verl's stream as sent"
        except Exception as error:  # noqa: BLE001  (the check's own failure is recorded, never stops a run)
            warn_once(f"weight sync into vLLM: the check could not run: {type(error).__name__}: {error}")
            entry = {"checked": f"no: {type(error).__name__}: {error}"}
        entry["check_seconds"] = round(check_seconds + time.perf_counter() - read_started, 6)
        record.extra["checksum"] = entry
    append_record(record)
    if mismatch:
        raise SyncCheckFailed(f"weight sync into vLLM for step {global_steps}: {mismatch}")
    return result


def wrap_update_weights(original):
    """The wrapper installed on ``ServerAdapter.update_weights`` (``recipes.verl_ext.plugin.patches``)."""

    @functools.wraps(original)
    async def update_weights(self, weights, global_steps=None, wire_format="named_tensors", **kwargs):
        return await checked_update_weights(original, self, weights, global_steps, wire_format, **kwargs)

    return update_weights
