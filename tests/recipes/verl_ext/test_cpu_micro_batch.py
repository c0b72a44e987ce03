"""On the CPU platform verl's FSDP engines get micro batches marked as on the CPU, so their ``micro_batch.to("cpu")``
returns the batch as it is instead of walking every per-sample entry (recipes/verl_ext/plugin/patches.py,
``_cpu_micro_batches_in_place``)."""

from __future__ import annotations

import types

import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

from recipes.verl_ext.plugin import patches


def _micro_batch() -> TensorDict:
    batch = TensorDict({"input_ids": torch.arange(12).view(3, 4)}, batch_size=[3])
    batch["data_source"] = NonTensorStack(*[NonTensorData("tiny_arith") for _ in range(3)])  # as verl's batches carry
    return batch


def _engines():
    class Engine:
        def forward_step(self, micro_batch, loss_function, forward_only):
            moved = micro_batch.to("cpu")  # the first line of verl's forward_step, on the CPU platform
            return moved, loss_function, forward_only

    return types.SimpleNamespace(FSDPEngineWithLMHead=type("LM", (Engine,), {}),
                                 FSDPEngineWithValueHead=type("Value", (Engine,), {}))


def test_the_move_to_the_cpu_returns_the_micro_batch_itself():
    module = _engines()
    unpatched = _micro_batch()
    assert module.FSDPEngineWithLMHead().forward_step(unpatched, "loss", True)[0] is not unpatched  # the walk
    patches._cpu_micro_batches_in_place(module)
    patches._cpu_micro_batches_in_place(module)  # the hook may run twice: wrapped once
    for engine in (module.FSDPEngineWithLMHead(), module.FSDPEngineWithValueHead()):
        batch = _micro_batch()
        moved, loss, forward_only = engine.forward_step(batch, "loss", forward_only=True)
        assert moved is batch and moved.device == torch.device("cpu") and (loss, forward_only) == ("loss", True)
        assert moved["input_ids"].data_ptr() == batch["input_ids"].data_ptr()
        assert list(moved["data_source"]) == ["tiny_arith"] * 3


def test_verls_engines_are_patched_on_the_cpu_platform():
    from verl.workers.engine.fsdp import transformer_impl

    for engine in (transformer_impl.FSDPEngineWithLMHead, transformer_impl.FSDPEngineWithValueHead):
        assert getattr(engine.forward_step, "_hybrid_engine_cpu_micro_batch", False), engine
