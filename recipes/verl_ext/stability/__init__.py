"""KL control, the KL guard, monitoring bands and the rollback supervisor for verl 0.9.1 runs.

==================  =====================================================================================
module              what
==================  =====================================================================================
``kl_control``      target schedules (fixed, adaptive, ramp) and the loss-side coefficient controller
``guard``           the KL guard's logic: stop a step's remaining PPO updates past ``kl.guard.max_kl``
``verl_hooks``      imported in every verl process: registers the trainer, wires the guard into the worker
``trainer``         ``StabilityTrainer``: verl's sync v1 trainer + guard, KL control, fault detection
``bands``           monitoring bands: evaluation, driver monitor, summary (bands.json / bands.txt)
``rollback``        the supervisor: attempts in child processes, degradations, attempts.jsonl
``faults``          why an attempt failed: the exception types and the attempt's exit
``tee``             one metrics.jsonl across restarts and resumes (verl's file logger truncates its own)
``entropy``         the Clip-Cov / KL-Cov on-policy warning
==================  =====================================================================================

:func:`supervise` is what ``recipes/run/train.py`` calls around verl's ``run_ppo``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from recipes.check.schema import Stability, load_section
from recipes.verl_ext.stability.entropy import entropy_warnings

__all__ = ["HOOKS_MODULE", "entropy_warnings", "supervise"]

HOOKS_MODULE = "recipes.verl_ext.stability.verl_hooks"
"""Module to name in ``VERL_USE_EXTERNAL_MODULES`` so every Ray worker registers the trainer and the guard."""


def supervise(cfg, run_dir: Path, runner: Callable, metrics_path: Path, out=print) -> None:
    """Run ``runner(cfg)`` (verl's run_ppo) under the bands monitor; with ``stability.mode=auto`` under the
    rollback supervisor (attempts in child processes; ``runner`` must be a module-level function)."""
    # lazy: the CLI loads this package at start (validate reads .entropy); the monitor is for training only (~2 ms)
    from recipes.verl_ext.stability.bands import BandMonitor, bands_from_config

    mode = load_section(Stability, cfg.get("stability"), "stability").mode
    record_dir = (cfg.get("run") or {}).get("record_dir")
    with BandMonitor(metrics_path, bands_from_config(cfg), run_dir, out=out):
        if mode == "auto":
            # lazy: as bands above, and only stability.mode=auto runs the supervisor (~2 ms, multiprocessing)
            from recipes.verl_ext.stability.rollback import Supervisor

            Supervisor(cfg, run_dir, runner, out=out).run()
        elif record_dir:  # run.resume: verl's file logger truncates its file, so it gets one of its own
            from recipes.verl_ext.stability.tee import teed_metrics  # lazy: as bands above

            with teed_metrics(cfg, Path(record_dir) / "metrics.jsonl", metrics_path,
                              {"resume": int(Path(record_dir).name.rsplit("_", 1)[1])}):
                runner(cfg)
        else:
            runner(cfg)
