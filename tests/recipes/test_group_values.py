"""What each group option sets in verl: the numbers the table of docs/config.md promises."""

from __future__ import annotations

from recipes.check.validate import validate
from recipes.compose.compose import compose_recipe


def resolved(recipe, *overrides):
    return validate(compose_recipe(recipe, list(overrides))).cfg


def test_dynamic_batching_budgets_are_multiples_of_one_sequence():
    cfg = resolved("kl_ppo", "batching=dynamic", "data.max_prompt_length=1000", "data.max_response_length=2000",
                   "batching.actor_factor=3", "batching.logprob_factor=4", "batching.critic_factor=6")
    assert cfg.actor_rollout_ref.actor.use_dynamic_bsz is True
    assert cfg.actor_rollout_ref.model.use_remove_padding is True and cfg.critic.model.use_remove_padding is True
    assert cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 3 * 3000
    assert cfg.actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu == 4 * 3000
    assert cfg.actor_rollout_ref.ref.log_prob_max_token_len_per_gpu == 4 * 3000
    assert cfg.critic.ppo_max_token_len_per_gpu == 2 * cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu
    assert cfg.critic.forward_max_token_len_per_gpu == cfg.critic.ppo_max_token_len_per_gpu
    # the default: the auto budgets of the memory model (tests/recipes/test_budget.py); the critic twice the actor's,
    # at most its mini-batch per GPU: ppo_mini_batch_size 256 * rollout.n 1 / dp 8 = 32 sequences of 3000 tokens
    auto = resolved("kl_ppo", "batching=dynamic", "data.max_prompt_length=1000", "data.max_response_length=2000")
    budget = auto.actor_rollout_ref.actor.ppo_max_token_len_per_gpu
    assert 3000 <= budget < 32 * 3000 and budget % 256 == 0
    assert auto.critic.ppo_max_token_len_per_gpu == min(2 * budget, 32 * 3000)
    fixed = resolved("kl_ppo", "batching=fixed")
    assert not fixed.actor_rollout_ref.actor.use_dynamic_bsz and not fixed.critic.use_dynamic_bsz


def test_nccl_presets_reach_the_ray_runtime_env():
    env = resolved("grpo", "nccl=ib").ray_kwargs.ray_init.runtime_env.env_vars
    assert env["NCCL_IB_HCA"] == "mlx5_0" and env["NCCL_CROSS_NIC"] == "0" and env["NCCL_PROTO"] == "Simple"
    assert env["TORCH_NCCL_HIGH_PRIORITY"] == "1"
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in env  # FSDP2 must not serialise kernel launches
    megatron = resolved("grpo", "nccl=ib", "strategy=megatron", "parallel=tp8").ray_kwargs.ray_init.runtime_env.env_vars
    assert megatron["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert resolved("grpo", "nccl=off").ray_kwargs.ray_init.runtime_env.env_vars == {}
    assert resolved("grpo", "nccl=debug").ray_kwargs.ray_init.runtime_env.env_vars["NCCL_DEBUG"] == "INFO"
    assert all(isinstance(v, str) for v in env.values())


def test_kl_options():
    fixed = resolved("kl_ppo", "kl=fixed")
    ctrl = fixed.algorithm.kl_ctrl
    assert (ctrl.type, ctrl.kl_coef, fixed.kl.guard.max_kl) == ("fixed", 0.001, 0.5)
    adaptive = resolved("kl_ppo", "kl=adaptive")
    assert (adaptive.algorithm.kl_ctrl.type, adaptive.algorithm.kl_ctrl.target_kl) == ("adaptive", 0.1)
    ramp = resolved("kl_ppo", "kl=ramp")
    assert (ramp.kl.ramp.start, ramp.kl.ramp.end, ramp.algorithm.kl_ctrl.target_kl) == (0.1, 0.3, 0.1)
    assert fixed.algorithm.use_kl_in_reward is True and fixed.actor_rollout_ref.actor.use_kl_loss is False
    grpo = resolved("grpo")
    assert grpo.actor_rollout_ref.actor.use_kl_loss is True and grpo.algorithm.use_kl_in_reward is False
    assert grpo.actor_rollout_ref.actor.clip_ratio == 0.2


def test_entropy_overlap_offload():
    assert resolved("grpo", "entropy=clip_cov").actor_rollout_ref.actor.policy_loss.loss_mode == "clip_cov"
    assert resolved("grpo", "entropy=kl_cov").actor_rollout_ref.actor.policy_loss.kl_cov_ratio == 0.0002
    prefetch = resolved("kl_ppo", "overlap=prefetch")
    assert prefetch.actor_rollout_ref.actor.fsdp_config.forward_prefetch is True
    assert prefetch.critic.fsdp.forward_prefetch is True
    # (llama3_1_8b's KL-PPO at Megatron tp8 dp1 plans above 80 GiB: recipes.check.fit; only the values matter here)
    megatron = resolved("kl_ppo", "overlap=prefetch", "strategy=megatron", "parallel=tp8", "run.allow_overcommit=true")
    assert megatron.actor_rollout_ref.actor.megatron.override_ddp_config.overlap_param_gather is True
    full = resolved("kl_ppo", "offload=full")
    fsdp = full.actor_rollout_ref.actor.fsdp_config
    assert (fsdp.param_offload, fsdp.optimizer_offload, fsdp.offload_policy) == (True, True, True)
    assert full.actor_rollout_ref.ref.fsdp_config.param_offload is True
    assert resolved("kl_ppo", "offload=optimizer").actor_rollout_ref.actor.fsdp_config.param_offload is False


def test_recipes_differ_where_the_algorithm_does():
    grpo, ppo = resolved("grpo"), resolved("kl_ppo")
    assert (grpo.algorithm.adv_estimator, ppo.algorithm.adv_estimator) == ("grpo", "gae")
    assert (grpo.actor_rollout_ref.rollout.n, ppo.actor_rollout_ref.rollout.n) == (5, 1)
    assert ppo.critic.enable is True and ppo.critic.model.path == ppo.actor_rollout_ref.model.path
