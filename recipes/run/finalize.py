"""Finalize a validated run for verl, once, before the record is written: what verl's trainer then receives.

A validated run says what to train; finalizing adds how this run is wired, and nothing changes the config after:

- loggers: verl's ``file`` logger always (``metrics.jsonl`` in the run folder);
- the environment of every Ray worker (``ray_kwargs.ray_init.runtime_env.env_vars``): where the loggers write,
  the pack's verl plugin and stability hooks loaded loudly, the weight sync log, TransferQueue's thread count;
- ray.init: the keys that describe a cluster to start are dropped when this process joins an existing one;
- ``trainer.device``: what verl's own ``auto_set_device`` would set on this machine.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil
from omegaconf import DictConfig, OmegaConf, open_dict

from recipes import envvars
from recipes.check.validate import ValidatedRun
from recipes.cluster.nccl_env import ENV_KEY, WorkerEnv, adapt_ray_init, worker_env
from recipes.errors import ConfigError
from recipes.verl_ext import api as verl
from recipes.verl_ext.stability import HOOKS_MODULE

# verl hides plugin import errors; naming the plugin and the stability hooks here makes a refusal (wrong verl) loud
# in every worker, and registers the stability trainer and the KL guard there
EXTERNAL_MODULES = f"recipes.verl_ext.plugin,{HOOKS_MODULE}"


@dataclass(frozen=True)
class FinalRun:
    """A validated run wired to its run folder: ``cfg`` is exactly the config verl's trainer receives (read-only)."""

    cfg: DictConfig
    run: ValidatedRun
    run_dir: Path
    env: dict[str, str]
    """what every Ray worker gets from the pack (also set, where unset, in this driver for its own trackers)"""
    workers: WorkerEnv
    """the variables in effect in every Ray worker, where each comes from, and their conflicts"""
    notes: tuple[str, ...]


def loggers(cfg: DictConfig) -> list[str]:
    """``trainer.logger`` as a list: verl's Tracking takes one backend name or a list of them."""
    given = cfg.trainer.logger
    return [str(given)] if isinstance(given, str) else [str(x) for x in given or []]


def run_env(cfg: DictConfig, run_dir: Path, environ: Mapping[str, str]) -> dict[str, str]:
    """Environment for every Ray worker of this run: where the loggers write, the plugin loaded loudly."""
    env = {
        "VERL_FILE_LOGGER_PATH": str(run_dir / "metrics.jsonl"),
        "TENSORBOARD_DIR": str(run_dir / "tensorboard"),
        "WANDB_DIR": str(run_dir),
        "VERL_USE_EXTERNAL_MODULES": EXTERNAL_MODULES,
        # each actor rank appends what it received per weight sync (the hf rollout's resharder hand-off)
        envvars.SYNC_LOG: str(run_dir / "weight_sync.jsonl"),
        # TransferQueue asks torch for 8 threads and warns on every put/get where the machine has fewer cores
        "TQ_NUM_THREADS": environ.get("TQ_NUM_THREADS", str(min(8, psutil.cpu_count(logical=False) or 1))),
    }
    if "wandb" in loggers(cfg) and not environ.get("WANDB_API_KEY"):
        env["WANDB_MODE"] = "offline"
    if OmegaConf.select(cfg, "run.flash_attn_fallbacks") is False:  # verl's own code where flash-attn is missing
        env[envvars.FLASH_ATTN_FALLBACKS] = "0"
    return env


def finalize(run: ValidatedRun, run_dir: str | os.PathLike, environ: Mapping[str, str] | None = None) -> FinalRun:
    """The config verl receives for this run, and what goes with it; ConfigError when Ray would refuse the env."""
    environ = dict(os.environ if environ is None else environ)
    run_dir = Path(run_dir).resolve()
    cfg = copy.deepcopy(run.cfg)
    OmegaConf.set_readonly(cfg, False)
    with open_dict(cfg):
        chosen = loggers(cfg)
        cfg.trainer.logger = chosen if "file" in chosen else [*chosen, "file"]  # metrics.jsonl always
        env = run_env(cfg, run_dir, environ)
        given = OmegaConf.select(cfg, ENV_KEY) or {}
        merged = {**OmegaConf.to_container(OmegaConf.create(given)), **env}
        OmegaConf.update(cfg, ENV_KEY, merged, merge=False, force_add=True)
        notes = adapt_ray_init(cfg, environ)
        device = verl.detected_device(cfg)
        if device:
            notes.append(f"note: trainer.device={device} (verl's auto_set_device on this machine)")
            cfg.trainer.device = device
    workers = worker_env(cfg, environ)
    if workers.problems:
        raise ConfigError(workers.problems)
    OmegaConf.set_readonly(cfg, True)
    return FinalRun(cfg=cfg, run=run, run_dir=run_dir, env=env, workers=workers, notes=tuple(notes))
