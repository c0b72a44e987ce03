"""The model that runs is the model checked: ``actor_rollout_ref.model.path`` decides the architecture (a local
folder's config.json, a hub id the pack ships, or nothing to read offline), and verl's own layout keys on the
command line mean a GPU run (no embedded CPU default)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from hybrid_engine.model_spec import MODEL_CONFIG_DIR, shipped_name_of_hub_id
from recipes.check.validate import check, load_model_arch
from recipes.compose.compose import compose_recipe
from recipes.compose.confdir import group_options
from recipes.compose.defaults import EMBEDDED_DEFAULTS, GPU_INTENT_KEYS, chooses_layout, embedded_defaults
from recipes.compose.layout_keys import LAYOUT_FED_KEYS

PATH = "actor_rollout_ref.model.path"


def _arch(overrides, *, chosen=False, recipe="grpo"):
    cfg = compose_recipe(recipe, overrides)
    problems, warnings = [], []
    return load_model_arch(cfg, problems, warnings, model_chosen=chosen), problems, warnings


def _local_model(folder: Path, **change) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = json.loads((MODEL_CONFIG_DIR / "qwen2_7b" / "config.json").read_text())
    config.update(change)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("option", [o for o in group_options("model") if o != "tiny"])
def test_every_model_option_names_a_hub_id_of_its_own_config(option):
    cfg = compose_recipe("grpo", [f"model={option}"])
    assert shipped_name_of_hub_id(OmegaConf.select(cfg, PATH)) == option == cfg.model.name


def test_a_shipped_hub_id_is_checked_not_the_default_name():
    arch, problems, warnings = _arch([f"{PATH}=Qwen/Qwen2-7B-Instruct"])  # model.name stays llama3_1_8b
    assert (arch.name, arch.source) == ("qwen2_7b", "hub id Qwen/Qwen2-7B-Instruct, shipped config")
    assert problems == [] and warnings == []


def test_an_explicit_model_of_another_architecture_is_named_in_a_warning():
    arch, problems, warnings = _arch(["model=qwen2_5_32b", f"{PATH}=meta-llama/Llama-3.1-8B-Instruct"], chosen=True)
    assert arch.name == "llama3_1_8b" and problems == []
    assert warnings == [
        "model.name: model=qwen2_5_32b is not the model that runs: actor_rollout_ref.model.path="
        "meta-llama/Llama-3.1-8B-Instruct is llama3_1_8b; checking llama3_1_8b (the model at the path)"
    ]


def test_an_unknown_hub_id_is_not_checked_with_another_models_numbers():
    arch, problems, warnings = _arch([f"{PATH}=acme/unknown-7b"])
    assert arch is None and problems == []
    (warning,) = warnings
    assert warning.startswith("actor_rollout_ref.model.path: acme/unknown-7b is a hub id the pack does not ship")
    assert "need model=<name>" in warning and "or a local folder with config.json" in warning
    # the plan cannot be made from nothing: there it is a problem
    arch, problems, warnings = _arch([f"{PATH}=acme/unknown-7b", "action=plan"])
    assert arch is None and warnings == [] and problems[0].startswith("actor_rollout_ref.model.path: acme/unknown")


def test_an_unknown_hub_id_with_an_explicit_model_checks_that_model():
    arch, problems, warnings = _arch(["model=qwen2_7b", f"{PATH}=acme/qwen2-7b-finetune"], chosen=True)
    assert arch.name == "qwen2_7b" and problems == []
    assert arch.source == "model=qwen2_7b, shipped config; acme/qwen2-7b-finetune not read"
    assert warnings == [
        "actor_rollout_ref.model.path: acme/qwen2-7b-finetune is a hub id the pack does not ship; checking "
        "model=qwen2_7b's shipped config in its place (it must be the same architecture)"
    ]


@pytest.mark.parametrize("path,model,hub", [
    ("/cluster/models/Qwen3-30B-A3B", "qwen3_30b_a3b", "Qwen/Qwen3-30B-A3B"),
    ("/nfs/llama-3.1-8b-instruct/", "llama3_1_8b", "meta-llama/Llama-3.1-8B-Instruct"),
    ("/hf/hub/models--Qwen--Qwen2.5-7B-Instruct/snapshots/0123abcd", "qwen2_5_7b", "Qwen/Qwen2.5-7B-Instruct"),
])
def test_a_cluster_folder_named_as_a_shipped_model_is_checked_as_it(path, model, hub):
    arch, problems, warnings = _arch([f"{PATH}={path}"])
    assert (arch.name, arch.source) == (model, f"folder named {hub}, shipped config; {path} not read")
    assert problems == [] and warnings == [
        f"{PATH}: {path} is not a folder on this machine; its name is {hub}'s: checking {model}'s shipped config "
        "(model=<name> or a local folder with config.json checks another)"
    ]


def test_a_folder_of_another_name_is_not_guessed():
    arch, problems, warnings = _arch([f"{PATH}=/cluster/models/my-finetune"])
    assert arch is None and problems == []
    assert warnings[0].startswith(f"{PATH}: /cluster/models/my-finetune is not a folder on this machine, so its")


def test_a_pasted_cluster_path_is_checked_through_the_cli(tmp_path, recipe_main):
    proc = recipe_main("grpo", f"{PATH}=/cluster/models/Qwen3-30B-A3B", "trainer.n_gpus_per_node=8",
                      "trainer.nnodes=8", "offload=full", "action=validate", cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines()[0].endswith(
        ", model qwen3_30b_a3b (folder named Qwen/Qwen3-30B-A3B, shipped config; /cluster/models/Qwen3-30B-A3B "
        "not read)")
    assert f"warning: {PATH}: /cluster/models/Qwen3-30B-A3B is not a folder on this machine" in proc.stderr


def test_a_local_folder_is_read(tmp_path):
    folder = _local_model(tmp_path / "my-qwen", num_hidden_layers=30)
    arch, problems, warnings = _arch([f"{PATH}={folder}"])
    assert (arch.name, arch.num_hidden_layers, arch.source) == ("my-qwen", 30, f"local folder {folder}")
    assert problems == [] and warnings == []
    # the layouts are checked against it: 30 layers over pp 4 does not split
    run = check(compose_recipe("grpo", [f"{PATH}={folder}", "strategy=megatron", "parallel=tp1",
                                        "layout.train.pp=4", "layout.infer.tp=1"]), run_verl=False)
    assert "layout.train.pp: my-qwen has 30 layers, not divisible by pp(4): 30 % 4 = 2" in run.problems


def test_a_local_folder_with_a_shipped_configs_numbers_takes_its_name(tmp_path):
    folder = _local_model(tmp_path / "snapshot")
    arch, _, _ = _arch(["model=qwen2_7b", f"{PATH}={folder}"], chosen=True)
    assert arch.name == "qwen2_7b" and arch.source == f"local folder {folder}"


def test_hf_config_path_wins_over_path(tmp_path):
    folder = _local_model(tmp_path / "cfg", num_attention_heads=14, num_key_value_heads=2)
    arch, problems, _ = _arch([f"{PATH}=Qwen/Qwen2-7B-Instruct", f"actor_rollout_ref.model.hf_config_path={folder}"])
    assert arch.num_attention_heads == 14 and problems == []


def test_a_malformed_config_is_one_problem_naming_the_file_and_the_field(tmp_path):
    folder = _local_model(tmp_path / "bad", num_key_value_heads="four")
    arch, problems, _ = _arch([f"{PATH}={folder}"])
    assert arch is None
    assert problems == [
        f"actor_rollout_ref.model.path: {folder / 'config.json'}: num_key_value_heads: must be a positive integer "
        "(or absent), got 'four'"
    ]


def test_a_folder_without_config_json(tmp_path):
    arch, problems, _ = _arch([f"{PATH}={tmp_path}"])
    assert arch is None and problems == [
        f"actor_rollout_ref.model.path: {tmp_path} has no config.json (verl reads the model's config from it)"]


# -- verl's own layout keys are a layout choice ---------------------------------------------------------------------


def test_no_layout_gives_the_embedded_default():
    assert embedded_defaults([], accelerator=False) == [f"{g}={o}" for g, o in EMBEDDED_DEFAULTS.items()]
    # the pack's own keys tune the embedded default (two gloo ranks, a server per rank)
    assert embedded_defaults(["cluster.gpus_per_node=2", "layout.infer.tp=1"], accelerator=False) != []


@pytest.mark.parametrize("key", GPU_INTENT_KEYS)
def test_every_verl_layout_key_means_a_gpu_run(key):
    assert set(GPU_INTENT_KEYS) == set(LAYOUT_FED_KEYS)
    for arg in (f"{key}=2", f"+{key}=2", f"++{key}=2"):
        assert chooses_layout([arg]) and embedded_defaults([arg], accelerator=False) == []
    assert not chooses_layout([f"~{key}"])  # deleting a key describes no layout


def test_verl_example_layout_keys_compose_a_gpu_cluster():
    argv = ["trainer.n_gpus_per_node=8", "trainer.nnodes=1"]
    cfg = compose_recipe("grpo", argv + embedded_defaults(argv, accelerator=False))
    assert cfg.cluster.gpu.name == "h100_80g" and cfg.model.name == "llama3_1_8b" and cfg.rollout.name == "vllm"


def test_model_chosen_means_another_option_than_the_recipes_default():
    # qwen2_5_32b was chosen; the default llama3_1_8b was not (outside a Hydra run nothing was typed)
    arch, _, warnings = _arch(["model=qwen2_5_32b", f"{PATH}=Qwen/Qwen2-7B"], chosen=None)
    assert arch.name == "qwen2_7b" and len(warnings) == 1 and warnings[0].startswith("model.name: model=qwen2_5_32b")
    arch, _, warnings = _arch([f"{PATH}=acme/unknown-7b"], chosen=None)
    assert arch is None and "need model=<name>" in warnings[0]
