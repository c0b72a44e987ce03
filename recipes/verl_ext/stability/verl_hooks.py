"""Where the stability package enters verl 0.9.1: imported in every process that imports verl.

``recipes/run/train.py`` names this module in ``VERL_USE_EXTERNAL_MODULES``, which verl imports from its own
``__init__`` in the driver and in every Ray worker. Importing it:

1. registers :class:`~recipes.verl_ext.stability.trainer.StabilityTrainer` under ``trainer.v1.trainer_mode=stability``
   with verl's own trainer registry (``register_trainer``), right after ``verl.trainer.ppo.v1`` is imported;
2. wraps, in ``verl.workers.engine_workers`` (pinned to verl 0.9.1, loud on another version):

   - ``tensordict_utils.make_iterator``, replaced module-wide (every caller of verl's function gets it): takes
     this pack's keys off the update batch (guard threshold, loss-side KL coefficient, a test's fault) and, when a
     threshold came with it, lets :class:`~.guard.KLGuard` end the mini-batch loop;
   - ``TrainingWorker.train_batch``: applies the step's KL coefficient to the loss function (``kl_loss_coef`` of
     its ``ActorConfig``, frozen by verl, set through ``object.__setattr__``), reports each update's
     ``actor/ppo_kl`` to the guard, and agrees on the stop across ranks; in a fault-injection test
     (``stability.inject.oom_at_step`` / ``nan_weights_at_step``) raises torch's OutOfMemoryError where a real one is
     raised, or writes NaN into a weight of the model after the update;
   - ``TrainingWorker.train_mini_batch``: adds the ``guard/*`` metrics to the update's metrics and steps the LR
     scheduler when the guard skipped the update that would have stepped it.

verl has no hook inside the mini-batch loop (the policy-loss registry sees one micro-batch, not the loop), hence the
wraps. Each of these changes (the registration, the three replacements, the coefficient) is a row of the pack's one
patch table, :data:`recipes.verl_ext.patch_table.PATCHES`, beside the plugin's patches of verl and the pack's other
patches.
"""

from __future__ import annotations

import functools
import logging

import torch
import torch.distributed as dist

from recipes.verl_ext.plugin.patches import require_supported_verl, when_imported
from recipes.verl_ext.stability.guard import GUARD_KEY, INJECT_KEY, KL_COEF_KEY, KL_METRIC, KLGuard, scalar

logger = logging.getLogger(__name__)

TRAINER_MODE = "stability"
"""``trainer.v1.trainer_mode`` value that selects the pack's trainer (it then runs as verl's ``sync`` mode)."""


class _Update:
    """The guard and coefficient of the ``train_mini_batch`` call in progress in this process (one at a time)."""

    guard: KLGuard | None = None
    kl_coef: float | None = None
    inject: str | None = None
    """a test's fault for this update: ``oom`` | ``nan_weights`` (stability.inject)"""


_current = _Update()


def _register_trainer(v1_package) -> None:
    require_supported_verl()
    # lazy: a hook, run once verl.trainer.ppo.v1 is imported; the trainer module subclasses verl's v1 trainer
    from recipes.verl_ext.stability.trainer import StabilityTrainer

    if v1_package.trainer_base.TRAINER_REGISTRY.get(TRAINER_MODE) is not StabilityTrainer:
        v1_package.register_trainer(TRAINER_MODE)(StabilityTrainer)


def _set_kl_loss_coef(loss_fn, coef: float) -> None:
    config = getattr(loss_fn, "keywords", {}).get("config")
    if config is None or not hasattr(config, "kl_loss_coef"):
        raise RuntimeError(
            f"stability: cannot set the KL-loss coefficient: the actor's loss function {loss_fn!r} is not verl "
            "0.9.1's partial(ppo_loss, config=...)"
        )
    # ActorConfig freezes kl_loss_coef after construction; this controller owns it from here on
    object.__setattr__(config, "kl_loss_coef", float(coef))


