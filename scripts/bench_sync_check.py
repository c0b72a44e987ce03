"""What the weight-sync check costs on each side, for a model's tensor layout: the training side's checksums of an
FSDP2 state dict cast to bf16 (``training_checksums``, what every checked sync into vLLM runs in the actor) and the
generation side's read-back of the same weights (``loaded_checksums``, what the vLLM worker runs).

    python scripts/bench_sync_check.py                       # Qwen2.5-1.5B's 339 tensors, narrow (hidden 64), CPU
    python scripts/bench_sync_check.py --hidden 1536 --device cuda   # the real shapes, on a GPU
    PYTHONPATH=/tmp/older python scripts/bench_sync_check.py   # the same with another checkout's code, side by side

On the CPU with narrow tensors the arithmetic is negligible and the figure is the per-tensor dispatch the check pays
(what bounds it on a GPU too, where each operation is a kernel launch); prints one JSON line: medians of ``--repeats``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist


def _model(hidden: int, layers: int, device: str):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(hidden_size=hidden, intermediate_size=hidden * 2 if hidden < 256 else 8960,
                         num_hidden_layers=layers, num_attention_heads=max(1, hidden // 128) if hidden >= 128 else 4,
                         num_key_value_heads=2, vocab_size=151936 if hidden >= 1024 else 512,
                         tie_word_embeddings=True)
    with torch.device(device):
        return Qwen2ForCausalLM(config)


def _median_ms(fn, repeats: int, device: str) -> float:
    times = []
    for _ in range(repeats + 2):  # two warm-ups
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return round(statistics.median(times[2:]) * 1e3, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:  # a free one: another process group may run beside this one
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(probe.getsockname()[1])
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", rank=0, world_size=1)
    from torch.distributed.fsdp import fully_shard

    from hybrid_engine.reshard import ShardedWeights
    from recipes.verl_ext.plugin import vllm_sync, weight_sync

    model = _model(args.hidden, args.layers, args.device)
    generation = {name: tensor.detach().to(torch.bfloat16) for name, tensor in model.state_dict().items()}
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    weights = ShardedWeights(model.state_dict(), fallback=iter(()))
    shapes = {name: list(tensor.shape) for name, tensor in generation.items()}

    class _Loaded(torch.nn.Module):  # what a vLLM model answers: its parameters by name
        def named_parameters(self, remove_duplicate=False):
            return iter(generation.items())

    loaded = _Loaded()
    train = weight_sync.training_checksums(weights, dtype=torch.bfloat16)
    back = vllm_sync.loaded_checksums(loaded, shapes)
    assert train == {name: tuple(row) for name, row in back["sums"].items()}, "the two sides disagree"
    print(json.dumps({
        "tensors": len(shapes),
        "hidden": args.hidden,
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "training_side_ms": _median_ms(lambda: weight_sync.training_checksums(weights, dtype=torch.bfloat16),
                                       args.repeats, args.device),
        "generation_side_ms": _median_ms(lambda: vllm_sync.loaded_checksums(loaded, shapes), args.repeats,
                                         args.device),
        "torch_threads": torch.get_num_threads(),
    }))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
