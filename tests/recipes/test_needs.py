"""What a training run needs from this machine (recipes/check/needs.py), as a user meets it through the CLI: a GPU
layout on a machine without GPUs or a cluster to join, and an engine whose package is missing, stop ``action=train``
with one line each before Ray starts, leaving no folder; ``action=validate`` notes a missing package and passes;
``strategy=megatron`` (typed, or a copy's default) plans for GPUs instead of mixing into the FSDP2 CPU default."""

from __future__ import annotations

import os
import sys

import pytest
from omegaconf import OmegaConf

from recipes.check.needs import gpu_shortfall, importable, missing_packages
from tests.conftest import checkout_env

needs_cpu_only = pytest.mark.skipif(importable("vllm") or importable("megatron.core"),
                                    reason="vllm or megatron-core is installed here")


@needs_cpu_only
def test_gpu_layout_and_missing_vllm_stop_train_at_once(tmp_path, recipe_cli, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    proc = recipe_cli("grpo", "parallel=tp1", "model=tiny", "task=tiny", cwd=tmp_path, timeout=120,
                      env={"RAY_TMPDIR": str(tmp_path / "no_ray")})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "2 config errors:" in proc.stderr and "Traceback" not in proc.stderr
    assert ("actor_rollout_ref.rollout.name=vllm: training needs vLLM (vllm==0.24.0, as verl 0.9.1 pins it); not "
            "importable here (vllm): pip install 'klppo-recipes[vllm]'") in proc.stderr
    assert ("trainer.n_gpus_per_node: this run needs trainer.nnodes(1) * trainer.n_gpus_per_node(8) = 8 GPUs; this "
            "machine has 0") in proc.stderr
    assert "training:" not in proc.stdout
    assert [p.name for p in tmp_path.iterdir()] == []  # no run folder, Ray not started


@needs_cpu_only
def test_megatron_validates_on_a_cpu_machine_as_a_gpu_plan_with_a_note(tmp_path, recipe_main):
    proc = recipe_main("kl_ppo", "strategy=megatron", "parallel=tp1", "model=qwen2_5_0_5b", "action=validate",
                      cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("config OK: megatron train dp8 tp1")
    # one line for what a laptop always lacks (issue 49, 7): the engines and the data files
    (note,) = [line for line in proc.stderr.splitlines() if line.startswith("note: not on this machine")]
    assert note == ("note: not on this machine, which training here would need (validate and plan do not): "
                    "vLLM (vllm==0.24.0, as verl 0.9.1 pins it), megatron-core and mbridge: pip install "
                    "'klppo-recipes[vllm,megatron]' (in a checkout: pip install -e '.[vllm,megatron]'); data files "
                    "~/data/gsm8k/train.parquet (data.train_files), ~/data/gsm8k/test.parquet (data.val_files)")
    assert "is not a file on this machine" not in proc.stderr and "training needs" not in proc.stderr


def _packages(root, *names):
    """Empty importable packages (``megatron.core``): find_spec sees them; validation imports none of them."""
    for name in names:
        folder = root.joinpath(*name.split("."))
        folder.mkdir(parents=True, exist_ok=True)
        for parent in [folder, *folder.relative_to(root).parents][:-1]:
            (root / parent / "__init__.py").touch()
    return os.pathsep.join([str(root), checkout_env()["PYTHONPATH"]])


@pytest.mark.skipif(importable("transformer_engine"), reason="TransformerEngine is installed here")
def test_megatron_without_transformer_engine_is_noted_once_after_validation(tmp_path, recipe_cli):
    site = _packages(tmp_path / "site", "megatron.core", "mbridge")
    proc = recipe_cli("kl_ppo", "strategy=megatron", "parallel=tp1", "model=qwen2_5_0_5b", "action=validate",
                      cwd=tmp_path, timeout=120, env={"PYTHONPATH": site})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("config OK: megatron train dp8 tp1")
    assert proc.stderr.count("note: TransformerEngine not installed: strategy=megatron runs with Megatron's local "
                             "layer spec (mbridge, padded batches, unfused softmax)") == 1
    assert "strategy.name=megatron: training needs" not in proc.stderr  # both packages are importable
    # a refused run says its error only (tests/recipes/test_fit.py: the first line is the config error)
    refused = recipe_cli("kl_ppo", "strategy=megatron", "parallel=tp1", "model=qwen2_5_0_5b", "action=validate",
                         "data.train_batch_size=7", cwd=tmp_path, timeout=120, env={"PYTHONPATH": site})
    assert refused.returncode == 2 and refused.stderr.startswith("config error"), refused.stderr[-2000:]
    assert "TransformerEngine" not in refused.stderr


@needs_cpu_only
def test_a_copy_made_with_strategy_megatron_validates_on_a_cpu_machine(tmp_path, recipe_cli):
    import subprocess

    team = tmp_path / "team"
    made = subprocess.run([sys.executable, "-m", "recipes.copy", "grpo", str(team), "parallel=tp8",
                           "strategy=megatron"], capture_output=True, text=True, env=checkout_env(), timeout=120)
    assert made.returncode == 0, made.stderr
    proc = recipe_cli(team / "grpo.py", "action=validate", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "McoreActorConfig" not in proc.stderr
    assert proc.stdout.startswith("config OK: megatron train dp1 tp8 pp1")
    assert "no GPU found: strategy=megatron plans for the recipe's GPU cluster" in proc.stderr


def test_a_cpu_run_or_a_cluster_to_join_needs_no_local_gpus(monkeypatch, tmp_path):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    cfg = OmegaConf.create({"trainer": {"device": "cuda", "nnodes": 2, "n_gpus_per_node": 4}})
    line = gpu_shortfall(cfg, gpus_here=4)
    assert line and "trainer.nnodes(2) * trainer.n_gpus_per_node(4) = 8 GPUs; this machine has 4" in line
    assert "embedded CPU default" not in line  # a GPU machine: the CPU default is not the way out
    assert gpu_shortfall(OmegaConf.merge(cfg, {"ray_kwargs": {"ray_init": {"address": "head:6379"}}}), 0) is None
    assert gpu_shortfall(OmegaConf.create({"trainer": {"device": "cpu"}}), 0) is None
    one_node = OmegaConf.create({"trainer": {"device": "cuda", "nnodes": 1, "n_gpus_per_node": 1}})
    assert gpu_shortfall(one_node, 1) is None
    monkeypatch.setenv("RAY_ADDRESS", "auto")
    assert gpu_shortfall(cfg, 0) is None


def test_missing_packages_names_only_the_engines_the_config_uses(monkeypatch):
    import recipes.check.needs as needs

    monkeypatch.setattr(needs, "importable", lambda module: module != "sglang")
    cfg = OmegaConf.create({"actor_rollout_ref": {"rollout": {"name": "sglang"}}, "strategy": {"name": "megatron"}})
    assert missing_packages(cfg) == [
        "actor_rollout_ref.rollout.name=sglang: training needs SGLang (sglang==0.5.13.post1, the extra's pin; verl "
        "0.9.1 drives sglang>=0.5.13,<0.5.15); not importable here (sglang): pip install 'klppo-recipes[sglang]' (in a "
        "checkout: pip install -e '.[sglang]')"]
    assert importable("os.path") and not importable("no_such_package_here.sub")


def test_missing_data_and_an_unmakeable_checkpoint_folder_stop_train_before_ray(tmp_path, recipe_main):
    """verl would read the data at the trainer's start (a minute in, after Ray) and write the folder at the first
    save (save_freq steps in); here both stop the run at once, one line each, nothing left behind."""
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    work = tmp_path / "work"
    work.mkdir()
    args = (f"data.val_files={tmp_path}/nope/val.parquet", f"trainer.default_local_dir={blocker}/ckpt")
    proc = recipe_main("grpo", *args, cwd=work, env={"RAY_TMPDIR": str(tmp_path / "no_ray")})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "2 config errors:" in proc.stderr and "Traceback" not in proc.stderr
    assert (f"data.val_files: {tmp_path}/nope/val.parquet is not a file on this machine (verl's RLHFDataset reads "
            "it when the trainer starts)") in proc.stderr
    assert (f"trainer.default_local_dir: {blocker}/ckpt cannot be made: {blocker} is a file") in proc.stderr
    assert list(work.iterdir()) == [] and not (tmp_path / "no_ray").exists()


def test_a_model_folder_or_reward_file_not_here_stops_train_before_ray(tmp_path, recipe_cli):
    """A typo in the model path or the reward file: verl would fail a minute in, after Ray; action=train stops at
    once, one line each naming the key (KL-PPO's critic loads the actor's folder: one line), nothing left behind."""
    work = tmp_path / "work"
    work.mkdir()
    args = (f"actor_rollout_ref.model.path={tmp_path}/models/qwen-typo",
            f"reward.custom_reward_function.path={tmp_path}/rewards/gsm8k.py")
    proc = recipe_cli("kl_ppo", *args, cwd=work, timeout=120, env={"RAY_TMPDIR": str(tmp_path / "no_ray")})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "2 config errors:" in proc.stderr and "Traceback" not in proc.stderr
    assert (f"actor_rollout_ref.model.path: {tmp_path}/models/qwen-typo is not a folder on this machine (verl loads "
            "the model's config, tokenizer and weights from it when its workers start)") in proc.stderr
    assert (f"reward.custom_reward_function.path: {tmp_path}/rewards/gsm8k.py is not a file on this machine (verl "
            "imports the reward function from it when the trainer starts)") in proc.stderr
    assert list(work.iterdir()) == [] and not (tmp_path / "no_ray").exists()


def test_hub_ids_urls_and_an_unused_critic_are_not_model_folders_to_check(tmp_path):
    from recipes.check.needs import missing_models, missing_reward_file

    folder = tmp_path / "model"
    folder.mkdir()

    def cfg(actor, critic, estimator="gae", enable=None):
        return OmegaConf.create({"actor_rollout_ref": {"model": {"path": actor}}, "algorithm": {
            "adv_estimator": estimator}, "critic": {"enable": enable, "model": {"path": critic}}})

    assert missing_models(cfg("Qwen/Qwen2.5-7B", "hdfs://nn/critic")) == []
    assert missing_models(cfg(str(folder), str(folder))) == []
    # GAE without critic.enable: verl trains a critic, so its folder counts; GRPO's critic does not
    assert [line.split(":")[0] for line in missing_models(cfg(str(folder), "~/no/critic"))] == ["critic.model.path"]
    assert missing_models(cfg(str(folder), "~/no/critic", estimator="grpo")) == []
    assert missing_models(cfg(str(folder), "~/no/critic", enable=False)) == []
    # a path with a second slash is a path, not a hub id
    assert [line.split(":")[0] for line in missing_models(cfg("org/name/sub", str(folder)))] == [
        "actor_rollout_ref.model.path"]
    reward = tmp_path / "reward.py"
    reward.write_text("def compute_score(*a): return 0.0\n")
    for path, flagged in ((f"file://{reward}", False), (str(reward), False), ("pkg://my_rewards.gsm8k", False),
                          (f"file://{tmp_path}/none.py", True)):
        line = missing_reward_file(OmegaConf.create({"reward": {"custom_reward_function": {"path": path}}}))
        assert (line is not None) == flagged, path


def test_validate_notes_what_training_here_would_stop_on(tmp_path, capsys, monkeypatch):
    """validate checks a run for a cluster from any machine: the same findings are notes, and it passes."""
    from recipes.launch import run_recipe

    monkeypatch.chdir(tmp_path)
    run_recipe("grpo", [f"data.train_files={tmp_path}/train.parquet", "action=validate"])
    out, err = capsys.readouterr()
    assert out.startswith("config OK: ")
    assert (f"note: not on this machine, which training here would need (validate and plan do not): data files "
            f"{tmp_path}/train.parquet (data.train_files)") in err


def test_remote_data_is_the_clusters(tmp_path):
    from recipes.check.needs import missing_data

    cfg = OmegaConf.create({"data": {"train_files": ["hdfs://nn/train.parquet", str(tmp_path / "x.parquet")],
                                     "val_files": "s3://bucket/val.parquet"}})
    assert missing_data(cfg) == [f"data.train_files: {tmp_path}/x.parquet is not a file on this machine (verl's "
                                 "RLHFDataset reads it when the trainer starts); make it with the task's "
                                 "preprocessing script, or name another"]


def _sglang_at(root, version: str) -> str:
    """An importable ``sglang`` package with an installed distribution's metadata at ``version``: what the check reads
    (find_spec and importlib.metadata), nothing it would import. Returns PYTHONPATH with it first."""
    (root / "sglang").mkdir(parents=True)
    (root / "sglang" / "__init__.py").write_text(f'__version__ = "{version}"\n')
    info = root / f"sglang-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
    return os.pathsep.join([str(root), checkout_env()["PYTHONPATH"]])


SGLANG_INSTALL = "pip install 'klppo-recipes[sglang]' (in a checkout: pip install -e '.[sglang]')"


@pytest.mark.skipif(importable("sglang"), reason="SGLang is installed here")
def test_rollout_sglang_without_sglang_stops_train_and_is_a_note_at_validate(tmp_path, recipe_cli, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    line = ("actor_rollout_ref.rollout.name=sglang: training needs SGLang (sglang==0.5.13.post1, the extra's pin; "
            f"verl 0.9.1 drives sglang>=0.5.13,<0.5.15); not importable here (sglang): {SGLANG_INSTALL}")
    work = tmp_path / "work"
    work.mkdir()
    train = recipe_cli("grpo", "rollout=sglang", "parallel=tp1", "model=tiny", "task=tiny", cwd=work, timeout=120,
                       env={"RAY_TMPDIR": str(tmp_path / "no_ray")})
    assert train.returncode == 2, train.stderr[-2000:]
    assert f"  - {line}\n" in train.stderr and "Traceback" not in train.stderr
    assert list(work.iterdir()) == [] and not (tmp_path / "no_ray").exists()  # no run folder, Ray not started
    checked = recipe_cli("grpo", "rollout=sglang", "parallel=tp1", "model=tiny", "task=tiny", "action=validate",
                         cwd=work, timeout=120)
    assert checked.returncode == 0, checked.stderr[-2000:]
    assert checked.stdout.startswith("config OK: fsdp2 train dp8 tp1")
    assert ("note: not on this machine, which training here would need (validate and plan do not): SGLang "
            "(sglang==0.5.13.post1, the extra's pin; verl 0.9.1 drives sglang>=0.5.13,<0.5.15): pip install "
            "'klppo-recipes[sglang]' (in a checkout: pip install -e '.[sglang]')") in checked.stderr


def test_sglang_at_a_release_verl_cannot_drive_stops_train_with_the_release_found(tmp_path, recipe_cli, monkeypatch):
    """sglang 0.5.12 (verl 0.9.1's own pin, whose transformers==5.6.0 verl excludes) is refused before Ray: one line
    with the package, the release found and the install command; validate passes with it as a note."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    site = _sglang_at(tmp_path / "site", "0.5.12")
    line = ("actor_rollout_ref.rollout.name=sglang: sglang 0.5.12 is installed here; verl 0.9.1 drives "
            "sglang>=0.5.13,<0.5.15 (0.5.12 pins transformers==5.6.0; verl 0.9.1 takes "
            f"transformers>=5.5.3,<5.11,!=5.6.0): {SGLANG_INSTALL}")
    work = tmp_path / "work"
    work.mkdir()
    train = recipe_cli("grpo", "rollout=sglang", "parallel=tp1", "model=tiny", "task=tiny", cwd=work, timeout=120,
                       env={"PYTHONPATH": site, "RAY_TMPDIR": str(tmp_path / "no_ray")})
    assert train.returncode == 2, train.stderr[-2000:]
    assert f"  - {line}\n" in train.stderr and "Traceback" not in train.stderr
    assert "training:" not in train.stdout
    assert list(work.iterdir()) == [] and not (tmp_path / "no_ray").exists()
    checked = recipe_cli("grpo", "rollout=sglang", "parallel=tp1", "model=tiny", "task=tiny", "action=validate",
                         cwd=work, timeout=120, env={"PYTHONPATH": site})
    assert checked.returncode == 0, checked.stderr[-2000:]
    assert f"note: {line}\n" in checked.stderr


def test_sglang_at_the_extras_release_passes_the_check(tmp_path, recipe_cli):
    site = _sglang_at(tmp_path / "site", "0.5.13.post1")
    checked = recipe_cli("grpo", "rollout=sglang", "parallel=tp1", "model=tiny", "task=tiny", "action=validate",
                         cwd=tmp_path, timeout=120, env={"PYTHONPATH": site})
    assert checked.returncode == 0, checked.stderr[-2000:]
    assert checked.stdout.startswith("config OK: fsdp2 train dp8 tp1")
    assert "actor_rollout_ref.rollout.name=sglang" not in checked.stderr  # neither missing nor a wrong release
