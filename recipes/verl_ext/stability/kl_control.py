"""KL control of the pack: the target schedule (fixed, adaptive, ramp) and the loss-side coefficient controller.

verl 0.9.1 adapts only the KL that is added to the reward (``algorithm.kl_ctrl``, Ziegler et al.) and keeps that
controller's value in memory only. This controller:

- moves the target: ``fixed`` has none, ``adaptive`` holds ``kl.target``, ``ramp`` rises linearly from
  ``kl.ramp.start`` to ``kl.ramp.end`` over ``kl.ramp.steps`` training steps;
- drives the coefficient of the loss-side KL (``actor.kl_loss_coef``, used with ``use_kl_loss``) toward the target with
  the same proportional rule verl uses for the in-reward coefficient:
  ``coef *= 1 + clip(kl / target - 1, -0.2, 0.2) * n / horizon``, ``n`` = sequences in the step;
- sets the in-reward controller's target to the same schedule (verl updates its value itself);
- has a JSON state (:meth:`KLControl.state_dict`) that the trainer writes into every checkpoint folder and reads back
  on resume, so a resumed run continues with the same step, target and both coefficients, bit for bit.

Pure Python: no verl, no torch; the trainer (:mod:`.trainer`) calls it once per step.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from recipes.records import write_atomic
from recipes.schema import KL, load_section

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

    @classmethod
    def from_config(cls, cfg) -> KLSettings:
        """From the full (verl + pack) config; a config without the pack's ``kl`` keys gives a fixed controller.
        The ``kl.*`` keys and their defaults are the pack's schema (:class:`recipes.schema.KL`); a bad value raises
        :class:`recipes.schema.SchemaError` (a ValueError) naming the key."""
        kl = load_section(KL, cfg.get("kl"), "kl")
        kl_ctrl = cfg.algorithm.get("kl_ctrl") or {}
        return cls(
            mode=kl.mode,
            target=None if kl.target is None else float(kl.target),
            ramp_start=float(kl.ramp.start),
            ramp_end=float(kl.ramp.end),
            ramp_steps=kl.ramp.steps,
            horizon=float(kl_ctrl.get("horizon", 10000)),
            init_loss_coef=float(cfg.actor_rollout_ref.actor.get("kl_loss_coef", 0.001)),
            max_kl=None if kl.guard.max_kl is None else float(kl.guard.max_kl),
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
    """verl's in-reward controller value (``kl_ctrl_in_reward.value``) after the last step; None without it"""
    history: list = field(default_factory=list)
    """(step, measured kl, target, loss_coef) per step, for the record"""


class KLControl:
    """The schedule and the loss-side controller; one instance lives in the trainer."""

    def __init__(self, settings: KLSettings):
        self.settings = settings
        self.state = KLState(loss_coef=settings.init_loss_coef, target=self.target_at(0))

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

    def update(self, step: int, measured_kl: float | None, n_sequences: int) -> dict[str, float]:
        """After training step ``step``: move the coefficient toward the step's target, then the target on.

        ``measured_kl`` is the step's loss-side KL (``actor/kl_loss``); None (no KL loss) leaves the coefficient.
        Returns the step's metrics: ``kl_control/target`` and ``kl_control/loss_coef`` as used in this step,
        ``kl_control/next_loss_coef`` for the next one, ``kl_control/reward_coef`` (verl's in-reward value).
        """
        st = self.state
        target_used, coef_used = st.target, st.loss_coef
        if self.drives_loss_coef and measured_kl is not None and math.isfinite(measured_kl) and target_used:
            st.loss_coef = proportional_update(coef_used, measured_kl, target_used, n_sequences,
                                               self.settings.horizon)
        st.step = step
        st.target = self.target_at(step)
        st.history.append([step, measured_kl, target_used, coef_used])
        metrics = {"kl_control/loss_coef": coef_used, "kl_control/next_loss_coef": st.loss_coef}
        if target_used is not None:
            metrics["kl_control/target"] = target_used
        if st.reward_coef is not None:
            metrics["kl_control/reward_coef"] = st.reward_coef
        return metrics

    def state_dict(self) -> dict:
        return asdict(self.state)

    def load_state_dict(self, state: dict) -> None:
        self.state = KLState(**state)

    def save(self, folder: str | Path) -> Path:
        path = Path(folder) / STATE_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        # json writes floats with repr(): they read back bit for bit; written aside, then renamed (recipes.records)
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
