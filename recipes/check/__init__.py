"""Stage 2 of a run, validate, and the plan action: everything checked in the driver before anything starts.

- validate.py: the pack's checks, then verl's own validator; all problems as one ConfigError (``ValidatedRun``);
- schema.py: the pack's own keys, typed, one dataclass per group, with units and ranges;
- fit.py: the planned peak memory per GPU against the GPU, with the changes that would make it fit;
- lookups.py: what verl looks up or combines only once a run is going (registry names, files, combinations);
- needs.py: what a training run needs from this machine: engine packages, GPUs or a cluster to join, its data;
- plan.py: ``action=plan``: layouts, HybridFlow groups, bytes and memory per GPU (``hybrid_engine.plan``);
- solve.py: ``plan.solve=true``: the layout search, printed as ranked commands;
- budget.py: what the plan sizes to the run: auto token budgets, the rollout engine's memory share and graph sizes.
"""
