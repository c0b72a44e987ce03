"""action=plan: layouts, HybridFlow groups, bytes per GPU and memory per GPU, before any GPU starts."""

from __future__ import annotations


def run_plan(checked) -> int:
    try:
        from hybrid_engine.plan import build_plan  # noqa: F401
    except ImportError:
        print("action=plan: the planner is not available in this build; the config validated.")
        return 0
    raise NotImplementedError
