"""The 3D-HybridEngine library: layouts, model specs, plan, resharding, mode switch, verl glue.

Kept tiny on purpose: importing ``hybrid_engine`` (verl imports its plugin in every process) loads nothing heavy.
Import the submodules you need: ``hybrid_engine.layout``, ``hybrid_engine.model_spec``, ``hybrid_engine.plan``.
"""
