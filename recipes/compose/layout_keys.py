"""The verl keys that repeat a layout or cluster number, and how a direct override of one is adopted.

Every key below interpolates from the pack's vocabulary (layout.*, cluster.*), so no layout number is written twice.
A user who types verl's own key (as verl's example scripts do, e.g.
actor_rollout_ref.rollout.tensor_model_parallel_size=2) gets that value: it is adopted into the pack key it
repeats, and the verl key interpolates again.
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf, open_dict

ROLE_STRATEGY_KEYS = ("actor_rollout_ref.actor.strategy", "actor_rollout_ref.ref.strategy", "critic.strategy")
"""verl's per-role engine choice; the pack sets all three from ``strategy=``
(recipes.compose.compose.refuse_mixed_engines)"""

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
    "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size": "layout.train.cp",
    "actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size": "layout.train.cp",
    "critic.fsdp.ulysses_sequence_parallel_size": "layout.train.cp",
    # VeOmni: Ulysses and expert parallelism (its ref and critic read the actor's values)
    "actor_rollout_ref.actor.veomni.ulysses_parallel_size": "layout.train.cp",
    "actor_rollout_ref.actor.veomni.expert_parallel_size": "layout.train.ep",
    "actor_rollout_ref.ref.veomni.ulysses_parallel_size": "layout.train.cp",
    "actor_rollout_ref.ref.veomni.expert_parallel_size": "layout.train.ep",
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
    "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size": "layout.train.etp",
    "actor_rollout_ref.ref.megatron.expert_tensor_parallel_size": "layout.train.etp",
    "critic.megatron.expert_tensor_parallel_size": "layout.train.etp",
}


# verl keys that repeat the name of a pack choice (strategy/, rollout/): adopted the same way
NAME_FED_KEYS: dict[str, str] = {
    "actor_rollout_ref.rollout.name": "rollout.name",
}

REPEATED_KEYS = {**LAYOUT_FED_KEYS, **NAME_FED_KEYS}


def _exists(cfg: DictConfig, key: str) -> bool:
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, throw_on_resolution_failure=False) if parent else cfg
    return isinstance(node, DictConfig) and leaf in node


def _is_interpolation(cfg: DictConfig, key: str) -> bool:
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, throw_on_resolution_failure=False)
    return OmegaConf.is_interpolation(node, leaf)


@dataclass(frozen=True)
class Adoption:
    """A verl key typed with a value of its own, and the pack key it repeats, which takes that value."""

    verl_key: str
    pack_key: str
    value: object
    before: object
    """the pack key's value before adoption"""

    @property
    def changed(self) -> bool:
        return self.before != self.value

    @property
    def note(self) -> str:
        return f"{self.verl_key}={self.value} sets {self.pack_key} (was {self.before})"


def find_adoptions(cfg: DictConfig) -> tuple[list[Adoption], list[str]]:
    """The verl keys written directly (not interpolating the pack key they repeat), and the problems: two verl keys
    that repeat one pack key with different values. Reads ``cfg`` only."""
    adopted: dict[str, Adoption] = {}
    problems: list[str] = []
    for verl_key, pack_key in REPEATED_KEYS.items():
        if not _exists(cfg, verl_key) or _is_interpolation(cfg, verl_key):
            continue
        value = OmegaConf.select(cfg, verl_key)
        first = adopted.get(pack_key)
        if first is not None and first.value != value:
            problems.append(
                f"{verl_key}: {value} disagrees with {first.verl_key}={first.value}; both repeat {pack_key}"
            )
            continue
        if first is None:
            before = OmegaConf.select(cfg, pack_key, throw_on_resolution_failure=False)
            adopted[pack_key] = Adoption(verl_key, pack_key, value, before)
    return list(adopted.values()), problems


def adopt(cfg: DictConfig, adoptions: list[Adoption]) -> None:
    """Write each adopted value into its pack key and point every verl key that repeats it back at the pack key."""
    pack_keys = {a.pack_key for a in adoptions}
    with open_dict(cfg):
        for adoption in adoptions:
            OmegaConf.update(cfg, adoption.pack_key, adoption.value, merge=False)
        for verl_key, pack_key in REPEATED_KEYS.items():
            if pack_key in pack_keys and _exists(cfg, verl_key):
                OmegaConf.update(cfg, verl_key, "${" + pack_key + "}", merge=False)
