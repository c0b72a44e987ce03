"""Run a function on N real processes with torch.distributed (gloo on CPU, NCCL on GPUs) and collect what each returns.

Used by ``scripts/bench_reshard.py`` and the multi-process tests. ``fn(rank, world, *args)`` must be importable at top
level (``torch.multiprocessing.spawn`` pickles it by name); its return value must pickle. The processes meet through a
file in a temporary folder (no port to pick), and share the machine's cores (``torch.set_num_threads``).
"""

from __future__ import annotations

import os
import pickle
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["run_world"]


def _entry(rank: int, fn, world: int, args: tuple, folder: str, backend: str) -> None:
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
    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(_entry, args=(fn, world, args, folder, backend), nprocs=world, join=True)
        return [pickle.loads(Path(folder, f"rank{rank}.pkl").read_bytes()) for rank in range(world)]
