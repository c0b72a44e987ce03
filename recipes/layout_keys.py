"""The verl keys that repeat a layout or cluster number, and how a direct override of one is adopted.

Every key below interpolates from the pack's vocabulary (layout.*, cluster.*), so no layout number is written twice.
A user who types verl's own key (as verl's example scripts do, e.g.
actor_rollout_ref.rollout.tensor_model_parallel_size=2) gets that value: it is adopted into the pack key it
repeats, and the verl key interpolates again.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf, open_dict

# verl key -> the pack key it repeats
LAYOUT_FED_KEYS: dict[str, str] = {
    "trainer.nnodes": "cluster.nnodes",
    "trainer.n_gpus_per_node": "cluster.gpus_per_node",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "layout.infer.tp",
    "actor_rollout_ref.rollout.pipeline_model_parallel_size": "layout.infer.pp",
    "actor_rollout_ref.rollout.expert_parallel_size": "layout.infer.ep",
    # FSDP strategies: Ulysses sequence parallel is the training layout's cp
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": "layout.train.cp",
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size": "layout.train.cp",
    "critic.ulysses_sequence_parallel_size": "layout.train.cp",
    # Megatron
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size": "layout.train.tp",
    "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size": "layout.train.pp",
    "actor_rollout_ref.actor.megatron.context_parallel_size": "layout.train.cp",
    "actor_rollout_ref.actor.megatron.expert_model_parallel_size": "layout.train.ep",
    "actor_rollout_ref.ref.megatron.tensor_model_parallel_size": "layout.train.tp",
    "actor_rollout_ref.ref.megatron.pipeline_model_parallel_size": "layout.train.pp",
    "actor_rollout_ref.ref.megatron.context_parallel_size": "layout.train.cp",
    "actor_rollout_ref.ref.megatron.expert_model_parallel_size": "layout.train.ep",
    "critic.megatron.tensor_model_parallel_size": "layout.train.tp",
    "critic.megatron.pipeline_model_parallel_size": "layout.train.pp",
    "critic.megatron.context_parallel_size": "layout.train.cp",
    "critic.megatron.expert_model_parallel_size": "layout.train.ep",
}


# verl keys that repeat the name of a pack choice (strategy/, rollout/): adopted the same way
NAME_FED_KEYS: dict[str, str] = {
    "actor_rollout_ref.rollout.name": "rollout.name",
}

REPEATED_KEYS = {**LAYOUT_FED_KEYS, **NAME_FED_KEYS}


def present_keys(cfg: DictConfig) -> list[str]:
    """The layout-fed verl keys that exist under the chosen strategy."""
    return [key for key in LAYOUT_FED_KEYS if _exists(cfg, key)]


def _exists(cfg: DictConfig, key: str) -> bool:
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, throw_on_resolution_failure=False) if parent else cfg
    return isinstance(node, DictConfig) and leaf in node


def _is_interpolation(cfg: DictConfig, key: str) -> bool:
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, throw_on_resolution_failure=False)
    return OmegaConf.is_interpolation(node, leaf)


def adopt_direct_overrides(cfg: DictConfig) -> tuple[list[str], list[str]]:
    """Move values written on verl's layout keys into the pack keys they repeat. Returns (notes, problems)."""
    adopted: dict[str, tuple[str, object]] = {}
    problems: list[str] = []
    for verl_key, pack_key in REPEATED_KEYS.items():
        if not _exists(cfg, verl_key) or _is_interpolation(cfg, verl_key):
            continue
        value = OmegaConf.select(cfg, verl_key)
        if pack_key in adopted and adopted[pack_key][1] != value:
            first_key, first_value = adopted[pack_key]
            problems.append(f"{verl_key}: {value} disagrees with {first_key}={first_value}; both repeat {pack_key}")
            continue
        adopted.setdefault(pack_key, (verl_key, value))
    notes = []
    with open_dict(cfg):
        for pack_key, (verl_key, value) in adopted.items():
            before = OmegaConf.select(cfg, pack_key, throw_on_resolution_failure=False)
            OmegaConf.update(cfg, pack_key, value, merge=False)
            if before != value:
                notes.append(f"{verl_key}={value} sets {pack_key} (was {before})")
        for verl_key, pack_key in REPEATED_KEYS.items():
            if pack_key in adopted and _exists(cfg, verl_key):
                OmegaConf.update(cfg, verl_key, "${" + pack_key + "}", merge=False)
    return notes, problems
