"""Issue 49, sections 2 and 3: names verl 0.9.1 looks up at run time, and combinations that cannot run, refused (or
warned of) before Ray starts, as the user types them: exit 2, one line naming the full key, no traceback, nothing on
disk. verl's own valid values still pass. The expected lines and choices are written out here from verl 0.9.1's
source (its registries and the checks in its trainer), not computed by recipes.check.lookups."""

from __future__ import annotations

import json
import types

import pytest

from recipes.check import lookups

TINY_HEADS = 4  # hybrid_engine/model_configs/tiny/config.json: num_attention_heads
TINY_KV_HEADS = 2


def _refused(proc, cwd) -> list[str]:
    """The error lines of a refused command, after what every refusal promises."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "Traceback" not in out
    assert "Started a local Ray instance" not in out
    assert list(cwd.iterdir()) == [], "a refused run must leave nothing behind (no runs/ folder)"
    return proc.stderr.strip().splitlines()


def _validate(recipe_cli, tmp_path, recipe: str, *args: str):
    return recipe_cli(recipe, *args, "action=validate", cwd=tmp_path, timeout=400)


# ---- section 2: names verl looks up at run time (one command each, as typed) ----------------------------------------


@pytest.mark.slow
def test_a_misspelt_rollout_engine_is_refused_with_verls_engines(tmp_path, recipe_cli):
    proc = _validate(recipe_cli, tmp_path, "grpo", "actor_rollout_ref.rollout.name=vllmm")
    assert _refused(proc, tmp_path) == [
        "config error: actor_rollout_ref.rollout.name: 'vllmm' is not one of verl 0.9.1's rollout engines: hf, "
        "sglang, trtllm, vllm (did you mean vllm?)"]


@pytest.mark.slow
def test_a_misspelt_reward_manager_is_refused_with_verls_reward_managers(tmp_path, recipe_cli):
    proc = _validate(recipe_cli, tmp_path, "grpo", "reward.reward_manager.name=naiv")
    assert _refused(proc, tmp_path) == [
        "config error: reward.reward_manager.name: 'naiv' is not one of verl 0.9.1's reward managers: dapo, gdpo, "
        "naive, rate_limited, remote (did you mean naive?)"]


@pytest.mark.slow
def test_a_reward_function_the_file_does_not_define_is_refused(tmp_path, recipe_cli):
    work = tmp_path / "work"
    work.mkdir()
    reward = tmp_path / "my_reward.py"
    reward.write_text("from __future__ import annotations\n\nimport math\n\n\ndef compute_score(*args, **kwargs):\n"
                      "    return 1.0\n")
    proc = _validate(recipe_cli, work, "grpo", f"reward.custom_reward_function.path={reward}",
                     "reward.custom_reward_function.name=compute_scor")
    assert _refused(proc, work) == [
        f"config error: reward.custom_reward_function.name: {reward} defines no 'compute_scor' (did you mean "
        "compute_score?) (verl 0.9.1 loads the reward function with getattr(module, 'compute_scor'); its top-level "
        "names: compute_score, math)"]


@pytest.mark.slow
def test_lora_target_modules_that_name_no_module_of_the_model_are_refused(tmp_path, recipe_cli):
    proc = _validate(recipe_cli, tmp_path, "grpo", "actor_rollout_ref.model.lora_rank=8",
                     "actor_rollout_ref.model.target_modules=[qproj]")
    assert _refused(proc, tmp_path) == [
        "config error: actor_rollout_ref.model.target_modules: ['qproj'] names no module of tiny (qproj: did you "
        "mean q_proj?): peft refuses the model (its Linear modules: down_proj, gate_proj, k_proj, lm_head, o_proj, "
        "q_proj, up_proj, v_proj; or all-linear)"]


@pytest.mark.slow
def test_a_misspelt_device_is_refused_with_verls_devices(tmp_path, recipe_cli):
    proc = _validate(recipe_cli, tmp_path, "grpo", "trainer.device=cudaa")
    assert _refused(proc, tmp_path) == [
        "config error: trainer.device: 'cudaa' is not one of verl 0.9.1's devices: cpu, cuda, npu (did you mean "
        "cuda?)"]


@pytest.mark.slow
def test_a_data_file_verl_cannot_read_is_refused(tmp_path, recipe_cli):
    proc = _validate(recipe_cli, tmp_path, "grpo", "data.train_files=README.md")
    assert _refused(proc, tmp_path) == [
        "config error: data.train_files: README.md is not a format verl 0.9.1 reads: its RLHFDataset reads .parquet, "
        ".json, .jsonl files (by the name's ending; data.custom_cls names a dataset class for others)"]


@pytest.mark.slow
def test_an_empty_parquet_file_is_refused_without_pyarrows_traceback(tmp_path, recipe_cli):
    work = tmp_path / "work"
    work.mkdir()
    empty = tmp_path / "train.parquet"
    empty.write_bytes(b"")
    proc = _validate(recipe_cli, work, "grpo", f"data.train_files={empty}")
    assert _refused(proc, work) == [
        f"config error: data.train_files: {empty} is empty (0 bytes): verl 0.9.1's dataset would have no rows"]


@pytest.mark.slow
def test_resume_path_without_a_path_is_refused(tmp_path, recipe_cli):
    proc = _validate(recipe_cli, tmp_path, "grpo", "trainer.resume_mode=resume_path")
    assert _refused(proc, tmp_path) == [
        "config error: trainer.resume_from_path: null, but trainer.resume_mode=resume_path resumes from it: name a "
        "checkpoint folder (<trainer.default_local_dir>/global_step_<n>), or use trainer.resume_mode=auto (the "
        "latest one) or run.resume=<run folder>"]


@pytest.mark.slow
def test_a_sweep_gets_the_same_lookups_naming_the_job(tmp_path, recipe_cli):
    proc = recipe_cli("grpo", "-m", "trainer.device=cudaa,cpu", "action=validate", cwd=tmp_path, timeout=400)
    assert _refused(proc, tmp_path) == [
        "config error: job 0 (trainer.device=cudaa): trainer.device: 'cudaa' is not one of verl 0.9.1's devices: "
        "cpu, cuda, npu (did you mean cuda?)"]


# ---- section 3: combinations that cannot run ---------------------------------------------------------------------


@pytest.mark.slow
def test_gae_without_a_critic_is_refused(tmp_path, recipe_cli):
    proc = _validate(recipe_cli, tmp_path, "kl_ppo", "critic.enable=false")
    assert _refused(proc, tmp_path) == [
        "config error: critic.enable: false, but algorithm.adv_estimator=gae computes advantages from the critic's "
        "values: enable the critic, or choose an estimator without one (algorithm.adv_estimator=grpo)"]


@pytest.mark.slow
def test_vllm_on_the_cpu_cluster_is_refused(tmp_path, recipe_cli):
    proc = _validate(recipe_cli, tmp_path, "grpo", "rollout=vllm", "cluster=cpu", "parallel=cpu")
    assert _refused(proc, tmp_path) == [
        "config error: actor_rollout_ref.rollout.name: vllm generates on GPUs and cluster=cpu has none: rollout=hf "
        "generates on the CPU, or choose a GPU cluster (cluster=h100_80g, ...)"]


@pytest.mark.slow
def test_ulysses_cp_that_does_not_divide_the_heads_is_refused(tmp_path, recipe_cli):
    proc = _validate(recipe_cli, tmp_path, "grpo", "layout.train.cp=3", "cluster.gpus_per_node=3")
    assert _refused(proc, tmp_path) == [
        "config error: layout.train.cp: Ulysses sequence parallelism splits tiny's 4 attention heads over cp(3) "
        "ranks: 4 % 3 = 1"]


@pytest.mark.slow
def test_a_critic_with_a_smaller_vocabulary_than_the_actor_tokenizer_is_refused(tmp_path, recipe_cli):
    from hybrid_engine.model_spec import MODEL_CONFIG_DIR

    work, critic = tmp_path / "work", tmp_path / "critic"
    work.mkdir()
    critic.mkdir()
    config = json.loads((MODEL_CONFIG_DIR / "tiny" / "config.json").read_text())
    assert config["vocab_size"] == 512  # the tiny actor's tokenizer has 512 ids (recipes/verl_ext/demo builds it)
    (critic / "config.json").write_text(json.dumps({**config, "vocab_size": 256}))
    proc = _validate(recipe_cli, work, "kl_ppo", f"critic.model.path={critic}")
    (line,) = _refused(proc, work)
    assert line.startswith(f"config error: critic.model.path: {critic}'s vocabulary holds 256 ids, the actor's "
                           "tokenizer (")
    assert line.endswith(") 512: ids 256 to 511 fall outside the critic's embedding; use a critic of the actor's "
                         "family")


@pytest.mark.slow
def test_a_learning_rate_orders_of_magnitude_off_warns_with_the_value_and_runs(tmp_path, recipe_cli):
    proc = _validate(recipe_cli, tmp_path, "grpo", "actor_rollout_ref.actor.optim.lr=5e7")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("warning: actor_rollout_ref.actor.optim.lr: 5e+07 is orders of magnitude above a fine-tuning learning "
            "rate (1e-09 to 0.1; verl's default 1e-06): did you mean 5e-07?") in proc.stderr.splitlines()


# ---- verl's valid values still pass; the pieces, on plain configs ----------------------------------------------------


@pytest.mark.slow
def test_verls_valid_values_are_accepted(tmp_path, recipe_main):
    """Another engine, manager and device verl 0.9.1 has, a jsonl file on a cluster path, LoRA on real modules, a
    resume folder and a learning rate in range: all pass, with their notes."""
    proc = recipe_main("grpo", "reward.reward_manager.name=dapo", "trainer.device=cpu",
                       "data.train_files=/cluster/data/train.jsonl", "actor_rollout_ref.model.lora_rank=8",
                       "actor_rollout_ref.model.target_modules=[q_proj,v_proj]", "trainer.resume_mode=resume_path",
                       "trainer.resume_from_path=/cluster/ckpt/global_step_20", "actor_rollout_ref.actor.optim.lr=3e-6",
                       "reward.custom_reward_function.path=/cluster/reward.py", "action=validate", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("note: reward.custom_reward_function.path: /cluster/reward.py is not a file on this machine; the reward "
            "function 'compute_score' is not checked") in proc.stderr.splitlines()
    assert "warning: actor_rollout_ref.actor.optim.lr" not in proc.stderr


def _container(**sections) -> dict:
    return {"strategy": {"name": "fsdp2"}, "action": "validate", **sections}


@pytest.mark.slow
def test_data_formats_are_verls(tmp_path):
    """verl 0.9.1's RLHFDataset raises on any other ending (its own code, run here)."""
    from verl.utils.dataset.rl_dataset import RLHFDataset

    fake = types.SimpleNamespace(data_files=[str(tmp_path / "train.csv")])
    with pytest.raises(ValueError, match="Unsupported file format"):
        RLHFDataset._read_files_and_tokenize(fake)
    assert lookups.DATA_FORMATS == (".parquet", ".json", ".jsonl")
    ok = _container(data={"train_files": ["s3://bucket/a.parquet", "hdfs://x/b.jsonl"], "val_files": "c.json"})
    assert lookups.data_file_problems(ok) == []
    custom = _container(data={"train_files": "a.csv", "custom_cls": {"path": "my.py", "name": "D"}})
    assert lookups.data_file_problems(custom) == []  # a custom dataset class reads what it likes


