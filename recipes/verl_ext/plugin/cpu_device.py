"""The ``torch.<device>`` namespace verl expects from a platform, for the CPU.

verl calls ``get_torch_device().<fn>()`` (``empty_cache``, ``synchronize``, ``mem_get_info``, ``max_memory_allocated``,
``get_rng_state`` ...); ``torch.cpu`` lacks most of them. This module is ``torch.cpu`` plus those functions: cache
and allocator calls are no-ops, RNG calls use torch's CPU generator, and the memory counters report this process's
resident memory (so verl's ``perf/max_memory_allocated_gb`` is the worker's peak RSS on CPU).
"""

from __future__ import annotations

import platform as _platform
import resource

import psutil
import torch

Event = torch.cpu.Event
Stream = torch.cpu.Stream
current_stream = torch.cpu.current_stream
stream = torch.cpu.stream
synchronize = torch.cpu.synchronize
is_initialized = torch.cpu.is_initialized


def is_available() -> bool:
    return True


def device_count() -> int:
    return 1


def current_device() -> str:
    return "cpu"


def set_device(device=None) -> None:
    """Nothing to select on the CPU."""


def get_device_name(device=None) -> str:
    return _platform.processor() or _platform.machine() or "cpu"


def empty_cache() -> None:
    """No device cache on the CPU."""


def ipc_collect() -> None:
    """No IPC handles on the CPU."""


def set_per_process_memory_fraction(fraction: float, device=None) -> None:
    """No device memory to cap on the CPU."""


def reset_peak_memory_stats(device=None) -> None:
    """The peak is the process's ``ru_maxrss``, which cannot be reset."""


def memory_allocated(device=None) -> int:
    return psutil.Process().memory_info().rss


memory_reserved = memory_allocated


def max_memory_allocated(device=None) -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux; the kernel updates it lazily
    return max(peak, memory_allocated())


max_memory_reserved = max_memory_allocated


def mem_get_info(device=None) -> tuple[int, int]:
    memory = psutil.virtual_memory()
    return memory.available, memory.total


def manual_seed(seed: int) -> None:
    torch.manual_seed(seed)


manual_seed_all = manual_seed


def get_rng_state(device=None) -> torch.Tensor:
    return torch.get_rng_state()


def set_rng_state(state: torch.Tensor, device=None) -> None:
    torch.set_rng_state(state)
