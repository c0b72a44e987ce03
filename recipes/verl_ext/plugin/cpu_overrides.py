"""The verl overrides that run ``python -m verl.trainer.main_ppo`` on the CPU with the tiny assets.

Every key is verl's own dotted key (verl 0.9.1, ``verl/trainer/config/ppo_trainer.yaml``); a leading ``+`` marks a
key that verl's tree does not declare (Hydra must add it). Values holding ``{model_dir}``, ``{train_parquet}``,
``{val_parquet}``, ``{reward_py}``, ``{reward_fn}`` are filled from :class:`recipes.verl_ext.demo.TinyAssets` by
:func:`cli_overrides`. The groups say which conf group option each key belongs to (``parallel=cpu``,
``rollout=hf``, ``model=tiny``, ``data=tiny``); :data:`GRPO_DEMO`, :data:`KL_PPO_DEMO` and :func:`world_size`
are the deltas of the demo runs.

Checked end to end by ``tests/e2e/test_verl_cpu.py`` (GRPO world size 2, KL-PPO with a critic), and kept in step
with the recipes' embedded default (``conf/cluster/cpu.yaml`` and friends) by
``tests/recipes/test_cpu_overrides_agree.py``: every key here has the same value in the recipes' resolved config.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CPU_VERL_OVERRIDES",
    "GRPO_DEMO",
    "GROUPS",
    "KL_PPO_DEMO",
    "cli_overrides",
    "world_size",
]

_FP32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}

PARALLEL_CPU: dict[str, Any] = {
    # The CPU platform (registered by the plugin) names the device "cpu"; verl would otherwise keep "cuda".
    "trainer.device": "cpu",
    # One process per (logical) GPU; world size 1. world_size(n) changes this and the next key together.
    "trainer.n_gpus_per_node": 1,
    "trainer.nnodes": 1,
    # verl places every worker on a Ray "GPU" bundle; on the CPU those are logical GPUs declared at ray.init.
    "+ray_kwargs.ray_init.num_gpus": 1,
    # Each worker bundle reserves max_colocate_count=3 logical CPUs; declare enough for the bundles and the helper
    # actors (Ray only uses the number for scheduling, the cores are what they are).
    "ray_kwargs.ray_init.num_cpus": 16,
    # The dashboard is a dozen Python processes; on 2 cores their start-up delays every actor's.
    "+ray_kwargs.ray_init.include_dashboard": False,
    # FSDP1 refuses modules on the CPU; FSDP2 (fully_shard) runs over gloo.
    "actor_rollout_ref.actor.strategy": "fsdp2",
    "critic.strategy": "fsdp2",
    # Compute in fp32 like the hf rollout does: with verl's default bf16 params the rollout/actor gap is
    # max|dp| ~1e-4 and KL ~1e-3 per step, against ~1e-8 in fp32 (measured on the tiny model).
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision": _FP32,
    "+actor_rollout_ref.ref.fsdp_config.mixed_precision": _FP32,
    "+critic.fsdp.mixed_precision": _FP32,
    "actor_rollout_ref.ref.fsdp_config.model_dtype": "fp32",
    # torch.compile would JIT C++ kernels (inductor) at start-up for ops that take microseconds at this size.
    "actor_rollout_ref.actor.use_torch_compile": False,
    "actor_rollout_ref.actor.fsdp_config.use_torch_compile": False,
    "actor_rollout_ref.ref.fsdp_config.use_torch_compile": False,
    "critic.fsdp.use_torch_compile": False,
    # Packed (remove-padding) batches need flash-attention's varlen kernels; padded batches work with sdpa.
    "actor_rollout_ref.model.use_remove_padding": False,
    "critic.model.use_remove_padding": False,
    # flash_attention_2 is verl's default attention and does not exist on the CPU.
    "+actor_rollout_ref.model.override_config.attn_implementation": "sdpa",
    "+critic.model.override_config.attn_implementation": "sdpa",
    # Recomputing activations saves GPU memory; on a tiny model it only costs time.
    "actor_rollout_ref.model.enable_gradient_checkpointing": False,
    "critic.model.enable_gradient_checkpointing": False,
    # TransferQueue (the v1 trainer's data plane): one storage unit instead of 8 processes.
    "transfer_queue.backend.SimpleStorage.num_data_storage_units": 1,
    # Fewer helper processes: each Ray process imports verl (seconds of CPU on a 2-core machine).
    "actor_rollout_ref.rollout.agent.num_workers": 1,
    "reward.num_workers": 1,
    "data.dataloader_num_workers": 0,
    # The v1 replay buffer polls TransferQueue every 2 s (sized for GPU rollouts); a tiny rollout takes ~0.1 s.
    # verl's custom-sampler hook swaps in the same buffer with a 20 ms poll.
    "trainer.v1.sampler.custom_sampler.path": "pkg://recipes.verl_ext.plugin.replay_buffer",
    "trainer.v1.sampler.custom_sampler.name": "FastPollReplayBuffer",
}

ROLLOUT_HF: dict[str, Any] = {
    # The plugin's HF-transformers rollout (recipes.verl_ext.plugin.hf_rollout).
    "actor_rollout_ref.rollout.name": "hf",
    # Ranks per hf server (it does not shard; rank 0 of each replica feeds it). world_size(n) sets n: one server.
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
    # Nothing to free between generation and training on the CPU.
    "actor_rollout_ref.rollout.free_cache_engine": False,
    # Ask the server for log-probs so verl reports training/rollout_probs_diff_* (rollout vs actor).
    "actor_rollout_ref.rollout.calculate_log_probs": True,
}

MODEL_TINY: dict[str, Any] = {
    # The random Qwen2-family model and its tokenizer, built locally by recipes.verl_ext.demo.
    "actor_rollout_ref.model.path": "{model_dir}",
    "critic.model.path": "{model_dir}",
    # A tiny random model learns at rates that would wreck a pretrained one: over 20 GRPO steps the mean reward goes
    # 0.13 -> 0.21 at lr 2e-3 and 0.13 -> 0.78 at 1e-2 (the format part of the reward: all digits).
    "actor_rollout_ref.actor.optim.lr": 1e-2,
    "critic.optim.lr": 1e-2,
}

DATA_TINY: dict[str, Any] = {
    # The synthetic "a+b=" task in verl's RL parquet format, and its rule-based reward.
    "data.train_files": "{train_parquet}",
    "data.val_files": "{val_parquet}",
    "reward.custom_reward_function.path": "{reward_py}",
    "reward.custom_reward_function.name": "{reward_fn}",
    # Fixed prompt order (verl shuffles with an unseeded generator when data.seed is null).
    "data.seed": 0,
    # ChatML prompts are ~12 tokens; a short response budget keeps a step well under a second of generation.
    "data.max_prompt_length": 32,
    "data.max_response_length": 16,
    # 8 prompts x rollout.n samples per step, one PPO mini-batch.
    "data.train_batch_size": 8,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 8,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 16,
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 16,
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 16,
    "critic.ppo_micro_batch_size_per_gpu": 16,
}

TRAINER_DEMO: dict[str, Any] = {
    "trainer.total_training_steps": 20,
    "trainer.total_epochs": 1,
    "trainer.logger": ["console", "file"],
    "trainer.val_before_train": False,
    "trainer.test_freq": -1,
    "trainer.save_freq": -1,
    "trainer.resume_mode": "disable",
    "trainer.project_name": "klppo_cpu",
    "trainer.experiment_name": "tiny",
}

GROUPS: dict[str, dict[str, Any]] = {
    "parallel=cpu": PARALLEL_CPU,
    "rollout=hf": ROLLOUT_HF,
    "model=tiny": MODEL_TINY,
    "data=tiny": DATA_TINY,
    "trainer (demo)": TRAINER_DEMO,
}

CPU_VERL_OVERRIDES: dict[str, Any] = {key: value for group in GROUPS.values() for key, value in group.items()}
"""All of the above, in order: what ``main_ppo`` needs on the CPU with the tiny assets."""

GRPO_DEMO: dict[str, Any] = {
    "algorithm.adv_estimator": "grpo",
    # GRPO's baseline is the group mean: no critic (said explicitly, verl warns when it has to infer it).
    "critic.enable": False,
    # GRPO's group: 4 samples per prompt.
    "actor_rollout_ref.rollout.n": 4,
    "actor_rollout_ref.actor.use_kl_loss": False,
    "algorithm.use_kl_in_reward": False,
}

KL_PPO_DEMO: dict[str, Any] = {
    "algorithm.adv_estimator": "gae",
    # PPO's baseline is a learned value model (the critic, a fourth FSDP model on the same ranks).
    "critic.enable": True,
    "actor_rollout_ref.rollout.n": 1,
    # KL to the reference policy both as a reward penalty and as a loss term (the reference is a third model).
    "algorithm.use_kl_in_reward": True,
    "algorithm.kl_ctrl.kl_coef": 0.01,
    "actor_rollout_ref.actor.use_kl_loss": True,
    "actor_rollout_ref.actor.kl_loss_coef": 0.01,
    "data.train_batch_size": 16,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 16,
    "critic.ppo_mini_batch_size": 16,
}


def world_size(n: int) -> dict[str, Any]:
    """The keys that set the number of actor processes (FSDP2 ranks over gloo), with one hf server for all of them
    (fed by rank 0, as the recipes' ``parallel=cpu`` does)."""
    return {
        "trainer.n_gpus_per_node": n,
        "+ray_kwargs.ray_init.num_gpus": n,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": n,
    }


def _format(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_format(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{key}:{_format(item)}" for key, item in value.items()) + "}"
    return str(value)


def cli_overrides(assets, *deltas: dict[str, Any]) -> list[str]:
    """``key=value`` arguments for ``python -m verl.trainer.main_ppo``: CPU_VERL_OVERRIDES, then each delta in turn.

    ``assets`` is a :class:`recipes.verl_ext.demo.TinyAssets`; its paths fill the ``{...}`` placeholders.
    """
    fields = {
        "model_dir": assets.model_dir,
        "train_parquet": assets.train_parquet,
        "val_parquet": assets.val_parquet,
        "reward_py": assets.reward_py,
        "reward_fn": assets.reward_fn,
    }
    merged = dict(CPU_VERL_OVERRIDES)
    for delta in deltas:
        merged.update(delta)
    args = []
    for key, value in merged.items():
        text = _format(value)
        if isinstance(value, str):
            text = text.format(**fields)
        args.append(f"{key}={text}")
    return args