def test_a_file_that_is_not_parquet_is_refused(tmp_path):
    bad = tmp_path / "train.parquet"
    bad.write_text("not parquet\n")
    (line,) = lookups.data_file_problems(_container(data={"train_files": str(bad)}))
    assert line.startswith(f"data.train_files: {bad} is not a parquet file pyarrow can read (")


def test_resume_path_must_name_a_global_step_folder():
    container = _container(trainer={"resume_mode": "resume_path", "resume_from_path": "/ckpt/run1"})
    assert lookups.resume_problems(container) == [
        "trainer.resume_from_path: /ckpt/run1 is not a global_step_<n> folder: verl 0.9.1 reads the step to resume "
        "from that name (trainer.resume_mode=resume_path)"]
    assert lookups.resume_problems(_container(trainer={"resume_mode": "auto", "resume_from_path": None})) == []


def test_the_legacy_reward_keys_are_the_ones_verl_loads(tmp_path):
    """verl's reward loop moves a set top-level custom_reward_function over reward.custom_reward_function."""
    reward = tmp_path / "r.py"
    reward.write_text("def score(x):\n    return 0\n")
    container = _container(custom_reward_function={"path": str(reward), "name": "scor"},
                           reward={"custom_reward_function": {"path": str(reward), "name": "score"},
                                   "reward_manager": {"source": "register", "name": "naive"}})
    problems, notes = lookups.reward_problems(container)
    assert problems == [f"custom_reward_function.name: {reward} defines no 'scor' (did you mean score?) (verl 0.9.1 "
                        "loads the reward function with getattr(module, 'scor'); its top-level names: score)"]
    assert notes == []


