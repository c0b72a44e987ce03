"""The planner: layouts, HybridFlow groups, bytes moved and memory per GPU, before any GPU starts (``action=plan``).

- ``settings``: the plan's inputs besides the layouts, ``ClusterSpec`` and ``PlanSettings``.
- ``bytes``: bytes each GPU receives per resharding scheme, and the time estimates.
- ``memory``: memory per GPU of a colocated run, phase by phase.
- ``build``: the ``Plan`` and ``build_plan`` / ``plan_from_names``.
- ``render``: how a plan is shown: the JSON document (schema), the text table, the rank-grid picture.
- ``solve``: the layout search (``plan.solve=true``): the fastest layouts that fit, with their settings.
- ``step_time``: the step-time estimate the search ranks by (generation, log-prob, update, weight sync).

Entry point for the recipes::

    plan = build_plan(arch, train, infer, cluster, settings)
    print(plan.render_table()); plan.draw_picture("plan.png"); json.dump(plan.to_dict(), f)
"""

from hybrid_engine.plan.build import Plan, build_plan, plan_from_names
from hybrid_engine.plan.settings import ClusterSpec, PlanSettings
from hybrid_engine.plan.solve import Candidate, SolveRequest, SolveResult, solve
from hybrid_engine.plan.step_time import StepTime, Workload

__all__ = ["Candidate", "ClusterSpec", "Plan", "PlanSettings", "SolveRequest", "SolveResult", "StepTime", "Workload",
           "build_plan", "plan_from_names", "solve"]
