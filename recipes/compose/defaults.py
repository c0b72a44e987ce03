"""The embedded CPU default and what counts as choosing a GPU layout instead.

On a machine without GPUs, a command line that describes no layout (no ``parallel=``, ``cluster=`` or
``experiment=``, and none of verl's own layout keys such as ``trainer.n_gpus_per_node=8``) gets the embedded default:
verl's trainer on this machine's CPU cores, with the tiny model and task built locally. These are group choices only:
the values themselves live in conf/ (``parallel/cpu.yaml``, ``cluster/cpu.yaml``, ``rollout/hf.yaml``,
``model/tiny.yaml``, ``task/tiny.yaml``), and ``recipes.verl_ext.plugin.cpu_overrides`` reads its plain verl
overrides from there too.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import yaml

from recipes.compose.confdir import conf_dir, group_options
from recipes.compose.layout_keys import LAYOUT_FED_KEYS
from recipes.compose.overrides import CommandLine
from recipes.errors import ConfigError

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


def chooses_layout(argv: Sequence[str] | CommandLine) -> bool:
    """True when the command line describes a layout: a GPU_INTENT group, or a verl layout key set to a value
    (``trainer.n_gpus_per_node=8``, ``+trainer.nnodes=2``; deleting one with ``~`` describes nothing)."""
    command = CommandLine.parse(argv)
    if command.keys() & set(GPU_INTENT):
        return True
    typed = {o.key for o in command.overrides if not o.deletes}
    if command.last("plan.solve") == "true" and command.last("action") == "plan":
        return True  # the layout search (recipes/check/solve.py) chooses a GPU layout for the chosen cluster
    return bool(typed & set(GPU_INTENT_KEYS))


# Strategies whose verl engine needs GPUs (verl 0.9.1's Megatron workers are CUDA-only): choosing one plans for GPUs
GPU_ONLY_STRATEGIES = ("megatron",)


def gpu_only_strategy(argv: Sequence[str] | CommandLine, recipe_strategy: str | None) -> str | None:
    """The strategy, typed or the recipe's default (a copy made with ``strategy=megatron``), when it needs GPUs."""
    typed = CommandLine.parse(argv).last("strategy")
    strategy = typed if typed is not None else recipe_strategy
    return strategy if strategy in GPU_ONLY_STRATEGIES else None


# Rollout engines that generate on GPUs only: typed (``rollout=vllm``, or verl's ``actor_rollout_ref.rollout.name=vllm``
# as a pasted script has it), one plans for GPUs
GPU_ONLY_ROLLOUTS = ("vllm", "sglang")


def gpu_only_rollout(argv: Sequence[str] | CommandLine) -> str | None:
    """The rollout engine the command line types, when it generates on GPUs only."""
    command = CommandLine.parse(argv)
    typed = command.last("actor_rollout_ref.rollout.name") or command.last("rollout")
    return typed if typed in GPU_ONLY_ROLLOUTS else None


def embedded_defaults(argv: Sequence[str] | CommandLine, accelerator: bool,
                      recipe_strategy: str | None = None) -> list[str]:
    """The overrides to add for the embedded CPU default: none on a GPU machine, when a layout was chosen, or for a
    strategy whose engine needs GPUs (the embedded default trains with FSDP2 on CPU)."""
    argv = CommandLine.parse(argv)
    chosen = argv.keys()
    # launcher=ray: the run goes to an existing cluster, whose hardware is not this machine's
    # (recipes/cluster/ray_jobs.py)
    if (accelerator or chooses_layout(argv) or "launcher=ray" in argv or gpu_only_strategy(argv, recipe_strategy)
            or gpu_only_rollout(argv)):
        return []
    return [f"{group}={option}" for group, option in EMBEDDED_DEFAULTS.items() if group not in chosen]


# -- the GPU this machine has, for a run that trains here -----------------------------------------------------------
MEMORY_SLACK_GIB = 2.0
"""How much more memory a cluster preset may name than the device reports (an H200 reports 139.8 GiB of its 141)."""


