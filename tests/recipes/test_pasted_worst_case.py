"""A verl script its authors ran is not refused on a worst case (issue 49, 8). Fixed micro-batches are the script's own
sizes, and the plan puts every response at data.max_response_length: where they overcommit only at that length, the
run goes on with a warning that says the length they fit to and what fits at any length; where the states alone
overcommit, and for the pack's token budgets (the plan's to choose), it stays an error."""

from __future__ import annotations

import re

import pytest

from recipes.launch import run_recipe

# verl's examples/rloo_trainer/run_qwen2-7b.sh (volcengine/verl 3f38806), as a user pastes it: 8 GPUs, fixed
# micro-batches of 80 (update) and 160 (log-prob), responses up to 1,024 tokens
RLOO_QWEN2_7B = [
    "algorithm.adv_estimator=rloo", "data.train_files=/home/user/data/gsm8k/train.parquet",
    "data.val_files=/home/user/data/gsm8k/test.parquet", "data.train_batch_size=1024", "data.max_prompt_length=512",
    "data.max_response_length=1024", "data.filter_overlong_prompts=True", "data.truncation=error",
    "actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct", "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.model.use_remove_padding=True", "actor_rollout_ref.actor.ppo_mini_batch_size=256",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=80", "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=160",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6", "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=160",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "algorithm.use_kl_in_reward=True", "algorithm.kl_penalty=kl", "algorithm.kl_ctrl.kl_coef=0.001",
    "trainer.critic_warmup=0", "trainer.logger=['console','wandb']", "trainer.project_name=verl_rloo_example_gsm8k",
    "trainer.experiment_name=qwen2_7b_function_rm", "trainer.n_gpus_per_node=8", "trainer.nnodes=1",
    "trainer.save_freq=-1", "trainer.test_freq=5", "trainer.total_epochs=15",
]
WARNING = re.compile(r"^warning: memory: planned peak ([\d.]+) GiB per GPU in log_prob > cluster\.gpu\.memory_gib 80 "
                     r"\(h100_80g\), .* if every response reaches data\.max_response_length 1024; the fixed "
                     r"micro-batches fit with responses up to (\d+) tokens: going on \(it may run out of GPU memory on "
                     r"longer ones; these fit at any length: .*\)$", re.M)


def _memory_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "memory: planned peak" in line]


@pytest.mark.slow  # a child process (verl's dataclasses, the plan)
def test_verls_rloo_example_runs_with_a_warning_that_names_the_length_it_fits(tmp_path, recipe_cli):
    proc = recipe_cli("grpo", *RLOO_QWEN2_7B, "action=validate", cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "config error" not in proc.stderr
    (match,) = WARNING.finditer(proc.stderr)
    assert float(match[1]) > 80 and 0 < int(match[2]) < 1024
    assert proc.stdout.startswith("config OK: fsdp2 train dp8")


@pytest.mark.slow  # three validations of a 7B plan
def test_the_length_it_names_is_where_the_plan_stops_fitting(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    run_recipe("grpo", [*RLOO_QWEN2_7B, "action=validate"])
    longest = int(WARNING.search(capsys.readouterr().err)[2])
    run_recipe("grpo", [*RLOO_QWEN2_7B, f"data.max_response_length={longest}", "action=validate"])
    assert _memory_lines(capsys.readouterr().err) == []  # at that length: no warning
    run_recipe("grpo", [*RLOO_QWEN2_7B, f"data.max_response_length={longest + 1}", "action=validate"])
    assert len(_memory_lines(capsys.readouterr().err)) == 1  # one token more: the warning


def test_fixed_micro_batches_whose_states_alone_overcommit_stay_an_error(tmp_path, monkeypatch, capsys):
    """Qwen2.5-32B's fp32 Adam states on one 80 GB GPU do not fit at any length."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        run_recipe("grpo", ["model=qwen2_5_32b", "cluster=h100_80g", "cluster.gpus_per_node=1", "parallel=tp1",
                            "batching=fixed", "action=validate"])
    assert exit_.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("config error: memory")]
    assert len(errors) == 1 and "per GPU in training > cluster.gpu.memory_gib 80" in errors[0]
