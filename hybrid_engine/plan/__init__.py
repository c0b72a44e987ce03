"""The planner: layouts, HybridFlow groups, bytes moved and memory per GPU, before any GPU starts (``action=plan``).

- ``settings``: the plan's inputs besides the layouts, ``ClusterSpec`` and ``PlanSettings``.
- ``bytes``: bytes each GPU receives per resharding scheme, and the time estimates.
- ``memory``: memory per GPU of a colocated run, phase by phase.
- ``build``: the ``Plan`` and ``build_plan`` / ``plan_from_names``.
- ``render``: how a plan is shown: the JSON document (schema), the text table, the rank-grid picture.

Entry point for the recipes::

    plan = build_plan(arch, train, infer, cluster, settings)
    print(plan.render_table()); plan.draw_picture("plan.png"); json.dump(plan.to_dict(), f)
"""

from hybrid_engine.plan.build import Plan, build_plan, plan_from_names
from hybrid_engine.plan.settings import ClusterSpec, PlanSettings

__all__ = ["ClusterSpec", "Plan", "PlanSettings", "build_plan", "plan_from_names"]
