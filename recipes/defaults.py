"""The embedded CPU default and what counts as choosing a GPU layout instead.

On a machine without GPUs, a command line that describes no layout gets the embedded default: verl's trainer on
this machine's CPU cores, with the tiny model and task built locally. These are group choices only: the values
themselves live in conf/ (``parallel/cpu.yaml``, ``cluster/cpu.yaml``, ``rollout/hf.yaml``, ``model/tiny.yaml``,
``task/tiny.yaml``), and ``recipes.verl_ext.plugin.cpu_overrides`` reads its plain verl overrides from there too.
"""

from __future__ import annotations

from recipes.overrides import chosen_keys

# Groups that make the embedded CPU default; each is added only when the user did not choose it.
EMBEDDED_DEFAULTS = {"parallel": "cpu", "cluster": "cpu", "rollout": "hf", "model": "tiny", "task": "tiny"}
# Choosing any of these groups means "I describe a GPU cluster": then nothing is added.
GPU_INTENT = ("parallel", "cluster", "experiment")


def has_accelerator() -> bool:
    import torch  # lazy: torch takes seconds to import and only this question needs it here

    return torch.cuda.is_available()


def embedded_defaults(argv: list[str], accelerator: bool) -> list[str]:
    """The overrides to add for the embedded CPU default: none on a GPU machine or when a layout was chosen."""
    chosen = chosen_keys(argv)
    # launcher=ray: the run goes to an existing cluster, whose hardware is not this machine's (recipes/ray_jobs.py)
    if accelerator or chosen & set(GPU_INTENT) or "launcher=ray" in argv:
        return []
    return [f"{group}={option}" for group, option in EMBEDDED_DEFAULTS.items() if group not in chosen]
