"""Rollback supervisor (``stability=auto``): restart an unstable run from its last good checkpoint, degraded.

Lives in the driver, outside Ray. Each attempt runs verl's ``run_ppo`` in a child process (its own Ray instance,
torn down with it), so a crashed worker, a killed TaskRunner or an out-of-memory error ends only that attempt.
After a failure the supervisor classifies it:

- ``nan_loss``  a NaN/Inf loss (the trainer raises ``StabilityFault[nan_loss]`` before saving that step);
- ``bands``     ``stability.band_violations`` steps in a row outside a band marked ``unstable``;
- ``oom``       an out-of-memory error anywhere in the run;
- ``worker_died`` a Ray worker or the TaskRunner died (the OOM killer looks like this);

anything else (a bug, a bad path) is not retried. A retryable failure restarts from the latest checkpoint in
``trainer.default_local_dir`` (``trainer.resume_mode=auto``) with the next degradation applied on top of the previous
ones, in this order: ``forward_prefetch`` off; token budgets and micro batches -20%; parameter and optimizer offload
on. At most ``stability.max_attempts`` restarts. Every attempt, its reason, the degradation and the checkpoints
present before and after go to ``attempts.jsonl`` in the run folder; the supervisor never deletes a checkpoint and
fails loudly if one disappears.
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

from recipes import yamlio
from recipes.redact import redact_config
from recipes.schema import DEGRADATIONS, Stability, load_section

ENV_VARS = "ray_kwargs.ray_init.runtime_env.env_vars"
LOGGER_ENV = "VERL_FILE_LOGGER_PATH"
RETRYABLE = ("nan_loss", "bands", "oom", "worker_died")

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


def classify(message: str) -> str:
    """The failure's reason from its text (the exception chain as the driver sees it)."""
    if "StabilityFault[" in message:
        return message.split("StabilityFault[", 1)[1].split("]", 1)[0]
    lowered = message.lower()
    if "out of memory" in lowered or "outofmemoryerror" in lowered or "oom" in lowered.split():
        return "oom"
    if any(word in message for word in ("ActorDiedError", "RayActorError", "WorkerCrashedError",
                                        "ActorUnavailableError", "exit code 137", "SIGKILL")):
        return "worker_died"
    return "error"


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
    cfg = OmegaConf.create(container)
    metrics = OmegaConf.select(cfg, f"{ENV_VARS}.{LOGGER_ENV}", default=None)
    if metrics:
        os.environ[LOGGER_ENV] = metrics
    try:
        runner(cfg)
    except BaseException as error:  # noqa: BLE001 - everything is reported to the parent, then re-raised
        text = "".join(traceback.format_exception(error))
        Path(fault_path).write_text(json.dumps({"reason": classify(text), "message": text[-4000:]}))
        raise


class MetricsTee:
    """Appends each attempt's metrics lines (verl's file logger truncates its file at start) to the run's
    metrics.jsonl, tagged with the attempt, so the progress printer and the bands monitor follow one file."""

    def __init__(self, source: Path, target: Path, attempt: int):
        self.source, self.target, self.attempt, self._done = source, target, attempt, 0

    def pump(self) -> None:
        if not self.source.is_file():
            return
        lines = self.source.read_text().splitlines(keepends=True)
        complete = [line for line in lines if line.endswith("\n")]
        new = complete[self._done:]
        if not new:
            return
        with self.target.open("a") as f:
            for line in new:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                f.write(json.dumps({**row, "attempt": self.attempt}) + "\n")
        self._done = len(complete)


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

    def _record(self, entry: dict) -> None:
        with self.log_path.open("a") as f:
            f.write(json.dumps(entry, default=str) + "\n")

    def run(self) -> int:
        """Returns the number of restarts; raises when the run cannot finish."""
        ctx = multiprocessing.get_context("spawn")
        applied: list[str] = []
        changes: dict = {}
        attempt = 0
        while True:
            OmegaConf.update(self.cfg, "stability.attempt", attempt, force_add=True)
            OmegaConf.update(self.cfg, "trainer.resume_mode", "auto")
            container = OmegaConf.to_container(self.cfg, resolve=True)
            fault_path = self.run_dir / f"attempt_{attempt}_fault.json"
            fault_path.unlink(missing_ok=True)
            before = checkpoints(self.ckpt_dir)
            started = time.time()
            tee = MetricsTee(self.run_dir / f"metrics.attempt_{attempt}.jsonl", self.metrics_path, attempt)
            env_vars = container.setdefault("ray_kwargs", {}).setdefault("ray_init", {})
            env_vars = env_vars.setdefault("runtime_env", {}).setdefault("env_vars", {})
            env_vars[LOGGER_ENV] = str(tee.source)
            (self.run_dir / f"attempt_{attempt}_config.yaml").write_text(yamlio.dump(redact_config(container)))
            proc = ctx.Process(target=_attempt_main, args=(container, str(fault_path), self.runner))
            proc.start()
            while proc.is_alive():
                tee.pump()
                proc.join(timeout=0.5)
            tee.pump()
            after = checkpoints(self.ckpt_dir)
            entry = {"attempt": attempt, "degradations": list(applied), "changes": changes,
                     "resumed_from_step": before[-1] if before else 0, "checkpoints_before": before,
                     "checkpoints_after": after, "seconds": round(time.time() - started, 1),
                     "exitcode": proc.exitcode}
            lost = sorted(set(before) - set(after))
            if proc.exitcode == 0:
                self._record({**entry, "outcome": "finished"})
                if lost:
                    raise RuntimeError(f"stability: checkpoints {lost} disappeared during attempt {attempt}")
                return attempt
            fault = json.loads(fault_path.read_text()) if fault_path.is_file() else {
                "reason": "worker_died", "message": f"attempt process exited with code {proc.exitcode}"}
            reason = fault["reason"]
            summary = fault["message"].strip().splitlines()[-1][:300] if fault["message"].strip() else ""
            retry = reason in RETRYABLE and attempt < self.max_attempts
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
            resume = after[-1] if after else 0
            self.out(f"stability: attempt {attempt - 1} failed ({reason}: {summary}); restart {attempt}/"
                     f"{self.max_attempts} from checkpoint step {resume} with {step} "
                     f"({len(changes)} keys changed)")