def _stop_everywhere(stop: bool) -> bool:
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return stop
    flag = torch.tensor([1.0 if stop else 0.0])  # a CPU tensor: gloo on the CPU, the cpu:gloo half of cpu+cuda
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item() > 0)


def _poison_weights(module) -> None:
    """Test hook (stability.inject.nan_weights_at_step): the model's first weight tensor becomes NaN, in place."""
    param = next(module.parameters())
    with torch.no_grad():
        (param.to_local() if hasattr(param, "to_local") else param).fill_(float("nan"))
    logger.warning("stability: injected NaN into the actor's weight %s", tuple(param.shape))


def _patch_engine_workers(engine_workers) -> None:
    require_supported_verl()
    worker_cls = engine_workers.TrainingWorker
    if getattr(worker_cls.train_batch, "_stability_guard", False):
        return
    tu = engine_workers.tu
    original_make_iterator = tu.make_iterator

    @functools.wraps(original_make_iterator)
    def make_iterator(tensordict, mini_batch_size, epochs, seed=None, dataloader_kwargs=None):
        keys = tensordict.keys()
        max_kl = tu.pop(tensordict, key=GUARD_KEY) if GUARD_KEY in keys else None
        _current.kl_coef = tu.pop(tensordict, key=KL_COEF_KEY) if KL_COEF_KEY in keys else None
        _current.inject = tu.pop(tensordict, key=INJECT_KEY) if INJECT_KEY in keys else None
        batches = original_make_iterator(tensordict, mini_batch_size, epochs, seed=seed,
                                         dataloader_kwargs=dataloader_kwargs)
        if max_kl is None:
            _current.guard = None
            return batches
        planned = tensordict.shape[0] // mini_batch_size * epochs
        _current.guard = KLGuard(max_kl, planned)
        return _current.guard.iterate(batches)

    original_train_batch = worker_cls.train_batch

    @functools.wraps(original_train_batch)
    def train_batch(self, data):
        if _current.kl_coef is not None:
            _set_kl_loss_coef(self.loss_fn, _current.kl_coef)
        if _current.inject == "oom":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated in the actor's "
                                         "update: stability.inject.oom_at_step)")
        output = original_train_batch(self, data)
        if _current.inject == "nan_weights":
            _current.inject = None
            _poison_weights(self.engine.module)
        guard = _current.guard
        if guard is not None:
            kl = None
            if output is not None:
                kl = scalar(tu.get(output, "metrics").get(KL_METRIC))
            stop = guard.observe(kl)
            guard.stopped = _stop_everywhere(stop)
        return output

    original_train_mini_batch = worker_cls.train_mini_batch

    @functools.wraps(original_train_mini_batch)
    def train_mini_batch(self, data):
        _current.guard, _current.kl_coef, _current.inject = None, None, None
        try:
            output = original_train_mini_batch(self, data)
            guard = _current.guard
            if guard is not None:
                if guard.stopped and guard.updates < guard.planned:
                    self.engine.lr_scheduler_step()  # the skipped last update would have stepped it
                if output is not None and hasattr(output, "keys"):
                    metrics = tu.get(output, "metrics")
                    for key, value in guard.metrics().items():
                        metrics[key] = [value]
                if guard.stopped:
                    logger.warning("stability guard: policy KL %.4f > max_kl %.4f after %d of %d updates; "
                                   "the step's remaining updates are skipped", guard.kl, guard.max_kl,
                                   guard.updates, guard.planned)
            return output
        finally:
            _current.guard, _current.kl_coef, _current.inject = None, None, None

    tu.make_iterator = make_iterator
    for name, fn in (("train_batch", train_batch), ("train_mini_batch", train_mini_batch)):
        fn._stability_guard = True
        setattr(worker_cls, name, fn)


def install() -> None:
    require_supported_verl()
    when_imported("verl.trainer.ppo.v1", _register_trainer)
    when_imported("verl.workers.engine_workers", _patch_engine_workers)


install()
