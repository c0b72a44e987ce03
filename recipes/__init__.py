"""klppo-recipes: Hydra recipes for KL-PPO and GRPO on verl: ``python -m recipes.grpo`` / ``recipes.kl_ppo``.

The launch flow of one run (recipes/launch.py), each stage once, each in its own subpackage:

    compose   recipes/compose/   conf/ and the command line -> one Hydra config (compose.py, defaults.py)
    validate  recipes/check/     the pack's checks, memory and verl's validator -> ValidatedRun (validate.py)
    finalize  recipes/run/       loggers, the workers' env, verl's hooks -> FinalRun, the config verl gets (finalize.py)
    record    recipes/record/    the run folder, resolved_config.yaml, repro/ (rundir.py, bundle.py)
    action    validate | plan (recipes/check/plan.py) | train (recipes/run/train.py; launcher=ray:
              recipes/cluster/ray_jobs.py)

Around the run: recipes/cli/ (``--help``, ``python -m recipes.copy``), recipes/cluster/ (Ray Jobs, NCCL env,
sweeps) and recipes/verl_ext/ (everything that touches verl, pinned to 0.9.1). At the top: the entry points
(grpo.py, kl_ppo.py, copy.py), launch.py (the flow), errors.py (ConfigError) and envvars.py (``KLPPO_*``).
"""

import importlib.util
import os


def _expose_hydra_plugin() -> None:
    """Let Hydra find the pack's launcher plugin (hydra_plugins/klppo_launcher) in an editable install too.

    Hydra 1.3 lists the ``hydra_plugins`` namespace folder by folder; a PEP 660 editable install (``pip install -e``)
    maps the package through an import hook that such a listing does not see (facebookresearch/hydra#2359). Add the
    plugin's real folder to the namespace path, as a plain list so later sys.path changes do not drop it.
    """
    try:
        spec = importlib.util.find_spec("hydra_plugins.klppo_launcher")
        if spec is None or not spec.origin:
            return
        # lazy: find_spec has just imported it; inside the guard, so a broken plugin namespace never stops the import
        import hydra_plugins

        folder = os.path.dirname(os.path.dirname(spec.origin))
        paths = list(hydra_plugins.__path__)
        if folder not in paths:
            hydra_plugins.__path__ = [*paths, folder]
    except Exception:  # noqa: BLE001 - never stop an import over this: sweeps then use Hydra's own launcher
        return


_expose_hydra_plugin()
