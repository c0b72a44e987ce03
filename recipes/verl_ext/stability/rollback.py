"""Rollback supervisor (``stability=auto``): restart an unstable run from its last good checkpoint, degraded.

Lives in the driver, outside Ray. Each attempt runs verl's ``run_ppo`` in a child process (its own Ray instance,
torn down with it), so a crashed worker, a killed TaskRunner or an out-of-memory error ends only that attempt.
After a failure the supervisor classifies it by the exception types and the attempt's exit (:mod:`.faults`:
``nan_loss``, ``bands``, ``nan_weights``, ``oom``, ``worker_lost``); anything else (a bug, a bad path) is not
retried. A retryable failure restarts from the latest *complete* checkpoint in ``trainer.default_local_dir``
(:mod:`recipes.run.checkpoints`; a partial or damaged one is named and skipped) with verl's
``trainer.resume_mode=resume_path`` and the next degradation applied on top of the previous ones, in this order:
``forward_prefetch`` off; token budgets and micro batches -20%; parameter and optimizer offload on. At most
``stability.max_attempts`` restarts. Rows of ``metrics.jsonl`` for steps after that checkpoint move to
``metrics.superseded.jsonl`` before the restart (those steps run again: each step is in ``metrics.jsonl`` once).
Every attempt, its reason, the degradation and the checkpoints present before and after go to ``attempts.jsonl``
in the run folder; attempt numbers go on across ``run.resume`` launches. The supervisor never deletes a checkpoint
and fails loudly if one disappears.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from recipes.check.schema import DEGRADATIONS, Stability, load_section
from recipes.record import yamlio
from recipes.record.records import write_atomic
from recipes.record.redact import redact_config
from recipes.run import checkpoints as ckpt
from recipes.run import gc_threshold
from recipes.run.resume import SUPERSEDED, keep_metrics_up_to
from recipes.verl_ext.stability.faults import RETRYABLE, classify, exit_description
from recipes.verl_ext.stability.tee import ENV_VARS, LOGGER_ENV, MetricsTee

PREFETCH_KEYS = (
    "actor_rollout_ref.actor.fsdp_config.forward_prefetch",
    "actor_rollout_ref.ref.fsdp_config.forward_prefetch",
    "critic.fsdp.forward_prefetch",
    "actor_rollout_ref.actor.megatron.override_ddp_config.overlap_param_gather",
)
BATCH_KEYS = (
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
    "critic.ppo_max_token_len_per_gpu",
    "critic.forward_max_token_len_per_gpu",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
    "critic.ppo_micro_batch_size_per_gpu",
    "critic.forward_micro_batch_size_per_gpu",
)
OFFLOAD_KEYS = (
    "actor_rollout_ref.actor.fsdp_config.param_offload",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload",
    "actor_rollout_ref.ref.fsdp_config.param_offload",
    "critic.fsdp.param_offload",
    "critic.fsdp.optimizer_offload",
    "actor_rollout_ref.actor.megatron.param_offload",
    "actor_rollout_ref.actor.megatron.optimizer_offload",
    "actor_rollout_ref.ref.megatron.param_offload",
)


def degrade(cfg: DictConfig, step: str) -> dict[str, tuple]:
    """Apply one degradation to ``cfg`` in place; returns {key: (before, after)} of what it changed."""
    changed: dict[str, tuple] = {}

    def put(key, value):
        before = OmegaConf.select(cfg, key, default=None)
        OmegaConf.update(cfg, key, value, force_add=False)
        changed[key] = (before, value)

    if step == "forward_prefetch_off":
        if OmegaConf.select(cfg, "overlap.forward_prefetch", default=None) is not None:
            put("overlap.forward_prefetch", False)
        for key in PREFETCH_KEYS:
            if OmegaConf.select(cfg, key, default=None) is not None:
                put(key, False)
    elif step == "batch_minus_20":
        for key in BATCH_KEYS:
            value = OmegaConf.select(cfg, key, default=None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                put(key, max(1, int(value * 0.8)))
    elif step == "offload_on":
        for key in OFFLOAD_KEYS:
            if OmegaConf.select(cfg, key, default=None) is not None:
                put(key, True)
    else:
        raise ValueError(f"stability: unknown degradation {step!r}; choose from {', '.join(DEGRADATIONS)}")
    return changed


def checkpoints(folder: Path) -> list[int]:
    return sorted(int(p.name.split("_")[-1]) for p in Path(folder).glob("global_step_*") if p.is_dir())


def _attempt_main(container: dict, fault_path: str, runner: Callable) -> None:
    """Child process: rebuild the config, run verl, write the failure (if any) for the parent."""
    gc_threshold.freeze_at_exit()  # its teardown skips collecting verl's heap (~1.4 s of each attempt's end)
    cfg = OmegaConf.create(container)
    metrics = OmegaConf.select(cfg, f"{ENV_VARS}.{LOGGER_ENV}", default=None)
    if metrics:
        os.environ[LOGGER_ENV] = metrics
    try:
        runner(cfg)
    except BaseException as error:  # noqa: BLE001 - everything is reported to the parent, then re-raised
        text = "".join(traceback.format_exception(error))
        write_atomic(fault_path, json.dumps({"reason": classify(text), "message": text[-4000:]}))
        raise


class Supervisor:
    """Runs attempts until one finishes or no attempt is left."""

    def __init__(self, cfg: DictConfig, run_dir: Path, runner: Callable, out=print):
        self.cfg, self.run_dir, self.runner, self.out = cfg, Path(run_dir), runner, out
        stability = load_section(Stability, cfg.get("stability"), "stability")  # the pack's keys, typed
        self.max_attempts = stability.max_attempts
        self.degradations = list(stability.degradations or DEGRADATIONS)  # an empty list: all, in order
        self.log_path = self.run_dir / "attempts.jsonl"
        self.metrics_path = Path(OmegaConf.select(cfg, f"{ENV_VARS}.{LOGGER_ENV}", default=None)
                                 or self.run_dir / "metrics.jsonl")
        if int(OmegaConf.select(cfg, "trainer.save_freq", default=-1) or -1) <= 0:
            out("stability: trainer.save_freq <= 0: no checkpoint to roll back to; a restart starts from step 0")
        self.ckpt_dir = Path(cfg.trainer.default_local_dir)
        self._told: set[str] = set()

    def _record(self, entry: dict) -> None:
        with self.log_path.open("a") as f:
            f.write(json.dumps(entry, default=str) + "\n")

    def run(self) -> int:
        """Returns the number of restarts; raises when the run cannot finish."""
        ctx = multiprocessing.get_context("spawn")
        applied: list[str] = []
        changes: dict = {}
        first = attempt = self._first_attempt()
        while True:
            start = self._choose_start(restart=attempt > first)
            OmegaConf.update(self.cfg, "stability.attempt", attempt, force_add=True)
            container = OmegaConf.to_container(self.cfg, resolve=True)
            fault_path = self.run_dir / f"attempt_{attempt}_fault.json"
            fault_path.unlink(missing_ok=True)
            before = checkpoints(self.ckpt_dir)
            started = time.time()
            tee = MetricsTee(self.run_dir / f"metrics.attempt_{attempt}.jsonl", self.metrics_path,
                             {"attempt": attempt})
            env_vars = container.setdefault("ray_kwargs", {}).setdefault("ray_init", {})
            env_vars = env_vars.setdefault("runtime_env", {}).setdefault("env_vars", {})
            env_vars[LOGGER_ENV] = str(tee.source)
            write_atomic(self.run_dir / f"attempt_{attempt}_config.yaml", yamlio.dump(redact_config(container)))
            proc = ctx.Process(target=_attempt_main, args=(container, str(fault_path), self.runner))
            proc.start()
            while proc.is_alive():
                tee.pump()
                proc.join(timeout=0.5)
            tee.pump()
            after = checkpoints(self.ckpt_dir)
            entry = {"attempt": attempt, "degradations": list(applied), "changes": changes,
                     "resumed_from_step": start, "checkpoints_before": before,
                     "checkpoints_after": after, "seconds": round(time.time() - started, 1),
                     "exitcode": proc.exitcode}
            lost = sorted(set(before) - set(after))
            if proc.exitcode == 0:
                self._record({**entry, "outcome": "finished"})
                if lost:
                    raise RuntimeError(f"stability: checkpoints {lost} disappeared during attempt {attempt}")
                return attempt - first
            reason, summary = self._failure(fault_path, proc.exitcode)
            retry = reason in RETRYABLE and attempt - first < self.max_attempts
            self._record({**entry, "outcome": "restart" if retry else "failed", "reason": reason,
                          "message": summary})
            if lost:
                raise RuntimeError(f"stability: checkpoints {lost} disappeared during attempt {attempt}")
            if not retry:
                why = "not a stability failure" if reason not in RETRYABLE else f"{self.max_attempts} restarts used"
                raise RuntimeError(f"stability: attempt {attempt} failed ({reason}: {summary}); {why}; "
                                   f"see {self.log_path}")
            attempt += 1
            step = self.degradations[min(len(applied), len(self.degradations) - 1)]
            if step not in applied:
                applied.append(step)
                changes = degrade(self.cfg, step)
            else:
                changes = {}
            self.out(f"stability: attempt {attempt - 1} failed ({reason}: {summary}); restart {attempt - first}/"
                     f"{self.max_attempts} with {step} ({len(changes)} keys changed)")

    def _first_attempt(self) -> int:
        """Attempt numbers go on across run.resume launches of one folder (each attempt's files stay)."""
        taken = [int(p.name.split("_")[1]) for p in self.run_dir.glob("attempt_*_config.yaml")
                 if p.name.split("_")[1].isdigit()]
        return max(taken, default=-1) + 1

    def _choose_start(self, restart: bool) -> int:
        """Point verl at the latest complete checkpoint (partial or damaged ones named and skipped); on a restart,
        metrics rows after it move aside. Returns the step the attempt starts after."""
        typed = OmegaConf.select(self.cfg, "trainer.resume_from_path", default=None)
        if not restart and OmegaConf.select(self.cfg, "trainer.resume_mode") == "resume_path" and typed:
            return ckpt.step_of(Path(typed)) or 0  # run.resume's choice, or the user's
        found = ckpt.scan(self.ckpt_dir)
        for line in found.notices():
            if line not in self._told:
                self._told.add(line)
                self.out(f"stability: {line}")
        if found.latest is not None:
            step, folder = found.latest
            OmegaConf.update(self.cfg, "trainer.resume_mode", "resume_path")
            OmegaConf.update(self.cfg, "trainer.resume_from_path", str(folder), force_add=True)
        elif restart or found.rejected:
            step = 0
            OmegaConf.update(self.cfg, "trainer.resume_mode", "disable")
        else:
            return 0  # a first attempt with no checkpoint: the run's own resume settings
        if restart:
            self.out(f"stability: restarting from checkpoint step {step}")
            keep_metrics_up_to(self.metrics_path, step, self.run_dir / SUPERSEDED)
        return step

    def _failure(self, fault_path: Path, exitcode: int | None) -> tuple[str, str]:
        """(reason, the error's last line) of a failed attempt."""
        if fault_path.is_file():
            fault = json.loads(fault_path.read_text())
        else:  # the attempt process died without writing its failure (a signal, os._exit)
            fault = {"reason": "worker_lost", "message": f"the attempt process {exit_description(exitcode)}"}
        message = fault["message"].strip()
        return fault["reason"], message.splitlines()[-1][:300] if message else ""
