"""Probe: verl's Megatron path without TransformerEngine, on the CPU.

Builds a tiny Qwen2-shaped HF model with random weights (no hub), loads it through mbridge (verl's
``vanilla_mbridge`` path) with the pack's no-TE patch (``recipes.verl_ext.plugin.megatron_no_te.apply_no_te_patches``),
compares the logits with HF's, and exports the weights back to HF names.

    pip install --no-deps --target /tmp/megatron_site megatron-core==0.16.1 mbridge==0.15.1 einops
    PYTHONPATH=/tmp/megatron_site python scripts/probe_megatron_no_te.py

needs megatron-core and mbridge at the versions of pyproject's ``[megatron]`` extra, and no transformer_engine.
On the CPU only: ``Module.cuda`` is a no-op here (mbridge's ``get_model`` moves the model to the GPU).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import sys
import tempfile

import torch

SHAPE = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    tie_word_embeddings=False,
)


def tiny_qwen2(path: str, seed: int = 0, **overrides):
    """A random bf16 Qwen2 with :data:`SHAPE` (and ``overrides``), saved to ``path``; returns the HF model (eager
    attention)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(**{**SHAPE, **overrides}, torch_dtype="bfloat16", attn_implementation="eager")
    model = Qwen2ForCausalLM(config).to(torch.bfloat16).eval()
    model.save_pretrained(path)
    return model


def init_megatron_cpu() -> None:
    """World size 1 over gloo; megatron-core's parallel state with every size 1."""
    from megatron.core import parallel_state as mpu
    from megatron.core import tensor_parallel
    from megatron.core.fusions import fused_softmax

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    if not mpu.is_initialized():
        mpu.initialize_model_parallel(1, 1)
    torch.nn.Module.cuda = lambda self, *args, **kwargs: self  # CPU only: mbridge's get_model calls .cuda()
    torch.cuda.current_device = lambda: "cpu"  # megatron-core moves rotary tables to it
    # dropout runs under megatron-core's CUDA RNG tracker; the probe has no dropout and no CUDA
    tensor_parallel.get_cuda_rng_tracker().fork = lambda *args, **kwargs: contextlib.nullcontext()
    # megatron-core's default causal mask (True above the diagonal: masked) is built on "cuda"
    fused_softmax.get_default_causal_mask = lambda sq: torch.triu(torch.ones(sq, sq), diagonal=1).bool()


def mbridge_model(path: str, value: bool = False, weights: str | None = None):
    """The bridge and the bf16 GPTModel that verl's vanilla_mbridge path builds, weights loaded from ``weights``
    (``path`` by default). ``value``: a critic, as verl 0.9.1's Megatron engine builds one (the HF config untied, a
    (1, hidden) value head from mbridge's ``make_value_model``)."""
    from transformers import AutoConfig
    from verl.models.mcore.mbridge import AutoBridge, make_value_model

    hf_config = AutoConfig.from_pretrained(path)
    if value:
        hf_config.tie_word_embeddings = False  # verl's MegatronEngine._build_tf_config does this for a value model
    bridge = AutoBridge.from_config(hf_config, dtype=torch.bfloat16)
    bridge.set_extra_args(
        masked_softmax_fusion=False, use_cpu_initialization=True, attention_dropout=0.0, hidden_dropout=0.0
    )
    if value:
        bridge.config.share_embeddings_and_output_weights = False
    callbacks = [make_value_model] if value else []
    model = bridge.get_model(wrap_with_ddp=False, bf16=True, post_model_creation_callbacks=callbacks)
    bridge.load_weights(model, weights or path)
    return bridge, model


def critic_round_trip(path: str) -> dict:
    """A critic of a tied-embedding model, saved and loaded back as verl's Megatron checkpoint does (mbridge's
    ``save_weights``/``load_weights``), with a tied actor's bridge built between the two as in verl's colocated
    worker. Returns which tensors came back unequal."""
    tiny_qwen2(path, tie_word_embeddings=True)
    bridge, critic = mbridge_model(path, value=True)
    mbridge_model(path)  # the actor: its tied config adjusts mbridge's name table
    torch.manual_seed(2)
    head = critic[0].module.output_layer.weight
    with torch.no_grad():
        head.copy_(torch.randn_like(head))  # a trained value head, not the one the critic started with
    saved = os.path.join(path, "critic_checkpoint")
    bridge.save_weights(critic, saved)
    _, resumed = mbridge_model(path, value=True, weights=saved)
    before, after = critic[0].state_dict(), resumed[0].state_dict()
    names = [name for name in before if "_extra_state" not in name]
    return {
        "critic_tensors": len(names),
        "critic_unequal_after_resume": [name for name in names if not torch.equal(before[name], after[name])],
        "critic_saved_value_head_shape": list(_saved_tensor(saved, "lm_head.weight").shape),
    }


def _saved_tensor(folder: str, name: str) -> torch.Tensor:
    from safetensors import safe_open

    with safe_open(os.path.join(folder, "model.safetensors"), framework="pt") as f:
        return f.get_tensor(name) if name in f.keys() else torch.empty(0)


def compare(hf_model, bridge, model, seq_len: int = 16, batch: int = 2) -> dict:
    """HF logits against the Megatron model's on the same random tokens; export back and compare tensors."""
    torch.manual_seed(1)
    ids = torch.randint(0, SHAPE["vocab_size"], (batch, seq_len))
    positions = torch.arange(seq_len).expand(batch, seq_len)
    with torch.no_grad():
        ref = hf_model(input_ids=ids).logits.float()
        # verl's bshd mask (True on the tokens to keep; the patched local attention drops it for the causal one)
        keep = torch.ones(batch, seq_len, dtype=torch.bool)
        out = model[0](input_ids=ids, position_ids=positions, attention_mask=keep).float()
    hf_state = hf_model.state_dict()
    exported = dict(bridge.export_weights(model))
    bit_exact = sorted(exported) == sorted(hf_state) and all(
        torch.equal(exported[name].cpu(), hf_state[name]) for name in hf_state
    )
    diff = (out - ref).abs()
    return {
        "max_abs_logit_diff": round(diff.max().item(), 5),
        "mean_abs_logit_diff": round(diff.mean().item(), 5),
        "max_abs_logit": round(ref.abs().max().item(), 4),
        "argmax_agreement": (out.argmax(-1) == ref.argmax(-1)).float().mean().item(),
        "exported_tensors": len(exported),
        "hf_tensors": len(hf_state),
        "export_bit_exact": bit_exact,
    }


def run_probe() -> dict:
    import importlib.metadata

    from recipes.verl_ext.plugin import megatron_no_te

    megatron_no_te.apply_no_te_patches()
    init_megatron_cpu()
    with tempfile.TemporaryDirectory() as path:
        hf_model = tiny_qwen2(path)
        bridge, model = mbridge_model(path)
        result = compare(hf_model, bridge, model)
    with tempfile.TemporaryDirectory() as path:
        result.update(critic_round_trip(path))
    versions = {name: importlib.metadata.version(name) for name in ("verl", "megatron-core", "mbridge", "torch")}
    return {"date": datetime.date.today().isoformat(), **versions, **result}


if __name__ == "__main__":
    print(json.dumps(run_probe(), indent=1))
    sys.exit(0)
