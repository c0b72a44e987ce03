"""The embedded CPU default and what counts as choosing a GPU layout instead.

On a machine without GPUs, a command line that describes no layout (no ``parallel=``, ``cluster=`` or
``experiment=``, and none of verl's own layout keys such as ``trainer.n_gpus_per_node=8``) gets the embedded default:
verl's trainer on this machine's CPU cores, with the tiny model and task built locally. These are group choices only:
the values themselves live in conf/ (``parallel/cpu.yaml``, ``cluster/cpu.yaml``, ``rollout/hf.yaml``,
``model/tiny.yaml``, ``task/tiny.yaml``), and ``recipes.verl_ext.plugin.cpu_overrides`` reads its plain verl
overrides from there too.
"""

from __future__ import annotations

from recipes.layout_keys import LAYOUT_FED_KEYS
from recipes.overrides import chosen_keys, override_key, override_value

# Groups that make the embedded CPU default; each is added only when the user did not choose it.
EMBEDDED_DEFAULTS = {"parallel": "cpu", "cluster": "cpu", "rollout": "hf", "model": "tiny", "task": "tiny",
                     # the demo's KL story: a target that rises with learning, the controller following it
                     "kl": "ramp"}
# Choosing any of these groups means "I describe a GPU cluster": then nothing is added.
GPU_INTENT = ("parallel", "cluster", "experiment")
# verl's own layout keys (trainer.n_gpus_per_node, trainer.nnodes, rollout and Megatron parallel sizes, Ulysses
# sizes), as verl's example scripts type them, describe a GPU layout just as well. The pack's own keys
# (cluster.gpus_per_node=2, layout.infer.tp=1) do not: they tune the embedded default (README, "The embedded default").
GPU_INTENT_KEYS = tuple(LAYOUT_FED_KEYS)


def has_accelerator() -> bool:
    import torch  # lazy: torch takes seconds to import and only this question needs it here

    return torch.cuda.is_available()


def chooses_layout(argv: list[str]) -> bool:
    """True when the command line describes a layout: a GPU_INTENT group, or a verl layout key set to a value
    (``trainer.n_gpus_per_node=8``, ``+trainer.nnodes=2``; deleting one with ``~`` describes nothing)."""
    if chosen_keys(argv) & set(GPU_INTENT):
        return True
    typed = {override_key(arg) for arg in argv if not arg.startswith("~")}
    if _typed(argv, "plan.solve") == "true" and _typed(argv, "action") == "plan":
        return True  # the layout search (recipes/solve.py) chooses a GPU layout for the chosen cluster
    return bool(typed & set(GPU_INTENT_KEYS))


def _typed(argv: list[str], key: str) -> str | None:
    """The last value typed for ``key`` (lower case), None when it was not typed."""
    values = [override_value(arg).strip().lower() for arg in argv if override_key(arg) == key]
    return values[-1] if values else None


# Strategies whose verl engine needs GPUs (verl 0.9.1's Megatron workers are CUDA-only): choosing one plans for GPUs
GPU_ONLY_STRATEGIES = ("megatron",)


def gpu_only_strategy(argv: list[str], recipe_strategy: str | None) -> str | None:
    """The strategy, typed or the recipe's default (a copy made with ``strategy=megatron``), when it needs GPUs."""
    typed = _typed(argv, "strategy")
    strategy = typed if typed is not None else recipe_strategy
    return strategy if strategy in GPU_ONLY_STRATEGIES else None


def embedded_defaults(argv: list[str], accelerator: bool, recipe_strategy: str | None = None) -> list[str]:
    """The overrides to add for the embedded CPU default: none on a GPU machine, when a layout was chosen, or for a
    strategy whose engine needs GPUs (the embedded default trains with FSDP2 on CPU)."""
    chosen = chosen_keys(argv)
    # launcher=ray: the run goes to an existing cluster, whose hardware is not this machine's (recipes/ray_jobs.py)
    if accelerator or chooses_layout(argv) or "launcher=ray" in argv or gpu_only_strategy(argv, recipe_strategy):
        return []
    return [f"{group}={option}" for group, option in EMBEDDED_DEFAULTS.items() if group not in chosen]
