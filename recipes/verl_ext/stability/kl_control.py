"""KL control of the pack: the target schedule (fixed, adaptive, ramp) and the loss-side coefficient controller.

verl 0.9.1 adapts only the KL that is added to the reward (``algorithm.kl_ctrl``, Ziegler et al.) and keeps that
controller's value in memory only. This controller:

- moves the target: ``fixed`` has none, ``adaptive`` holds ``kl.target``, ``ramp`` rises linearly from
  ``kl.ramp.start`` to ``kl.ramp.end`` over ``kl.ramp.steps`` training steps;
- drives the coefficients toward the target with ``kl.controller.rule``:

  - ``pi`` (the default): a proportional-integral update on the log error ``e = log(kl / target)`` (clipped to
    +-2), in velocity form, with a bounded step: ``log coef += clip(kp * (e - e_prev) + ki * e, +-max_step)``. It
    acts on the loss-side coefficient (``actor.kl_loss_coef``, GRPO's ``use_kl_loss``) with the step's
    ``actor/kl_loss``, and on the in-reward one (verl's ``kl_ctrl_in_reward.value``, KL-PPO's ``use_kl_in_reward``)
    with an exponential average of the steps' ``actor/reward_kl_penalty`` (``kl.controller.reward_smoothing``: one
    batch's mean is noisy, and read raw it moved the coefficient by the full bound nearly every step). The step is
    a multiple of the coefficient, whatever its scale; the
    ``kp`` term answers a KL that is moving, the ``ki`` term one that stays off target; the bound keeps one noisy
    step from swinging it more than ``exp(max_step)``.
  - ``proportional``: verl's adaptive rule (Ziegler et al. 2019) on the loss-side coefficient,
    ``coef *= 1 + clip(kl / target - 1, -0.2, 0.2) * n / horizon``, ``n`` = sequences in the step; verl's own
    controller moves the in-reward one. Its correction is at most 20% of ``n / horizon`` a step: it lags a KL that
    grows with learning (the tiny demo crossed its target 6 steps late under it).
- sets the in-reward controller's target to the same schedule;
- has a JSON state (:meth:`KLControl.state_dict`) that the trainer writes into every checkpoint folder and reads back
  on resume, so a resumed run continues with the same step, target and both coefficients, bit for bit.

Pure Python: no verl, no torch; the trainer (:mod:`.trainer`) calls it once per step.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from recipes.check.schema import KL, load_section
from recipes.record.records import write_atomic

STATE_FILE = "kl_control.json"
"""File name of the controller state inside verl's ``global_step_<n>`` checkpoint folder."""

@dataclass(kw_only=True, slots=True)
class KLSettings:
    """What the ``kl/`` group sets (the pack's ``kl.*`` keys plus verl's ``kl_ctrl.horizon``)."""

    mode: str = "fixed"
    """fixed | adaptive | ramp"""
    target: float | None = None
    """target KL per token (adaptive; ramp: the value at step 0)"""
    ramp_start: float = 0.1
    """ramp only: target at step 0"""
    ramp_end: float = 0.3
    """ramp only: target once ``ramp_steps`` steps are done"""
    ramp_steps: int = 200
    """ramp only: training steps over which the target rises linearly"""
    horizon: float = 10000.0
    """sequences over which a full proportional correction is applied (verl's ``kl_ctrl.horizon``)"""
    init_loss_coef: float = 0.001
    """``actor.kl_loss_coef`` at step 0"""
    max_kl: float | None = 0.5
    """the guard: stop a step's remaining PPO updates once the policy KL passes this (None: no guard)"""
    rule: str = "pi"
    """pi | proportional (``kl.controller.rule``)"""
    kp: float = 0.5
    """pi: gain on the change of the log error"""
    ki: float = 0.1
    """pi: gain on the log error"""
    max_step: float = 0.2
    """pi: the largest change of log(coefficient) a step"""
    lookahead: float = 1.0
    """pi: steps over which the KL's last change is extrapolated before it is compared with the target"""
    reward_smoothing: float = 1.0
    """pi: weight of the newest in-reward KL in the average the in-reward coefficient follows (1: none)"""
    init_reward_coef: float | None = None
    """``algorithm.kl_ctrl.kl_coef`` where the run puts the KL in the reward; None where it does not"""

    @classmethod
    def from_config(cls, cfg) -> KLSettings:
        """From the full (verl + pack) config; a config without the pack's ``kl`` keys gives a fixed controller.
        The ``kl.*`` keys and their defaults are the pack's schema (:class:`recipes.check.schema.KL`); a bad value
        raises :class:`recipes.check.schema.SchemaError` (a ValueError) naming the key."""
        kl = load_section(KL, cfg.get("kl"), "kl")
        kl_ctrl = cfg.algorithm.get("kl_ctrl") or {}
        in_reward = bool(cfg.algorithm.get("use_kl_in_reward", False))
        return cls(
            mode=kl.mode,
            target=None if kl.target is None else float(kl.target),
            ramp_start=float(kl.ramp.start),
            ramp_end=float(kl.ramp.end),
            ramp_steps=kl.ramp.steps,
            horizon=float(kl_ctrl.get("horizon", 10000)),
            init_loss_coef=float(cfg.actor_rollout_ref.actor.get("kl_loss_coef", 0.001)),
            max_kl=None if kl.guard.max_kl is None else float(kl.guard.max_kl),
            rule=kl.controller.rule,
            kp=float(kl.controller.kp),
            ki=float(kl.controller.ki),
            max_step=float(kl.controller.max_step),
            lookahead=float(kl.controller.lookahead),
            reward_smoothing=float(kl.controller.reward_smoothing),
            init_reward_coef=float(kl_ctrl.get("kl_coef", 0.001)) if in_reward else None,
        )


