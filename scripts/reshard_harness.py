"""Run a function on N real processes with torch.distributed (gloo on CPU, NCCL on GPUs) and collect what each returns.

Used by ``scripts/bench_reshard.py``, ``scripts/gpu/bench_handoff.py`` and the multi-process tests (a benchmark and test
harness, kept out of the library). ``fn(rank, world, *args)`` must be importable at top
level (it is pickled by name); its return value must pickle. The processes meet through a file in a temporary folder
(no port to pick), and share the machine's cores (``torch.set_num_threads``).

The processes are forked by the standard library's fork server, started once per process with torch and this
package imported (``multiprocessing.set_forkserver_preload``): each world then costs a fork per rank instead of a
fresh interpreter importing torch (about 1.3 CPU-s a rank on a 2-core machine). The server itself never touches a
GPU (CUDA is initialised in the ranks), and each rank gets the caller's environment of the moment, as a spawned one
would.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["SMALL_SHAPES", "fully_sharded_tiny_model", "run_world", "small_spec"]


PRELOAD = ["torch", "torch.distributed", "hybrid_engine.reshard"]
"""What the fork server imports once, before it forks any rank."""


def _entry(rank: int, fn, world: int, args: tuple, folder: str, backend: str, environ: dict) -> None:
    os.environ.clear()
    os.environ.update(environ)  # the caller's environment when it called run_world, not the fork server's
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{folder}/init", rank=rank, world_size=world)
    try:
        result = fn(rank, world, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    Path(folder, f"rank{rank}.pkl").write_bytes(pickle.dumps(result))


def run_world(fn, world: int, *args, backend: str = "gloo") -> list:
    """``[fn(0, world, *args), ..., fn(world - 1, world, *args)]``, each run in its own process."""
    if backend == "gloo" and sys.platform.startswith("linux"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one machine: stay on loopback whatever the hostname says
    multiprocessing.set_forkserver_preload(PRELOAD)  # read when the server starts: at the first world
    with tempfile.TemporaryDirectory() as folder:
        mp.start_processes(_entry, args=(fn, world, args, folder, backend, dict(os.environ)), nprocs=world, join=True,
                           start_method="forkserver")
        return [pickle.loads(Path(folder, f"rank{rank}.pkl").read_bytes()) for rank in range(world)]


SMALL_SHAPES = {
    "qwen2_5_0_5b_reduced": {
        # Qwen2.5-0.5B's head structure (14 heads, 2 kv heads, qkv bias, tied embedding) at toy width: uneven head
        # splits for tp 4 and 8, kv heads replicated for tp > 2, an odd vocabulary (uneven FSDP chunks)
        "model_type": "qwen2",
        "hidden_size": 112,
        "intermediate_size": 160,
        "num_hidden_layers": 4,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 999,
        "tie_word_embeddings": True,
    },
    "llama_untied": {
        # untied lm_head, no biases, 8 heads over 4 kv heads, even splits (the in-place all-gather path)
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "vocab_size": 1024,
        "tie_word_embeddings": False,
    },
}
"""Small model shapes for multi-process tests and quick benchmarks (``small_spec``)."""


def small_spec(name: str):
    """The ModelSpec of a ``SMALL_SHAPES`` entry, or of any shipped model name (``build_spec``)."""
    from hybrid_engine.model_spec import arch_from_config, build_spec

    if name in SMALL_SHAPES:
        return build_spec(arch_from_config(dict(SMALL_SHAPES[name]), name), "analytic")
    return build_spec(name)


def fully_sharded_tiny_model(world: int, seed: int):
    """``(config, model, full)``: the shipped tiny Qwen2 with seeded random weights under FSDP2 (``fully_shard`` per
    decoder layer, then the whole model, over a 1-D CPU mesh of ``world`` ranks), as verl's FSDP2 engine holds it, and
    ``full``, a copy of its state dict from before sharding. Call inside a ``run_world`` process."""
    import json

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoConfig, AutoModelForCausalLM

    from hybrid_engine.model_spec import MODEL_CONFIG_DIR

    config = json.loads((MODEL_CONFIG_DIR / "tiny" / "config.json").read_text())
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
    full = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    mesh = init_device_mesh("cpu", (world,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return config, model, full