def test_a_reward_module_whose_names_cannot_be_read_statically_is_accepted(tmp_path):
    reward = tmp_path / "r.py"
    reward.write_text("from helpers import *\n")
    container = _container(reward={"custom_reward_function": {"path": str(reward), "name": "anything"}})
    assert lookups.reward_problems(container) == ([], [])


def test_some_lora_targets_missing_is_a_warning_as_peft_runs_the_others():
    container = _container(actor_rollout_ref={"model": {"path": "Qwen/Qwen2.5-7B-Instruct", "lora_rank": 16,
                                                        "target_modules": ["q_proj", "vproj"]}})
    problems, warnings = lookups.lora_problems(container, None)
    assert problems == []
    assert warnings == [
        "actor_rollout_ref.model.target_modules: vproj names no module of qwen2_5_7b (vproj: did you mean v_proj?): "
        "peft adapts the others only (its Linear modules: down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, "
        "up_proj, v_proj)"]


def test_ulysses_kv_heads_rule():
    from hybrid_engine.model_spec import load_arch

    tiny = load_arch("tiny")
    assert (tiny.num_attention_heads, tiny.num_key_value_heads) == (TINY_HEADS, TINY_KV_HEADS)
    assert lookups.ulysses_problems(_container(), tiny, 2) == []
    assert lookups.ulysses_problems(_container(), tiny, 4) == []  # 4 % 2 kv heads: each kv head repeated
    assert lookups.ulysses_problems({"strategy": {"name": "megatron"}}, tiny, 3) == []  # Megatron's cp: not Ulysses


