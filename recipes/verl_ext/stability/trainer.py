"""The pack's v1 trainer: verl 0.9.1's synchronous PPO trainer plus the KL guard, KL control and fault detection.

Selected with ``trainer.v1.trainer_mode=stability`` (the ``stability/`` group sets it) through verl's own trainer
registry (:mod:`.verl_hooks` registers it in every process). Once built it runs exactly as verl's ``sync`` mode; it
overrides only:

- ``_update_actor``: sends the guard threshold and the controller's loss-side KL coefficient with the update batch,
  checks that the guard answered (a guard that did not run is an error, not a silent skip), and lifts the worker's
  ``actor/guard/*`` metrics to ``guard/*``;
- ``step``: before, the in-reward controller gets the scheduled target; after, fault detection (NaN/Inf loss, repeated
  band violations, an injected fault) raises :class:`StabilityFault` *before* verl saves the step's checkpoint, then
  :class:`~.kl_control.KLControl` updates and its ``kl_control/*`` metrics join the step's;
- ``_save_checkpoint`` / ``_load_checkpoint``: the controller's state goes into, and comes back from, each
  ``global_step_<n>`` folder (``kl_control.json``), together with verl's in-reward coefficient; after it, the
  completeness marker (``checkpoint_complete.json``, :mod:`recipes.run.checkpoints`): only a marked checkpoint counts.
"""

from __future__ import annotations

import logging
import math
import os

from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from recipes.check.schema import Stability, load_section
from recipes.run.checkpoints import mark_complete
from recipes.verl_ext.stability.bands import RollbackRule, bands_from_config
from recipes.verl_ext.stability.guard import GUARD_KEY, INJECT_KEY, KL_COEF_KEY, METRICS
from recipes.verl_ext.stability.kl_control import KLControl, KLSettings, sequences_per_step

logger = logging.getLogger(__name__)

FAULT_MARKER = "StabilityFault"
LOSS_KEYS = ("actor/pg_loss", "actor/loss", "actor/kl_loss", "critic/vf_loss", "critic/loss")


class StabilityFault(RuntimeError):
    """A training step turned unstable; the message starts with ``StabilityFault[<reason>]``."""

    def __init__(self, reason: str, detail: str):
        self.reason = reason
        super().__init__(f"{FAULT_MARKER}[{reason}] {detail}")


