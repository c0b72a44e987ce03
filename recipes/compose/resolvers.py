"""The pack's OmegaConf resolvers (``${pack.*:...}``), registered once by entry points and tests alike."""

from __future__ import annotations

import math
import os

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from recipes.cluster.ray_resources import cpus_needed
from recipes.compose import parse_memo

_ASSET_FIELDS = {
    # key -> field of recipes.verl_ext.demo.TinyAssets (built on first use, then cached)
    "model": "model_dir",
    "train": "train_parquet",
    "val": "val_parquet",
    "reward": "reward_py",
}


def _leftover(world_size, *degrees) -> int:
    """world_size / prod(degrees) when it divides, else -1 (validation then shows the arithmetic)."""
    product = 1
    for degree in degrees:
        product *= int(degree)
    if product <= 0 or int(world_size) % product:
        return -1
    return int(world_size) // product


def _prompts_for(sequences, samples, ranks=1) -> int:
    """Prompts a step for about ``sequences`` sequences at ``samples`` per prompt: sequences // samples, at least 1
    (a count of samples that does not divide ``sequences`` gives the nearest batch below it), rounded down so that
    the step's sequences split over ``ranks`` data-parallel ranks as verl requires (50 sequences at 5 samples on 8
    ranks: 8 prompts, 40 sequences; at least the smallest count that splits)."""
    samples, ranks = max(1, int(samples)), max(1, int(ranks))
    step = ranks // math.gcd(samples, ranks)
    return max(step, max(1, int(sequences) // samples) // step * step)


def _megatron_only(strategy: str, degree) -> int:
    """A model-parallel degree that only Megatron trains with; verl's FSDP engines shard over all ranks instead."""
    return int(degree) if strategy == "megatron" else 1


def _token_budget(factor, max_prompt_length, max_response_length, role="actor", *, _root_=None) -> int:
    """Tokens per GPU per micro-batch of ``role`` (actor, logprob, critic): factor * (max_prompt_length +
    max_response_length), rounded down; a null factor: the memory model's auto budget (recipes.check.budget)."""
    from recipes.check.budget import token_budget  # lazy: the planner loads only for a config that asks for it

    return token_budget(str(role), factor, max_prompt_length, max_response_length, _root_)


def _engine_share(share, *, _root_=None) -> float:
    from recipes.check.budget import engine_memory_share  # lazy: the planner loads only for a config that asks for it

    return engine_memory_share(share, _root_)


def _engine_graphs(graphs, *, _root_=None):
    from recipes.check.budget import engine_graph_sizes  # lazy: as the share

    sizes = engine_graph_sizes(graphs, _root_)
    return OmegaConf.create(list(sizes)) if isinstance(sizes, list) else sizes


def _nccl_env(env, megatron_env, strategy: str) -> DictConfig:
    merged = dict(OmegaConf.to_container(env, resolve=True) if env is not None else {})
    if strategy == "megatron" and megatron_env is not None:
        merged.update(OmegaConf.to_container(megatron_env, resolve=True))
    # a config node, not a dict: OmegaConf.resolve (Hydra's --cfg job --resolve) can put a node in place of the
    # interpolation, not a plain dict
    return OmegaConf.create({str(k): str(v) for k, v in merged.items()})


def _run_dir() -> str:
    """Hydra's output folder of this run; before the job has one (``--cfg job --resolve`` prints the config first),
    the folder it would get (``hydra.run.dir``); outside a Hydra run (tests, compose API) a fixed placeholder."""
    if HydraConfig.initialized():
        hydra_cfg = HydraConfig.get()
        output_dir = OmegaConf.select(hydra_cfg, "runtime.output_dir", default=None)
        return str(output_dir if output_dir is not None else hydra_cfg.run.dir)
    return os.path.join("runs", "compose")


def _asset(key: str) -> str:
    """A path of the tiny asset set under $KLPPO_DATA_DIR; the set is built locally the first time (~2 s)."""
    if key not in _ASSET_FIELDS:
        raise ValueError(f"pack.asset: unknown asset {key!r}; choose from {sorted(_ASSET_FIELDS)}")
    # lazy: the CLI loads the resolvers at start; only a config that names a tiny asset needs the builder (~6 ms)
    from recipes.verl_ext.demo import ensure_tiny_assets

    return str(getattr(ensure_tiny_assets(), _ASSET_FIELDS[key]))


RESOLVERS = {
    "pack.leftover": _leftover,
    "pack.mul": lambda *xs: _product(xs),
    "pack.scale": lambda value, factor: float(value) * float(factor),
    "pack.prompts_for": _prompts_for,
    "pack.megatron_only": _megatron_only,
    "pack.token_budget": _token_budget,
    "pack.engine_share": _engine_share,
    "pack.engine_graphs": _engine_graphs,
    "pack.nccl_env": _nccl_env,
    "pack.run_dir": _run_dir,
    "pack.asset": _asset,
    "pack.ray_cpus": lambda ranks: max(16, cpus_needed(int(ranks))),
}


def _product(values) -> int:
    out = 1
    for value in values:
        out *= int(value)
    return out


def register_resolvers() -> None:
    """Register every ``pack.*`` resolver once (safe to call repeatedly), and keep OmegaConf's parses of
    interpolations for the rest of the process (recipes/compose/parse_memo.py)."""
    parse_memo.install()
    for name, fn in RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