def ramp_target(step: int, start: float, end: float, steps: int) -> float:
    """Target after ``step`` completed steps: ``start`` at 0, linear, ``end`` from ``steps`` on."""
    if steps <= 0:
        return end
    return start + (end - start) * min(step, steps) / steps


MAX_ERROR = 0.2
"""the rule's clip on the proportional error, ``kl / target - 1``"""


def proportional_update(coef: float, kl: float, target: float, n: int, horizon: float) -> float:
    """verl's AdaptiveKLController rule (Ziegler et al. 2019), applied to any coefficient."""
    error = min(max(kl / target - 1.0, -MAX_ERROR), MAX_ERROR)
    return coef * (1.0 + error * n / horizon)


MAX_LOG_ERROR = 2.0
"""the clip on ``log(kl / target)``: a KL of 0 (the first step) counts as ``target / e**2``"""
COEF_RANGE = (1e-6, 10.0)
"""the coefficients the PI rule keeps to: never 0 (a log), never a penalty that dwarfs any reward"""


def log_error(kl: float, target: float) -> float:
    """``log(kl / target)``, clipped to +-:data:`MAX_LOG_ERROR` (a KL of 0 or below: the lower clip)."""
    if kl <= 0:
        return -MAX_LOG_ERROR
    return min(max(math.log(kl / target), -MAX_LOG_ERROR), MAX_LOG_ERROR)


def pi_update(coef: float, error: float, last_error: float | None, kp: float, ki: float, max_step: float) -> float:
    """One step of the PI rule in velocity form on ``log(coef)``: ``kp * (error - last_error) + ki * error``,
    bounded to +-``max_step``; ``last_error`` None (the first update) counts as 0."""
    change = kp * (error - (last_error or 0.0)) + ki * error
    change = min(max(change, -max_step), max_step)
    low, high = COEF_RANGE
    return min(max(coef * math.exp(change), low), high)


def sequences_per_step(cfg) -> int:
    """``n`` of :func:`proportional_update` for a run: prompts a step times samples a prompt, as the trainer passes it
    to :meth:`KLControl.update` (verl's own controller is given the batch's length, the same number)."""
    return int(cfg.data.train_batch_size) * int(cfg.actor_rollout_ref.rollout.n)


def one_step_factors(n: int, horizon: float) -> tuple[float, float]:
    """The least and the greatest factor one step of :func:`proportional_update` can multiply a coefficient by, with
    ``n`` sequences a step. The least is 0 or below once ``n >= horizon / MAX_ERROR``: a KL measured far below its
    target then zeroes the coefficient or flips its sign (a reward for leaving the reference)."""
    step = MAX_ERROR * n / horizon
    return 1.0 - step, 1.0 + step


@dataclass(kw_only=True, slots=True)
class KLState:
    """Everything the controller needs to continue exactly; saved with each checkpoint."""

    step: int = 0
    """training steps the controller has seen"""
    target: float | None = None
    """target KL for the next step"""
    loss_coef: float = 0.001
    """``actor.kl_loss_coef`` for the next step"""
    reward_coef: float | None = None
    """the in-reward coefficient (verl's ``kl_ctrl_in_reward.value``) for the next step; None without it"""
    loss_error: list | None = None
    """pi: (log error, KL) of the last step that measured a loss-side KL"""
    reward_error: list | None = None
    """pi: (log error, KL) of the last step that measured an in-reward KL (the averaged KL)"""
    reward_kl_average: float | None = None
    """pi: the exponential average of the in-reward KL the in-reward coefficient follows"""
    history: list = field(default_factory=list)
    """(step, measured kl, target, loss_coef) per step, for the record"""


def _usable(kl: float | None) -> bool:
    return kl is not None and math.isfinite(kl)