@pytest.mark.parametrize("lr,expected", [
    (5e7, ["actor_rollout_ref.actor.optim.lr: 5e+07 is orders of magnitude above a fine-tuning learning rate "
           "(1e-09 to 0.1; verl's default 1e-06): did you mean 5e-07?"]),
    (3e-12, ["actor_rollout_ref.actor.optim.lr: 3e-12 is orders of magnitude below a fine-tuning learning rate "
             "(1e-09 to 0.1; verl's default 1e-06)"]),
    (1e-6, []), (0.05, []), (0, []),
])
def test_learning_rate_band(lr, expected):
    container = _container(actor_rollout_ref={"actor": {"optim": {"lr": lr}}}, critic={"optim": {"lr": 1e3}})
    assert lookups.lookup_warnings(container, use_critic=False) == expected


@pytest.mark.slow
def test_an_empty_parquet_file_under_action_plan_is_one_line_not_pyarrows_traceback(tmp_path, recipe_main):
    empty = tmp_path / "train.parquet"
    empty.write_bytes(b"")
    work = tmp_path / "work"
    work.mkdir()
    proc = recipe_main("grpo", f"data.train_files={empty}", "action=plan", cwd=work)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert (f"  - data.train_files: {empty} is empty (0 bytes): verl 0.9.1's dataset would have no rows"
            in (proc.stdout + proc.stderr).splitlines())


def test_a_reward_file_not_here_is_a_note():
    node = {"custom_reward_function": {"path": "/cluster/r.py", "name": "score"}}
    assert lookups.reward_problems(_container(reward=node)) == (
        [], ["reward.custom_reward_function.path: /cluster/r.py is not a file on this machine; the reward function "
             "'score' is not checked"])


def test_a_typed_gpu_rollout_on_a_laptop_plans_for_the_gpu_cluster(tmp_path, monkeypatch, capsys):
    """rollout=vllm typed on a machine without GPUs (a pasted verl script names it too): no embedded CPU default, so no
    cluster=cpu to refuse it against; the run is planned for the recipe's GPU cluster, and a notice says so."""
    from recipes import launch

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(launch, "has_accelerator", lambda: False)
    launch.run_recipe("grpo", ["actor_rollout_ref.rollout.name=vllm", "action=validate"])
    out, err = capsys.readouterr()
    assert "no GPU found: rollout=vllm plans for the recipe's GPU cluster" in err
    assert out.startswith("config OK: fsdp2 train dp8") and "-> vllm infer" in out
