"""A CPU platform for verl's ``PlatformRegistry``: device ``cpu``, collectives over ``gloo``.

It is registered only on a machine whose torch build has no accelerator (the CPU wheel: no CUDA, no ROCm, no NPU),
or when ``VERL_PLATFORM=cpu`` asks for it, so importing the plugin where an accelerator exists changes nothing.
Ray still schedules verl's workers on ``GPU`` resources; on CPU those are logical (``ray_init.num_gpus``, see
``cpu_overrides``), which keeps verl's resource-pool arithmetic unchanged.
"""

from __future__ import annotations

import importlib.util
import os
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch
from verl.plugin.platform import PlatformBase

import recipes.verl_ext.plugin.cpu_device as cpu_device

__all__ = ["PLATFORM_NAME", "PlatformCPU", "accelerator_build", "cpu_platform_wanted"]

PLATFORM_NAME = "cpu"


def accelerator_build() -> str | None:
    """The accelerator this torch build targets (``"cuda"``, ``"rocm"``, ``"npu"``, ``"xpu"``), or None for a CPU build.

    A build, not a visible device: a CPU-only Ray actor on a GPU node sees no device but still runs a CUDA build,
    and must keep verl's CUDA platform.
    """
    if torch.version.hip is not None:
        return "rocm"
    if torch.version.cuda is not None:
        return "cuda"
    if hasattr(torch, "npu") or importlib.util.find_spec("torch_npu") is not None:
        return "npu"
    if getattr(torch, "xpu", None) is not None and torch.xpu.is_available():
        return "xpu"
    return None


def cpu_platform_wanted() -> bool:
    """True where verl should run on the CPU platform: asked for with ``VERL_PLATFORM=cpu``, or no accelerator build."""
    requested = os.environ.get("VERL_PLATFORM", "").strip().lower()
    if requested:
        return requested == PLATFORM_NAME
    return accelerator_build() is None


class PlatformCPU(PlatformBase):
    """verl's platform interface on the CPU. Profiling hooks are no-ops; ``cudart`` is None."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return cpu_device

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return cpu_platform_wanted()

    def current_device(self) -> str:
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets it for actors holding (logical) GPUs; verl's Worker reads it back. CPU torch ignores it.
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None
