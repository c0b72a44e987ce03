"""The pack's OmegaConf resolvers (``${pack.*:...}``), registered once by entry points and tests alike."""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import OmegaConf

_ASSET_FILES = {
    # key -> path inside the tiny-asset folder (hybrid_engine.assets builds them on first use)
    "model": "model",
    "train": "data/train.parquet",
    "val": "data/val.parquet",
    "reward": "reward.py",
}


def pack_data_dir() -> Path:
    """Where locally built assets live: $PACK_DATA_DIR, else ~/.cache/klppo-recipes."""
    root = os.environ.get("PACK_DATA_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "klppo-recipes")
    return Path(root)


def _leftover(world_size, *degrees) -> int:
    """world_size / prod(degrees) when it divides, else -1 (validation then shows the arithmetic)."""
    product = 1
    for degree in degrees:
        product *= int(degree)
    if product <= 0 or int(world_size) % product:
        return -1
    return int(world_size) // product


def _megatron_only(strategy: str, degree) -> int:
    """A model-parallel degree that only Megatron trains with; verl's FSDP engines shard over all ranks instead."""
    return int(degree) if strategy == "megatron" else 1


def _token_budget(factor, max_prompt_length, max_response_length) -> int:
    """Tokens per GPU per micro-batch: factor * (max_prompt_length + max_response_length), rounded down."""
    return int(float(factor) * (int(max_prompt_length) + int(max_response_length)))


def _nccl_env(env, megatron_env, strategy: str) -> dict:
    merged = dict(OmegaConf.to_container(env, resolve=True) if env is not None else {})
    if strategy == "megatron" and megatron_env is not None:
        merged.update(OmegaConf.to_container(megatron_env, resolve=True))
    return {str(k): str(v) for k, v in merged.items()}


def _run_dir() -> str:
    """Hydra's output folder of this run; outside a Hydra run (tests, compose API) a fixed placeholder."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return str(HydraConfig.get().runtime.output_dir)
    return os.path.join("runs", "compose")


def _asset(key: str) -> str:
    if key not in _ASSET_FILES:
        raise ValueError(f"pack.asset: unknown asset {key!r}; choose from {sorted(_ASSET_FILES)}")
    return str(pack_data_dir() / "tiny" / _ASSET_FILES[key])


RESOLVERS = {
    "pack.leftover": _leftover,
    "pack.mul": lambda *xs: _product(xs),
    "pack.megatron_only": _megatron_only,
    "pack.token_budget": _token_budget,
    "pack.nccl_env": _nccl_env,
    "pack.run_dir": _run_dir,
    "pack.asset": _asset,
}


def _product(values) -> int:
    out = 1
    for value in values:
        out *= int(value)
    return out


def register_resolvers() -> None:
    """Register every ``pack.*`` resolver once (safe to call repeatedly)."""
    for name, fn in RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