class StabilityTrainer(PPOTrainerSync):
    """verl's ``PPOTrainerSync`` with the guard, the KL controller and fault detection."""

    def __init__(self, config):
        # registered under its own name, it runs as verl's sync mode (replay buffer, checkpoints, refill rules)
        config.trainer.v1.trainer_mode = "sync"
        super().__init__(config)
        self.kl_control = KLControl(KLSettings.from_config(config))
        stability = load_section(Stability, config.get("stability"), "stability")  # the pack's keys, typed
        self.stability_mode = stability.mode
        self.inject = stability.inject
        self.attempt = stability.attempt
        limit = stability.band_violations if stability.mode == "auto" else 0
        self.band_rule = RollbackRule(bands_from_config(config), limit)

    # ---- the actor update: guard and coefficient go with the batch ----

    def _update_actor(self, batch, metrics):
        max_kl = self.kl_control.settings.max_kl
        if max_kl is not None:
            batch.extra_info[GUARD_KEY] = max_kl
        if self.kl_control.drives_loss_coef and self.config.actor_rollout_ref.actor.use_kl_loss:
            batch.extra_info[KL_COEF_KEY] = self.kl_control.state.loss_coef
        fault = self._worker_fault()
        if fault:
            batch.extra_info[INJECT_KEY] = fault
        batch = super()._update_actor(batch, metrics)
        for key in METRICS:
            value = metrics.pop(f"actor/{key}", None)
            if value is not None:
                metrics[key] = value
        if max_kl is not None and "guard/updates" not in metrics:
            raise RuntimeError(
                "stability: the KL guard did not report from the actor's update: recipes.verl_ext.stability.verl_hooks "
                "is not loaded in the Ray workers (VERL_USE_EXTERNAL_MODULES)"
            )
        return batch

    # ---- the step: schedule, fault detection, controller update ----

    def step(self, metrics, timing_raw):
        reward_ctrl = getattr(self, "kl_ctrl_in_reward", None)
        drives_reward = reward_ctrl is not None and self.kl_control.drives_reward_coef
        if reward_ctrl is not None and hasattr(reward_ctrl, "target") and self.kl_control.state.target is not None:
            reward_ctrl.target = self.kl_control.state.target
        if drives_reward:  # verl applies this value in the step, then moves it its own way: the pack's rule wins
            reward_ctrl.value = self.kl_control.state.reward_coef
        batch = super().step(metrics, timing_raw)
        self._inject_faults(metrics)
        self._detect_faults(metrics)
        if reward_ctrl is not None and not drives_reward:
            self.kl_control.state.reward_coef = float(reward_ctrl.value)
        metrics.update(self.kl_control.update(self.global_steps, metrics.get("actor/kl_loss"),
                                              sequences_per_step(self.config),
                                              reward_kl=metrics.get("actor/reward_kl_penalty")))
        return batch

    def _inject_faults(self, metrics) -> None:
        """Test hook: ``stability.inject.nan_at_step=N`` turns step N's policy loss into NaN (first attempt only)."""
        if self.attempt != self.inject.attempt:
            return
        if self.inject.nan_at_step == self.global_steps:
            logger.warning("stability: injecting a NaN policy loss at step %d", self.global_steps)
            metrics["actor/pg_loss"] = float("nan")
        if self.inject.kill_at_step == self.global_steps:
            logger.warning("stability: killing the TaskRunner process at step %d", self.global_steps)
            os._exit(137)

    def _worker_fault(self) -> str | None:
        """Test hook: the fault the actor's worker injects in this step's update (``oom`` | ``nan_weights``)."""
        if self.inject.oom_at_step == self.global_steps and self.attempt == self.inject.oom_attempt:
            return "oom"
        if self.inject.nan_weights_at_step == self.global_steps and self.attempt == self.inject.nan_weights_attempt:
            return "nan_weights"
        return None

    def _detect_faults(self, metrics) -> None:
        for key in LOSS_KEYS:
            value = metrics.get(key)
            if value is not None and not math.isfinite(float(value)):
                raise StabilityFault("nan_loss", f"{key}={value} at step {self.global_steps}")
        why = self.band_rule.check(metrics, self.global_steps)
        if why:
            raise StabilityFault("bands", why)

    # ---- checkpoints carry the controller ----

    def _save_checkpoint(self):
        super()._save_checkpoint()
        folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        self.kl_control.save(folder)
        mark_complete(folder, self.global_steps)  # last: only now does the checkpoint count (recipes.run.checkpoints)

    def _load_checkpoint(self):
        super()._load_checkpoint()
        if self.global_steps == 0:
            return
        folder = self.config.trainer.default_local_dir
        if not os.path.isabs(folder):
            folder = os.path.join(os.getcwd(), folder)
        if self.config.trainer.resume_mode == "resume_path":
            folder = self.config.trainer.resume_from_path
        else:
            folder = os.path.join(folder, f"global_step_{self.global_steps}")
        if not self.kl_control.load(folder):
            logger.warning("stability: %s has no kl_control.json; the KL controller starts afresh", folder)
            return
        reward_ctrl = getattr(self, "kl_ctrl_in_reward", None)
        if reward_ctrl is not None and self.kl_control.state.reward_coef is not None:
            reward_ctrl.value = self.kl_control.state.reward_coef
        logger.warning("stability: KL controller restored from %s: step %d, target %s, loss coef %r",
                       folder, self.kl_control.state.step, self.kl_control.state.target,
                       self.kl_control.state.loss_coef)