class KLControl:
    """The schedule and the loss-side controller; one instance lives in the trainer."""

    def __init__(self, settings: KLSettings):
        self.settings = settings
        self.state = KLState(loss_coef=settings.init_loss_coef, target=self.target_at(0),
                             reward_coef=settings.init_reward_coef)

    def target_at(self, step: int) -> float | None:
        s = self.settings
        if s.mode == "ramp":
            return ramp_target(step, s.ramp_start, s.ramp_end, s.ramp_steps)
        if s.mode == "adaptive":
            return s.target
        return None

    @property
    def drives_loss_coef(self) -> bool:
        return self.settings.mode in ("adaptive", "ramp") and self.state.target is not None

    @property
    def drives_reward_coef(self) -> bool:
        """True where the pack sets verl's in-reward coefficient each step (rule ``pi``, KL in the reward)."""
        return self.drives_loss_coef and self.settings.rule == "pi" and self.settings.init_reward_coef is not None

    def update(self, step: int, measured_kl: float | None, n_sequences: int,
               reward_kl: float | None = None) -> dict[str, float]:
        """After training step ``step``: move the coefficients toward the step's target, then the target on.

        ``measured_kl`` is the step's loss-side KL (``actor/kl_loss``), ``reward_kl`` the in-reward one
        (``actor/reward_kl_penalty``); None (not measured) leaves that coefficient. Returns the step's metrics:
        ``kl_control/target`` and ``kl_control/loss_coef`` as used in this step, ``kl_control/next_loss_coef`` for
        the next one, ``kl_control/reward_coef`` (the in-reward value used in this step, where there is one).
        """
        st = self.state
        target_used, coef_used, reward_used = st.target, st.loss_coef, st.reward_coef
        if self.drives_loss_coef and _usable(measured_kl) and target_used:
            if self.settings.rule == "pi":
                st.loss_coef, st.loss_error = self._pi(coef_used, measured_kl, target_used, st.loss_error)
            else:
                st.loss_coef = proportional_update(coef_used, measured_kl, target_used, n_sequences,
                                                   self.settings.horizon)
        # an in-reward KL at or below 0 (the first step's policy is the reference) says nothing of its level
        if self.drives_reward_coef and _usable(reward_kl) and reward_kl > 0 and target_used and reward_used is not None:
            # one batch's mean in-reward KL is noisy: the coefficient follows its exponential average
            weight, average = self.settings.reward_smoothing, st.reward_kl_average
            st.reward_kl_average = reward_kl if average is None else weight * reward_kl + (1 - weight) * average
            st.reward_coef, st.reward_error = self._pi(reward_used, st.reward_kl_average, target_used,
                                                       st.reward_error)
        st.step = step
        st.target = self.target_at(step)
        st.history.append([step, measured_kl, target_used, coef_used])
        metrics = {"kl_control/loss_coef": coef_used, "kl_control/next_loss_coef": st.loss_coef}
        if target_used is not None:
            metrics["kl_control/target"] = target_used
        if reward_used is not None:
            metrics["kl_control/reward_coef"] = reward_used
        return metrics

    def _pi(self, coef: float, kl: float, target: float, last: list | None) -> tuple[float, list]:
        """The PI step on the KL expected ``lookahead`` steps on (the KL's last change extrapolated): a coefficient
        set after step t weighs update t+1, whose KL is measured at step t+2. Returns the coefficient and the state
        to pass back next time, (log error, KL)."""
        s = self.settings
        last_error, last_kl = last if last else (None, None)
        expected = kl if last_kl is None else max(kl + s.lookahead * (kl - last_kl), 0.0)
        error = log_error(expected, target)
        return pi_update(coef, error, last_error, s.kp, s.ki, s.max_step), [error, kl]

    def state_dict(self) -> dict:
        return asdict(self.state)

    def load_state_dict(self, state: dict) -> None:
        self.state = KLState(**state)

    def save(self, folder: str | Path) -> Path:
        path = Path(folder) / STATE_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        # json writes floats with repr(): they read back bit for bit; written aside, then renamed
        # (recipes.record.records)
        return write_atomic(path, json.dumps({"settings": asdict(self.settings), "state": self.state_dict()},
                                             indent=1))

    def load(self, folder: str | Path) -> bool:
        """Restore from a checkpoint folder; False (and the state untouched) where the folder has no state."""
        path = Path(folder) / STATE_FILE
        if not path.is_file():
            return False
        try:
            state = json.loads(path.read_text())["state"]
            self.load_state_dict(state)
        except (ValueError, KeyError, TypeError) as error:
            raise RuntimeError(f"{path}: not the KL controller's state ({type(error).__name__}: {error}); resume "
                               "from an earlier checkpoint") from None
        return True
