"""``planner_work``: counts of the planner's work that would grow with the cluster if it went rank by rank.

The planner's speed on 4096 GPUs comes from two things a test can count instead of timing (``scripts/bench_plan.py``
prints the wall-clock figures): no per-rank Python calls on ``HybridGroups`` (numpy over all ranks instead), and one
TP slice table per distinct tensor signature (not per tensor, per layer or per rank).
"""

from __future__ import annotations

from collections import Counter

import pytest

from hybrid_engine.groups import HybridGroups
from hybrid_engine.plan import bytes as plan_bytes

PER_RANK = ("rank_info", "train_coords", "micro_dp_group", "expert_gather_group")
"""HybridGroups methods that answer for one rank: called once per rank, they would make a plan O(world)."""


class PlannerWork:
    """Calls of each :data:`PER_RANK` method and of ``rank_of`` (``calls``), and the slice tables built."""

    def __init__(self) -> None:
        self.calls: Counter = Counter()
        plan_bytes._slice_table.cache_clear()

    def per_rank_calls(self) -> int:
        return sum(self.calls[name] for name in PER_RANK)

    def slice_tables(self) -> int:
        """Slice tables built since the fixture started (misses of the cleared cache)."""
        return plan_bytes._slice_table.cache_info().misses

    @staticmethod
    def distinct_signatures(spec) -> int:
        """At most one slice table per distinct tensor signature of ``spec`` (shape, partition, TP parts)."""
        return len({plan_bytes._signature(tensor) for tensor in spec.tensors})


@pytest.fixture
def planner_work(monkeypatch) -> PlannerWork:
    work = PlannerWork()
    for name in (*PER_RANK, "rank_of"):
        monkeypatch.setattr(HybridGroups, name, _counted(getattr(HybridGroups, name), name, work.calls))
    return work


def _counted(method, name: str, calls: Counter):
    def wrapper(self, *args, **kwargs):
        calls[name] += 1
        return method(self, *args, **kwargs)

    return wrapper
