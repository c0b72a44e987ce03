"""Helpers shared by the GPU benchmarks in ``scripts/gpu/``: one-process torch.distributed, the device's copy bandwidth,
timing, the run's environment and the JSON each script writes.

Nothing here needs a GPU: on a machine without CUDA every helper works on the CPU (gloo), so the scripts' logic can be
smoke-tested on tiny shapes (``tests/gpu``).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

GIB = 1024**3
MB = 1 << 20


def pick_device(name: str = "auto") -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    device = torch.device(name, 0) if name == "cuda" else torch.device(name)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def init_single_process_group(device: torch.device) -> None:
    """World size 1: NCCL on a GPU, gloo on the CPU (rendezvous through a file, no port to pick)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    folder = tempfile.mkdtemp(prefix="pack_gpu_bench_")
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        dist.init_process_group(backend, init_method=f"file://{folder}/init", rank=0, world_size=1, device_id=device)
    else:
        dist.init_process_group(backend, init_method=f"file://{folder}/init", rank=0, world_size=1)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_it(fn: Callable[[], object], device: torch.device, *, warmup: int, repeat: int) -> list[float]:
    """Wall seconds of ``fn`` (synchronised before and after), ``repeat`` times after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeat):
        sync(device)
        tic = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - tic)
    return times


def copy_bandwidth(device: torch.device, nbytes: int = 2 * GIB, repeat: int = 20) -> dict:
    """Device-to-device copy bandwidth (bytes read + bytes written per second), median of ``repeat`` copies of a
    buffer of ``nbytes``: the HBM ceiling the handoff is measured against (about 4.3 TB/s on an H200)."""
    if device.type != "cuda":
        nbytes = min(nbytes, 256 * MB)
    elements = int(nbytes) // 2
    src = torch.empty(elements, dtype=torch.bfloat16, device=device).uniform_()
    dst = torch.empty_like(src)
    times = time_it(lambda: dst.copy_(src), device, warmup=3, repeat=repeat)
    median = statistics.median(times)
    return {
        "buffer_bytes": elements * 2,
        "seconds_median": median,
        "seconds_min": min(times),
        "bytes_per_s": 2 * elements * 2 / median,
        "counted": "bytes read + bytes written",
    }


def environment(device: torch.device) -> dict:
    info = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": str(device),
        "host_cpus": os.cpu_count(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            gpu=props.name,
            gpu_memory_bytes=props.total_memory,
            multiprocessors=props.multi_processor_count,
            cuda=torch.version.cuda,
        )
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    try:
        from importlib.metadata import version

        info["verl"] = version("verl")
    except Exception:  # noqa: BLE001 - verl is optional for the handoff
        pass
    return info


def write_json(path: Path | None, payload: dict) -> None:
    if path is None:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=str))
    print(f"wrote {path}")


def pct_error(predicted: float, measured: float) -> float:
    """(predicted - measured) / measured in percent (positive: the plan over-predicts)."""
    return 100.0 * (predicted - measured) / measured if measured else float("nan")


def gib(nbytes: float | None) -> str:
    return "-" if nbytes is None else f"{nbytes / GIB:.2f}"
