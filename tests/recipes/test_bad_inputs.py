"""Bad input: one clear line naming the key (with the arithmetic), exit code 2, no traceback, nothing started."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from recipes.launch import run_recipe
from tests.conftest import ROOT

# (recipe, argv, text the single error line must contain)
BAD = [
    ("grpo", ["parallel=tp9"],
     "parallel=tp9: no such option; choose from cpu, tp1, tp2, tp4, tp4pp2, tp8, tp8pp4"),
    ("grpo", ["kl=strict"], "kl=strict: no such option; choose from adaptive, fixed, ramp"),
    ("kl_ppo", ["model=gpt5"], "model=gpt5: no such option; choose from "),
    ("grpo", ["nccl=infiniband"], "nccl=infiniband: no such option"),
    # a group's shared part is not an option
    ("grpo", ["cluster=_node"], "cluster=_node: no such option; choose from a100_80g, cpu, h100_80g, h200_141g"),
    ("grpo", ["actor_rollout_ref.actor.optim.lrr=3"],
     "actor_rollout_ref.actor.optim.lrr: no such key (did you mean actor_rollout_ref.actor.optim.lr?)"),
    ("grpo", ["parallell=tp2"],
     "parallell=tp2: no such key or config group (did you mean parallel=tp2? its options: cpu, tp1, tp2, tp4,"),
    ("grpo", ["algorithm.adv_estimatr=gae"],
     "algorithm.adv_estimatr: no such key (did you mean algorithm.adv_estimator?)"),
    ("grpo", ["parallel=tp8pp4", "strategy=megatron"],
     "layout.train: dp=-1 needs tp(8)*pp(4)*cp(1)=32 to divide world_size 8 "
     "(cluster.nnodes 1 * cluster.gpus_per_node 8)"),
    ("grpo", ["parallel=tp1", "layout.train.cp=3"],
     "layout.train: dp=-1 needs tp(1)*pp(1)*cp(3)=3 to divide world_size 8"),
    ("kl_ppo", ["parallel=tp4pp2"], "layout.train.pp: pp(2) > 1 needs strategy=megatron"),
    ("grpo", ["parallel=tp2", "data.train_batch_size=100"],
     "actor_rollout_ref.actor.ppo_mini_batch_size: data.train_batch_size(100) must be a multiple of "
     "ppo_mini_batch_size(256)"),
    ("grpo", ["parallel=tp1", "cluster.gpus_per_node=7"],
     "actor_rollout_ref.actor.ppo_mini_batch_size: ppo_mini_batch_size(256) * rollout.n(5) = 1280 does not split "
     "over dp(7): 1280 % 7 = 6"),
    ("grpo", ["parallel=tp2", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=1000"],
     "actor_rollout_ref.actor.ppo_max_token_len_per_gpu: 1000 tokens * cp(1) = 1000 < one sequence, "
     "data.max_prompt_length(512) + data.max_response_length(1024) = 1536"),
    ("kl_ppo", ["strategy=megatron", "parallel=tp8", "model=qwen3_30b_a3b"],
     "layout.train.tp: Megatron needs tp(8) to divide qwen3_30b_a3b's 4 kv heads: 4 % 8 = 4"),
    ("grpo", ["parallel=tp8", "model=qwen2_5_0_5b"],
     "layout.infer.tp: qwen2_5_0_5b has 14 attention heads, not divisible by tp(8): 14 % 8 = 6"),
    # generation TP above training TP is fine (verl runs it); an engine that does not divide the world is not
    ("kl_ppo", ["strategy=megatron", "parallel=tp4pp2", "layout.infer.tp=3"],
     "layout.infer: dp=-1 needs tp(3)*pp(1)=3 to divide world_size 8"),
    ("grpo", ["cluster.nnodes=0"], "cluster.nnodes: must be a positive integer, got 0"),
    ("grpo", ["run.gc_threshold=[50000,20]"],
     "run.gc_threshold: must be 3 integers >= 0 (gen0, gen1, gen2 of Python's gc.set_threshold) or null, got "
     "[50000, 20]"),
    ("grpo", ["action=deploy"], "action: unknown action 'deploy'; choose from validate, plan, train"),
    ("grpo", ["actor_rollout_ref.rollout.n=0"], "actor_rollout_ref.rollout.n: must be a positive integer, got 0"),
    # verl's engine switch: adopted as the pack's strategy, refused where the two disagree or the pack has none
    ("grpo", ["parallel=tp2", "model_engine=megatron", "strategy=fsdp2"],
     "model_engine=megatron and strategy=fsdp2 disagree: verl's megatron engine is strategy=megatron"),
    ("kl_ppo", ["strategy=megatron", "parallel=tp8", "actor_rollout_ref.actor.strategy=fsdp2"],
     "actor_rollout_ref.actor.strategy=fsdp2 and strategy=megatron disagree: the pack sets the actor's, reference's "
     "and critic's engine from strategy=; type strategy=fsdp2"),
    ("grpo", ["parallel=tp8", "actor_rollout_ref.ref.strategy=megatron"],
     "actor_rollout_ref.ref.strategy=megatron and the recipe's strategy=fsdp2 disagree"),
    ("grpo", ["parallel=tp2", "model_engine=torchtitan"],
     "model_engine=torchtitan: the pack trains with verl's engines dp, megatron, veomni "
     "(strategy=fsdp|fsdp2|megatron|veomni)"),
    ("grpo", ["strategy=megatron", "parallel=tp4pp2", "model=qwen3_30b_a3b", "layout.train.ep=4",
              "layout.train.etp=3", "cluster.nnodes=2"],
     "layout.train.ep: ep(4)*etp(3)=12 must divide dp(2)*cp(1)*tp(4)=8 (Megatron's expert layers tile the ranks"),
    # values out of the range verl's algorithms and torch's optimizers work in (recipes/verl_ext/types.py RANGES)
    ("kl_ppo", ["algorithm.gamma=1.5"], "algorithm.gamma: must be in [0, 1] (a discount factor), got 1.5"),
    ("kl_ppo", ["algorithm.lam=-0.1"], "algorithm.lam: must be in [0, 1] (GAE's lambda), got -0.1"),
    ("kl_ppo", ["algorithm.kl_ctrl.kl_coef=inf"],
     "algorithm.kl_ctrl.kl_coef: must be a finite number >= 0 (a KL coefficient), got inf"),
    ("grpo", ["actor_rollout_ref.actor.kl_loss_coef=nan"],
     "actor_rollout_ref.actor.kl_loss_coef: must be a finite number >= 0 (a KL coefficient), got nan"),
    ("kl_ppo", ["algorithm.kl_ctrl.target_kl=inf"], "algorithm.kl_ctrl.target_kl: must be a finite number >= 0"),
    ("grpo", ["actor_rollout_ref.actor.optim.clip_grad=0"], "actor_rollout_ref.actor.optim.clip_grad: must be > 0"),
    ("kl_ppo", ["critic.optim.clip_grad=-1"], "critic.optim.clip_grad: must be > 0"),
    ("grpo", ["actor_rollout_ref.actor.optim.min_lr_ratio=1.5"],
     "actor_rollout_ref.actor.optim.min_lr_ratio: must be in [0, 1]"),
    ("kl_ppo", ["critic.optim.lr_warmup_steps_ratio=2"],
     "critic.optim.lr_warmup_steps_ratio: must be in [0, 1] (a share of the run's steps), got 2"),
    ("grpo", ["actor_rollout_ref.actor.optim.num_cycles=-1"], "actor_rollout_ref.actor.optim.num_cycles: must be >= 0"),
    ("grpo", ["actor_rollout_ref.rollout.top_k=-5"], "actor_rollout_ref.rollout.top_k: must be >= -1"),
    # names verl looks up only once the run is going (recipes/verl_ext/names.py)
    ("kl_ppo", ["algorithm.kl_penalty=kl2"], "algorithm.kl_penalty: must be one of verl 0.9.1's KL estimators: "),
    ("grpo", ["actor_rollout_ref.actor.kl_loss_type=k4"], "actor_rollout_ref.actor.kl_loss_type: must be one of"),
    ("kl_ppo", ["algorithm.kl_ctrl.type=pid"], "algorithm.kl_ctrl.type: must be one of verl 0.9.1's KL controllers"),
    ("grpo", ["algorithm.adv_estimator=grpoo"], "(did you mean grpo?); got 'grpoo'"),
    ("grpo", ["actor_rollout_ref.actor.policy_loss.loss_mode=ppo"],
     "actor_rollout_ref.actor.policy_loss.loss_mode: must be one of verl 0.9.1's policy losses: "),
    ("grpo", ["actor_rollout_ref.actor.optim.optimizer=AdamWW"],
     "actor_rollout_ref.actor.optim.optimizer: torch.optim has no optimizer 'AdamWW' (did you mean AdamW?)"),
    ("grpo", ["actor_rollout_ref.actor.optim.optimizer_impl=torch.optimz"],
     "actor_rollout_ref.actor.optim.optimizer_impl: cannot import 'torch.optimz'"),
    ("grpo", ["trainer.resume_mode=continue"],
     "trainer.resume_mode: must be one of verl 0.9.1's resume modes: auto, disable, resume_path; got 'continue'"),
    ("grpo", ["actor_rollout_ref.actor.checkpoint.save_contents=[model,weights]"],
     "actor_rollout_ref.actor.checkpoint.save_contents: each item must be one of verl 0.9.1's checkpoint contents: "
     "model, optimizer, extra, hf_model; got 'weights'"),
    ("grpo", ["actor_rollout_ref.actor.optim.lr_scheduler_type=linear"],
     "actor_rollout_ref.actor.optim.lr_scheduler_type: must be one of verl 0.9.1's learning-rate schedules: "
     "constant, cosine; got 'linear'"),
    ("grpo", ["trainer.logger=[consol]"], "trainer.logger: each item must be one of"),
    ("grpo", ["data.truncation=cut"], "data.truncation: must be one of verl 0.9.1's truncation modes"),
    # the columns verl reads by a key's name, against the schema of a parquet file that is here
    ("grpo", ["data.prompt_key=question"],
     "data.prompt_key: 'question' is not a column of data.train_files "),
    ("kl_ppo", ["data.reward_fn_key=source"], "(its columns: data_source, prompt, ability, reward_model, extra_info)"),
    # prompt + response against the model's positions (vLLM's rule: RoPE scaling extends them)
    ("grpo", ["model=qwen2_5_0_5b", "data.max_response_length=32760"],
     "data.max_response_length: data.max_prompt_length(32) + data.max_response_length(32760) = 32,792 tokens; "
     "qwen2_5_0_5b's longest sequence is 32,768 tokens (max_position_embeddings in its config.json)"),
    ("grpo", ["actor_rollout_ref.rollout.max_model_len=4096"],
     "actor_rollout_ref.rollout.max_model_len: 4,096 tokens; tiny's longest sequence is 2,048 tokens"),
    # the Ray cluster the run starts: fewer CPUs or GPUs than verl's workers hold waits forever
    ("grpo", ["ray_kwargs.ray_init.num_cpus=4"],
     "ray_kwargs.ray_init.num_cpus: 4 CPUs for the Ray cluster this run starts; verl's workers hold 3 per rank x 1 "
     "rank + 1 (its TaskRunner) + 1 (to place the agent-loop and reward workers) = 5"),
    ("kl_ppo", ["cluster.gpus_per_node=2", "ray_kwargs.ray_init.num_gpus=1"],
     "ray_kwargs.ray_init.num_gpus: 1 GPUs for the Ray cluster this run starts"),
    # '+' on a key or a group the config has already
    ("grpo", ["+ray_kwargs.ray_init.num_cpus=8"],
     "+ray_kwargs.ray_init.num_cpus=8: the key is already in the config; '+' adds a new key only: write "
     "ray_kwargs.ray_init.num_cpus=8"),
    ("grpo", ["+parallel=tp2"], "+parallel=tp2: the recipe chooses a parallel option already; write parallel=tp2"),
]


@pytest.mark.parametrize("recipe,argv,expected", BAD, ids=[" ".join(a) for _, a, _ in BAD])
def test_bad_input_exits_2_with_one_line(recipe, argv, expected, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        run_recipe(recipe, argv + ["action=validate"] if not any(a.startswith("action=") for a in argv) else argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("config error: ")
    assert expected in err[0]
    assert "Traceback" not in err[0]
    assert not (tmp_path / "runs").exists(), "a bad input must not leave a run folder behind"


def test_real_process_bad_layout(tmp_path, recipe_cli):
    proc = recipe_cli("kl_ppo", "parallel=tp8pp4", "strategy=megatron", "cluster.nnodes=2", "action=validate",
                      cwd=tmp_path, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "config error: layout.train: dp=-1 needs tp(8)*pp(4)*cp(1)=32 to divide world_size 16 "
        "(cluster.nnodes 2 * cluster.gpus_per_node 8) (remainder 16)"
    )
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (tmp_path / "runs").exists()


def test_real_process_too_few_ray_cpus_stops_a_training_run_before_ray(tmp_path, recipe_cli):
    """action=train (the default) with fewer CPUs than verl's workers hold: Ray waited for them forever before."""
    proc = recipe_cli("grpo", "ray_kwargs.ray_init.num_cpus=4", cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "config error: ray_kwargs.ray_init.num_cpus: 4 CPUs for the Ray cluster this run starts")
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (tmp_path / "runs").exists()


