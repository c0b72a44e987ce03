"""Through the CLI, as a user types it (a real child process per action and recipe, the rest in-process): the model
that runs is the model checked (hub id, local folder, malformed or unknown), verl's own layout keys mean a GPU run on
a CPU machine, and generation TP above training TP (verl's Megatron diff-TP example) validates and plans with verl's
own sync path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, ListConfig, OmegaConf

from hybrid_engine.model_spec import MODEL_CONFIG_DIR
from recipes.launch import run_recipe

# verl examples/grpo_trainer/run_qwen2-7b_seq_balance.sh after the shell expands it (as in test_verl_examples.py)
HOME = str(Path.home())
SEQ_BALANCE = [
    "algorithm.adv_estimator=grpo", f"data.train_files={HOME}/data/gsm8k/train.parquet",
    f"data.val_files={HOME}/data/gsm8k/test.parquet", "data.return_raw_chat=True", "data.train_batch_size=1024",
    "data.max_prompt_length=512", "data.max_response_length=1024", "data.filter_overlong_prompts=True",
    "data.truncation=error", "actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct",
    "actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=256", "actor_rollout_ref.actor.use_dynamic_bsz=True",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24000", "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.001", "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0", "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "actor_rollout_ref.rollout.name=sglang",
    "actor_rollout_ref.rollout.mode=async", "actor_rollout_ref.rollout.multi_turn.format=hermes",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6", "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True", "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0", "trainer.logger=[console,wandb]", "trainer.project_name=verl_grpo_example_gsm8k",
    "trainer.experiment_name=qwen2_7b_function_rm_kl1e-3", "trainer.val_before_train=False",
    "trainer.n_gpus_per_node=8", "trainer.nnodes=1", "trainer.save_freq=20", "trainer.test_freq=5",
    "trainer.total_epochs=15",
]

# verl examples/grpo_trainer/run_qwen2_5-7b_math_megatron_diff_tp.sh (verl's ppo_megatron_trainer config is the
# pack's strategy=megatron): train tp2 pp2, generate with tp4, 8 GPUs; data paths left at the task's
DIFF_TP = [
    "strategy=megatron", "algorithm.adv_estimator=grpo", "data.train_batch_size=1024",
    "data.max_prompt_length=1024", "data.max_response_length=1024", "data.filter_overlong_prompts=True",
    "data.truncation=error", "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct",
    "actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.actor.ppo_mini_batch_size=256",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2", "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.001", "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0", "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=4", "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6", "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=2",
    "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=2", "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0", "trainer.n_gpus_per_node=8", "trainer.nnodes=1",
]

EMBEDDED_NOTICE = "no GPU found: embedded CPU defaults"
# the pack appends verl's own `file` logger to trainer.logger (metrics.jsonl in the run folder, README)
PACK_LOGGER = "file"


def _plain(value):
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value


def _not_as_typed(overrides: list[str], resolved) -> list[str]:
    """The overrides (parsed as Hydra parses them) whose key does not hold the typed value in ``resolved``."""
    out = []
    for override in OverridesParser.create().parse_overrides(overrides):
        if "." not in override.key_or_group:
            continue  # a group choice (strategy=megatron), not a value
        typed, saved = override.value(), _plain(OmegaConf.select(resolved, override.key_or_group))
        if override.key_or_group == "trainer.logger" and isinstance(saved, list):
            saved = [x for x in saved if x != PACK_LOGGER]
        same = typed == saved and (type(typed) is type(saved) or not {type(typed), type(saved)} & {bool, str})
        if not same:
            out.append(f"{override.input_line}: saved {saved!r}")
    return out


def _validate(recipe_main, tmp_path, *args, recipe="grpo"):
    proc = recipe_main(recipe, *args, "action=validate", cwd=tmp_path, timeout=300)
    written = sorted((tmp_path / "runs" / recipe).glob("*/resolved_config.yaml"))
    return proc, (OmegaConf.load(written[-1]) if written else None)


ASSUMED = "(assumed; cluster=a100_80g|h200_141g|h800_80g for another)"  # a GPU type the command line did not choose


def _config_ok(proc) -> str:
    out = proc if isinstance(proc, str) else proc.stdout
    (line,) = [line for line in out.splitlines() if line.startswith("config OK: ")]
    return line


def test_verl_seq_balance_example_checks_qwen2_7b_and_lands(tmp_path, recipe_cli):
    # a real child process: grpo's action=validate as a user types it (the other checks here run it in-process)
    proc, resolved = _validate(recipe_cli, tmp_path, *SEQ_BALANCE)
    assert proc.returncode == 0, proc.stderr
    assert EMBEDDED_NOTICE not in proc.stderr
    assert _config_ok(proc) == (
        "config OK: fsdp2 train dp8 tp1 pp1 cp1 ep1 -> sglang infer tp2 pp1 x4 replicas on 1x8 h100_80g "
        f"{ASSUMED}, model qwen2_7b (hub id Qwen/Qwen2-7B-Instruct, shipped config)"
    )
    assert _not_as_typed(SEQ_BALANCE, resolved) == []


@pytest.mark.parametrize("chosen", ["cluster=h200_141g", "cluster.gpu.name=h200_141g"])
def test_a_chosen_gpu_type_is_named_without_the_hint(chosen, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    run_recipe("grpo", ["trainer.n_gpus_per_node=8", chosen, "action=validate"])
    assert " replicas on 1x8 h200_141g, model " in _config_ok(capsys.readouterr().out)


def test_verl_layout_keys_alone_mean_a_gpu_run(tmp_path, recipe_main):
    proc, resolved = _validate(recipe_main, tmp_path, "trainer.n_gpus_per_node=8", "trainer.nnodes=1")
    assert proc.returncode == 0, proc.stderr
    assert EMBEDDED_NOTICE not in proc.stderr
    line = _config_ok(proc)
    assert f"on 1x8 h100_80g {ASSUMED}," in line
    assert "model llama3_1_8b (hub id meta-llama/Llama-3.1-8B-Instruct" in line
    assert (resolved.trainer.n_gpus_per_node, resolved.trainer.nnodes, resolved.cluster.gpu.name) == (8, 1, "h100_80g")


def test_n_gpus_per_node_alone_adds_no_embedded_default(tmp_path, recipe_main):
    proc, resolved = _validate(recipe_main, tmp_path, "trainer.n_gpus_per_node=8")
    assert proc.returncode == 0, proc.stderr
    assert EMBEDDED_NOTICE not in proc.stderr and "tiny" not in _config_ok(proc)
    assert resolved.model.name == "llama3_1_8b" and resolved.trainer.n_gpus_per_node == 8


def test_no_layout_keys_still_give_the_cpu_demo(tmp_path, recipe_main):
    proc, _ = _validate(recipe_main, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "embedded CPU defaults parallel=cpu cluster=cpu rollout=hf model=tiny task=tiny" in proc.stderr
    assert ", model tiny (local folder " in _config_ok(proc)


def _model_folder(folder: Path, **change) -> Path:
    folder.mkdir()
    config = json.loads((MODEL_CONFIG_DIR / "qwen2_7b" / "config.json").read_text())
    config.update(change)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def test_a_local_model_folder_is_checked_from_its_config_json(tmp_path, recipe_main):
    folder = _model_folder(tmp_path / "my-model", num_hidden_layers=30)
    proc, resolved = _validate(recipe_main, tmp_path, f"actor_rollout_ref.model.path={folder}",
                               "trainer.n_gpus_per_node=8")
    assert proc.returncode == 0, proc.stderr
    assert _config_ok(proc).endswith(f", model my-model (local folder {folder})")
    assert resolved.actor_rollout_ref.model.path == str(folder)
    # its numbers are the ones checked (not the default model.name llama3_1_8b's 32 heads): 28 heads over tp 8
    proc, _ = _validate(recipe_main, tmp_path, f"actor_rollout_ref.model.path={folder}", "trainer.n_gpus_per_node=8",
                        "actor_rollout_ref.rollout.tensor_model_parallel_size=8")
    assert proc.returncode == 2
    assert "config error: layout.infer.tp: my-model has 28 attention heads, not divisible by tp(8): 28 % 8 = 4" in (
        proc.stderr)


def test_a_malformed_config_json_is_one_line_naming_the_file_and_the_field(tmp_path, recipe_main):
    folder = _model_folder(tmp_path / "broken", num_attention_heads="lots")
    proc = recipe_main("grpo", f"actor_rollout_ref.model.path={folder}", "trainer.n_gpus_per_node=8",
                      "action=validate", cwd=tmp_path, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"config error: actor_rollout_ref.model.path: {folder / 'config.json'}: num_attention_heads: must be a "
        "positive integer, got 'lots'"
    )
    assert "Traceback" not in proc.stdout + proc.stderr and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("recipe", ["grpo", "kl_ppo"])  # kl_ppo: verl converts the critic's model config too
def test_an_unknown_hub_id_warns_and_validates(tmp_path, recipe_main, recipe):
    proc, resolved = _validate(recipe_main, tmp_path, "actor_rollout_ref.model.path=acme/unknown-7b",
                               "trainer.n_gpus_per_node=8", recipe=recipe)
    assert proc.returncode == 0, proc.stderr
    assert ("warning: actor_rollout_ref.model.path: acme/unknown-7b is a hub id the pack does not ship, so its "
            "config.json cannot be read offline: the shape checks and the plan need model=<name>") in proc.stderr
    assert _config_ok(proc).endswith(", model not checked (acme/unknown-7b: no config.json here)")
    assert resolved.actor_rollout_ref.model.path == "acme/unknown-7b"


def test_an_explicit_model_of_another_hub_id_says_which_is_checked(tmp_path, recipe_main):
    proc, _ = _validate(recipe_main, tmp_path, "model=qwen2_5_32b", "actor_rollout_ref.model.path=Qwen/Qwen2-7B",
                        "trainer.n_gpus_per_node=8")
    assert proc.returncode == 0, proc.stderr
    assert ("warning: model.name: model=qwen2_5_32b is not the model that runs: actor_rollout_ref.model.path="
            "Qwen/Qwen2-7B is qwen2_7b; checking qwen2_7b (the model at the path)") in proc.stderr
    assert _config_ok(proc).endswith(", model qwen2_7b (hub id Qwen/Qwen2-7B, shipped config)")


def test_verl_diff_tp_megatron_example_validates(tmp_path, recipe_main):
    proc, resolved = _validate(recipe_main, tmp_path, *DIFF_TP)
    assert proc.returncode == 0, proc.stderr
    assert _config_ok(proc) == (
        "config OK: megatron train dp2 tp2 pp2 cp1 ep1 -> vllm infer tp4 pp1 x2 replicas on 1x8 h100_80g "
        f"{ASSUMED}, model qwen2_5_7b (hub id Qwen/Qwen2.5-7B-Instruct, shipped config)"
    )
    assert _not_as_typed(DIFF_TP, resolved) == []


def test_verl_diff_tp_megatron_example_plans_with_verls_sync_path(tmp_path, recipe_cli, recipe_main):
    proc = recipe_cli("grpo", *DIFF_TP, "action=plan", cwd=tmp_path, timeout=300)  # grpo's action=plan, a real child
    assert proc.returncode == 0, proc.stderr
    (sync,) = [line for line in proc.stdout.splitlines() if line.startswith("sync ")]
    assert sync == (
        "sync     verl's own (tp_group_gather: the whole model on every GPU: TP-group all-gather per stage + pipeline"
        " broadcast); the pack's resharder needs infer.tp | train.tp and infer.pp | train.pp: infer.tp 4 does not"
        " divide train.tp 2"
    )
    assert "tp_group_gather" in proc.stdout and "hybridflow " not in proc.stdout
    proc = recipe_main("grpo", *DIFF_TP, "action=plan", "plan.format=json", cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert data["sync_path"]["by"] == "verl" and set(data["bytes"]) == {"tp_group_gather", "full_gather"}
    assert data["groups"]["placement"] == "verl" and data["fits"] is True


def test_the_article_layout_plans_with_the_resharder(tmp_path, recipe_cli):
    # kl_ppo's action=plan, a real child process
    proc = recipe_cli("kl_ppo", "parallel=tp8pp4", "strategy=megatron", "cluster.nnodes=4", "action=plan",
                      cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert ("sync     the pack's resharder (hybridflow: micro-DP all-gather of d_g=8; infer.tp(4) divides train.tp(8)"
            " and infer.pp(1) divides train.pp(4))") in proc.stdout
