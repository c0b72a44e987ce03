"""The KL guard: stop a training step's remaining PPO mini-batches and epochs once the policy KL passes a threshold.

verl's actor update (``TrainingWorker.train_mini_batch``) runs every mini-batch of every PPO epoch; each mini-batch's
policy loss measures ``actor/ppo_kl``, the KL between the current policy and the policy that produced the rollout
(old log-probs). The guard reads that value after each update and, once it passes ``kl.guard.max_kl``, the worker
runs no further update in this step. The step's metrics say so (never a silent skip):

- ``guard/stopped``  1.0 if the guard stopped the step's updates, else 0.0
- ``guard/updates``  optimizer updates run in the step
- ``guard/planned``  updates the step would have run (mini-batches x epochs)
- ``guard/kl``       the KL that stopped it (the largest KL seen when it did not stop)

The KL of mini-batch i is measured in the forward pass of update i, i.e. after i-1 updates; the guard therefore stops
after update i (update i itself has been applied). Every rank takes the same decision (a MAX all-reduce of the stop
flag), so no collective of the next update is left waiting.

This module is pure logic; :mod:`.verl_hooks` wires it into verl's worker.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

GUARD_KEY = "stability_guard_max_kl"
"""Non-tensor key the trainer adds to the actor's update batch: the threshold for this step."""
KL_COEF_KEY = "stability_kl_loss_coef"
"""Non-tensor key the trainer adds to the actor's update batch: the loss-side KL coefficient for this step."""
INJECT_KEY = "stability_inject"
"""Non-tensor key the trainer adds to the actor's update batch in a fault-injection test: ``oom`` | ``nan_weights``."""
KL_METRIC = "actor/ppo_kl"
"""The policy loss's KL between the current policy and the rollout (old) policy, as verl 0.9.1 names it."""
METRICS = ("guard/stopped", "guard/updates", "guard/planned", "guard/kl")


def scalar(value) -> float | None:
    """One float from a verl metric value: a float, a tensor, a ``Metric``, or a list of those (one per dp rank)."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        items = [scalar(v) for v in value]
        items = [v for v in items if v is not None]
        return sum(items) / len(items) if items else None
    if hasattr(value, "aggregate"):  # verl.utils.metric.Metric
        return float(value.aggregate())
    if hasattr(value, "item"):
        return float(value.item())
    return float(value)


class KLGuard:
    """Counts the updates of one ``train_mini_batch`` call and decides when to stop."""

    def __init__(self, max_kl: float, planned: int):
        self.max_kl = float(max_kl)
        self.planned = int(planned)
        self.updates = 0
        self.stopped = False
        self.kl: float | None = None
        self.max_seen: float | None = None

    def observe(self, kl: float | None) -> bool:
        """Record one finished update and its measured KL; True when the remaining updates must not run."""
        self.updates += 1
        if kl is not None and (self.max_seen is None or not kl <= self.max_seen):
            self.max_seen = kl
        # a NaN KL is past any threshold: the next update would only spread it
        if kl is not None and (math.isnan(kl) or kl > self.max_kl):
            self.stopped, self.kl = True, kl
        return self.stopped

    def iterate(self, batches: Iterable) -> Iterator:
        """The mini-batches, ending early once the guard stopped."""
        for batch in batches:
            if self.stopped:
                return
            yield batch

    def metrics(self) -> dict[str, float]:
        kl = self.kl if self.stopped else self.max_seen
        return {
            "guard/stopped": 1.0 if self.stopped else 0.0,
            "guard/updates": float(self.updates),
            "guard/planned": float(self.planned),
            "guard/kl": float("nan") if kl is None else float(kl),
        }