def test_the_cpu_default_declares_the_cpus_its_ranks_hold(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    run_recipe("grpo", ["cluster.gpus_per_node=8", "action=validate"])
    (saved,) = (tmp_path / "runs" / "grpo").glob("*/resolved_config.yaml")
    assert OmegaConf.load(saved).ray_kwargs.ray_init.num_cpus == 3 * 8 + 2


def test_real_process_article_layout_validates(tmp_path, recipe_cli):
    proc = recipe_cli("kl_ppo", "parallel=tp8pp4", "strategy=megatron", "cluster.nnodes=4", "action=validate",
                      cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    expected = ("config OK: megatron train dp1 tp8 pp4 cp1 ep1 -> vllm infer tp4 pp1 x8 replicas on 4x8 h100_80g "
                "(assumed; cluster=a100_80g|h200_141g|h800_80g for another)")
    assert proc.stdout.startswith(expected)
    # the sample of this command in the README and in docs/checking.md is its first line, word for word
    for page in (ROOT / "README.md", ROOT / "docs" / "checking.md"):
        sample = page.read_text().split("$ python -m recipes.kl_ppo parallel=tp8pp4 strategy=megatron cluster.nnodes=4 "
                                        "action=validate\n", 1)[1]
        assert sample.splitlines()[0] == proc.stdout.splitlines()[0], page.name
    written = list((tmp_path / "runs" / "kl_ppo").glob("*/resolved_config.yaml"))
    assert len(written) == 1
    text = written[0].read_text()
    assert "tensor_model_parallel_size: 8" in text and "pipeline_model_parallel_size: 4" in text


def test_a_micro_batch_that_does_not_divide_the_mini_batch_is_a_warning(capsys, tmp_path, monkeypatch):
    # verl 0.9.1 accepts it (the last micro-batch of each mini-batch is shorter): so does the pack, with a warning
    monkeypatch.chdir(tmp_path)
    run_recipe("grpo", ["parallel=tp2", "batching=fixed", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=7",
                        "action=validate"])
    assert capsys.readouterr().err.count(
        "warning: actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu: the mini-batch per GPU, "
        "ppo_mini_batch_size(256) * rollout.n(5) / dp(8) = 160, is not a multiple of ppo_micro_batch_size_per_gpu(7): "
        "160 % 7 = 6, so the last micro-batch of each mini-batch holds 6 sequences") == 1
