"""Hydra launcher plugin of klppo-recipes: every job of a sweep (``-m``) as its own Ray Job on an existing cluster.

Chosen by ``launcher=ray`` (conf/launcher/ray.yaml sets ``hydra/launcher: klppo_ray``). Hydra finds it because
``hydra_plugins`` is a namespace package; the work is done by :mod:`recipes.cluster.ray_jobs`.
"""
