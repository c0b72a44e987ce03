"""Run in a subprocess by ``test_megatron_weight_sync.py``: a tiny random Qwen2 (GQA 4 heads / 2 kv heads, qkv bias)
built through verl's mbridge path on the CPU (``scripts/probe_megatron_no_te.py``: gloo, world size 1, the no-TE
patches applied; it patches torch globally, hence the subprocess), its weights synced through the patched
``MegatronEngine.get_per_tensor_param`` and the hf rollout's ``open_weight_stream``, compared with mbridge's
``export_weights``. Prints one JSON object.

    PYTHONPATH=/tmp/megatron_site311 python -m tests.recipes.verl_ext.megatron_sync_probe --tied

Flags: ``--tied`` (tied embeddings); ``--wrong-config`` (the engine's HF config says another MLP width than the
model has: the export refuses, logs why, and verl's own generator is the stream); ``--padded`` (mbridge pads the
vocabulary, ``make_vocab_size_divisible_by``: the padding rows must not reach the rollout).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import AutoConfig, Qwen2Config, Qwen2ForCausalLM

from hybrid_engine.reshard.checksum import checksums
from hybrid_engine.reshard.executor import spec_of
from hybrid_engine.reshard.megatron import MegatronShardedWeights
from recipes.verl_ext.plugin import megatron_no_te, patches, weight_sync

ROOT = Path(__file__).resolve().parents[3]


def _probe_module():
    """scripts/probe_megatron_no_te.py (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("probe_megatron_no_te", ROOT / "scripts" / "probe_megatron_no_te.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PADDED_VOCAB_MULTIPLE = 96  # the tiny model's 128 rows padded to 192


def _tiny_qwen2(probe, path: str, tied: bool) -> None:
    torch.manual_seed(0)
    config = Qwen2Config(**{**probe.SHAPE, "tie_word_embeddings": tied}, torch_dtype="bfloat16")
    Qwen2ForCausalLM(config).to(torch.bfloat16).save_pretrained(path)


def _mbridge_model(path: str, padded: bool):
    """``probe.mbridge_model``, with mbridge's vocabulary padding where asked."""
    from verl.models.mcore.mbridge import AutoBridge  # lazy: after the no-TE patches' import hooks are in place

    bridge = AutoBridge.from_config(AutoConfig.from_pretrained(path), dtype=torch.bfloat16)
    bridge.set_extra_args(
        masked_softmax_fusion=False, use_cpu_initialization=True, attention_dropout=0.0, hidden_dropout=0.0
    )
    if padded:
        bridge.make_vocab_size_divisible_by = PADDED_VOCAB_MULTIPLE
    model = bridge.get_model(wrap_with_ddp=False, bf16=True)
    bridge.load_weights(model, path)
    return bridge, model


class _Engine:
    """The attributes of verl's MegatronEngine the export reads; ``get_per_tensor_param`` as verl's vanilla mbridge
    path builds it (``bridge.export_weights(self.module)``, a generator not yet started)."""

    def __init__(self, bridge, module, hf_config):
        self.bridge, self.module = bridge, module
        self.model_config = SimpleNamespace(hf_config=hf_config)
        self.peft_cls, self._qat_enabled, self._is_offload_param = None, False, False
        self.started = False

    def get_per_tensor_param(self, base_sync_done=False, **kwargs):
        def stream():
            self.started = True
            yield from self.bridge.export_weights(self.module)

        return stream(), None


def run(tied: bool, padded: bool = False, wrong_config: bool = False) -> dict:
    probe = _probe_module()
    megatron_no_te.apply_no_te_patches()
    probe.init_megatron_cpu()
    with tempfile.TemporaryDirectory() as path:
        _tiny_qwen2(probe, path, tied)
        bridge, model = _mbridge_model(path, padded)
    reference = [(name, tensor.detach().clone()) for name, tensor in bridge.export_weights(model)]
    hf_config = bridge.hf_config
    if wrong_config:
        hf_config = Qwen2Config(**{**hf_config.to_dict(), "intermediate_size": hf_config.intermediate_size * 2})
    engine = _Engine(bridge, model, hf_config)
    patches._megatron_sharded_weight_export(SimpleNamespace(MegatronEngine=_Engine))
    weight_sync.enable_sharded_export()
    warnings: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda entry: warnings.append(entry.getMessage())
    weight_sync.logger.addHandler(handler)
    weights, peft_config = engine.get_per_tensor_param()
    train = weight_sync.training_checksums(weights)
    sync = weight_sync.open_weight_stream(weights, global_steps=1, rollout_world_size=1, feeder=True)
    streamed = [(name, tensor.detach().clone()) for name, tensor in sync.stream]
    record = sync.finish(tensors=len(streamed))
    parameters = {p.data_ptr() for p in model[0].parameters()}
    sharded = isinstance(weights, MegatronShardedWeights)
    shards = weights.shards(spec_of(weights.hf_config)) if sharded else None
    expected = dict(reference)
    names, sums = checksums(expected)
    return {
        "tied": tied,
        "embedding_rows": model[0].module.embedding.word_embeddings.weight.shape[0],
        "exported": type(weights).__name__,
        "peft_config": peft_config,
        "verl_generator_started": engine.started,
        "scheme": record.scheme,
        "fallback_reason": record.fallback_reason,
        "received_bytes": record.received_bytes,
        "full_tensor_bytes": record.full_tensor_bytes,
        "reference_names": [name for name, _ in reference],
        "streamed_names": [name for name, _ in streamed],
        "mismatched": [n for n, t in streamed if n not in expected or not _bit_equal(t, expected[n])],
        "dtypes": sorted({str(t.dtype) for _, t in streamed}),
        "storage_aliases_parameters": sharded and all(t.data_ptr() in parameters for t in shards.storage.values()),
        "checksums_match": train == {n: tuple(row) for n, row in zip(names, sums.tolist(), strict=True)},
        "training_checksums": train is not None,
        "warnings": warnings,
    }


def _bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


if __name__ == "__main__":
    flags = sys.argv[1:]
    print(json.dumps(run(tied="--tied" in flags, padded="--padded" in flags, wrong_config="--wrong-config" in flags)))