def gpu_found() -> tuple[str, float] | None:
    """GPU 0's name and memory in GiB, where torch sees one."""
    import torch  # lazy: torch takes seconds to import and only this question needs it here

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return props.name, props.total_memory / 2**30


def host_memory_found() -> float | None:
    """This machine's memory in GiB (``MemTotal`` of /proc/meminfo), where Linux says it."""
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    kib = next((line.split()[1] for line in text.splitlines() if line.startswith("MemTotal:")), None)
    return int(kib) / 2**20 if kib and kib.isdigit() else None


def machine_host_memory(argv: Sequence[str] | CommandLine, host_gib: float | None) -> tuple[list[str], list[str]]:
    """For a run on this machine's GPUs (no ``launcher=ray``) that leaves ``cluster.host_memory_gib`` unset: this
    machine's memory as the node's, so that the plan checks what an offload keeps on the host (a preset cannot know
    it: the same GPUs come with 128 GiB or 2 TiB). Returns (overrides to add, notices)."""
    argv = CommandLine.parse(argv)
    if host_gib is None or "launcher=ray" in argv or argv.typed("cluster.host_memory_gib"):
        return [], []
    gib = int(host_gib)  # rounded down: what the node holds at most
    return [f"cluster.host_memory_gib={gib}"], [f"host memory found: {host_gib:.1f} GiB: cluster.host_memory_gib={gib}"]


def cluster_presets() -> dict[str, float]:
    """Each GPU cluster option of conf/cluster and the memory per GPU it plans with (GiB)."""
    out = {}
    for option in group_options("cluster"):
        data = yaml.safe_load((conf_dir() / "cluster" / f"{option}.yaml").read_text()) or {}
        gib = ((data.get("cluster") or {}).get("gpu") or {}).get("memory_gib")
        if option != "cpu" and isinstance(gib, (int, float)):
            out[option] = float(gib)
    return out


def preset_for(name: str, memory_gib: float, presets: dict[str, float]) -> str | None:
    """The cluster option of a device: its family (``h200`` of ``h200_141g``) in the device's name and its memory
    within MEMORY_SLACK_GIB of the device's (an A100 40GB has no preset); None when none is."""
    squeezed = name.lower().replace(" ", "")
    family = [option for option in presets
              if option.split("_")[0] in squeezed and abs(presets[option] - memory_gib) <= MEMORY_SLACK_GIB]
    return min(family, key=lambda option: abs(presets[option] - memory_gib)) if family else None


def machine_cluster(argv: Sequence[str] | CommandLine, found: tuple[str, float] | None) -> tuple[list[str], list[str]]:
    """For a run on this machine's GPUs (no ``launcher=ray``): the cluster preset of the GPU it has where the command
    line chose none, with a notice; for one that trains here, a ConfigError where the chosen preset plans for more
    memory per GPU than the GPU has. Returns (overrides to add, notices)."""
    argv = CommandLine.parse(argv)
    if found is None or "launcher=ray" in argv:
        return [], []
    name, gib = found
    presets = cluster_presets()
    matching = preset_for(name, gib, presets)
    typed = argv.last("cluster")
    if typed is None:
        if any(o.key.startswith("cluster.gpu.") for o in argv.overrides):
            return [], []
        if matching is None:
            return [], [f"GPU found: {name} ({gib:.1f} GiB), no cluster preset of its kind: the plan assumes the "
                        f"recipe's (cluster=<option> or cluster.gpu.memory_gib={gib:.0f} for this one)"]
        return [f"cluster={matching}"], [f"GPU found: {name} ({gib:.1f} GiB): cluster={matching}"]
    if (argv.last("action") or "train") != "train":
        return [], []
    planned = presets.get(typed)
    memory_typed = bool(argv.typed("cluster.gpu.memory_gib"))
    if planned is not None and not memory_typed and planned > gib + MEMORY_SLACK_GIB:
        instead = f"cluster={matching}" if matching else f"cluster.gpu.memory_gib={gib:.0f}"
        raise ConfigError(f"cluster={typed}: plans for {planned:g} GiB per GPU > this machine's {name} with "
                          f"{gib:.1f} GiB; train here with {instead} (or launcher=ray for the cluster it names)")
    return [], []
