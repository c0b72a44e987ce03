"""verl's own example overrides are accepted unchanged by the recipes and land on the same values."""

from __future__ import annotations

from pathlib import Path

from recipes.compose import compose_recipe
from recipes.validate import validate

# verl examples/grpo_trainer/run_qwen2-7b_seq_balance.sh: its dotted overrides after the shell expands them
# ($HOME, rollout_name=sglang, rollout_mode=async, return_raw_chat=True, quotes removed)
HOME = str(Path.home())
VERL_GRPO_SEQ_BALANCE_QWEN2_7B = [
    "algorithm.adv_estimator=grpo",
    f"data.train_files={HOME}/data/gsm8k/train.parquet",
    f"data.val_files={HOME}/data/gsm8k/test.parquet",
    "data.return_raw_chat=True",
    "data.train_batch_size=1024",
    "data.max_prompt_length=512",
    "data.max_response_length=1024",
    "data.filter_overlong_prompts=True",
    "data.truncation=error",
    "actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=256",
    "actor_rollout_ref.actor.use_dynamic_bsz=True",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24000",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
    "actor_rollout_ref.rollout.name=sglang",
    "actor_rollout_ref.rollout.mode=async",
    "actor_rollout_ref.rollout.multi_turn.format=hermes",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0",
    "trainer.logger=[console,wandb]",
    "trainer.project_name=verl_grpo_example_gsm8k",
    "trainer.experiment_name=qwen2_7b_function_rm_kl1e-3",
    "trainer.val_before_train=False",
    "trainer.n_gpus_per_node=8",
    "trainer.nnodes=1",
    "trainer.save_freq=20",
    "trainer.test_freq=5",
    "trainer.total_epochs=15",
]


def test_verl_grpo_example_overrides_are_accepted_and_land():
    # unchanged: the script's overrides alone, on the recipe's GPU defaults
    cfg = compose_recipe("grpo", VERL_GRPO_SEQ_BALANCE_QWEN2_7B)
    checked = validate(cfg)
    resolved = checked.cfg
    assert resolved.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 24000
    assert resolved.actor_rollout_ref.rollout.tensor_model_parallel_size == 2
    assert resolved.layout.infer.tp == 2  # adopted into the pack's layout: no drift
    assert resolved.actor_rollout_ref.model.path == "Qwen/Qwen2-7B-Instruct"
    assert resolved.actor_rollout_ref.rollout.name == "sglang" and resolved.rollout.name == "sglang"
    assert resolved.actor_rollout_ref.rollout.multi_turn.format == "hermes"
    assert resolved.data.train_files == f"{HOME}/data/gsm8k/train.parquet"
    assert resolved.actor_rollout_ref.ref.fsdp_config.param_offload is True
    assert resolved.actor_rollout_ref.actor.kl_loss_type == "low_var_kl"
    assert list(resolved.trainer.logger) == ["console", "wandb"]
    assert resolved.trainer.project_name == "verl_grpo_example_gsm8k"
    assert (resolved.trainer.nnodes, resolved.trainer.n_gpus_per_node, resolved.trainer.total_epochs) == (1, 8, 15)
    assert resolved.data.truncation == "error" and resolved.data.filter_overlong_prompts is True
    assert resolved.algorithm.adv_estimator == "grpo"
