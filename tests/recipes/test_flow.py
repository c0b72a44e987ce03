"""One pass from compose to run: validation is pure, verl's validator runs once, and the saved config is exactly the
config verl's trainer receives."""

from __future__ import annotations

import copy

import pytest
import verl.utils.config as verl_config
from omegaconf import OmegaConf

from recipes.check.validate import check
from recipes.compose.compose import compose_recipe
from recipes.compose.defaults import embedded_defaults
from recipes.launch import run_recipe
from recipes.verl_ext import api

CPU = embedded_defaults([], accelerator=False)


@pytest.fixture
def count_verl_validations(monkeypatch):
    """verl's own validate_config, counted (the real function still runs)."""
    calls = []
    real = verl_config.validate_config

    def counting(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(verl_config, "validate_config", counting)
    return calls


def test_check_does_not_write_into_its_input():
    cfg = compose_recipe("grpo", ["parallel=tp1", "actor_rollout_ref.rollout.tensor_model_parallel_size=4"])
    before = OmegaConf.to_yaml(cfg)
    run = check(cfg, run_verl=False)
    assert OmegaConf.to_yaml(cfg) == before
    assert [a.note for a in run.adopted] == [
        "actor_rollout_ref.rollout.tensor_model_parallel_size=4 sets layout.infer.tp (was 1)"]
    assert run.cfg.layout.infer.tp == 4 and run.cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == 4
    assert run.infer.tp == 4
    with pytest.raises(Exception, match="read-only"):
        run.cfg.layout.infer.tp = 2


def test_validate_action_runs_verl_validator_once(tmp_path, monkeypatch, count_verl_validations, capsys):
    monkeypatch.chdir(tmp_path)
    run_recipe("grpo", ["action=validate", *CPU])
    assert "config OK" in capsys.readouterr().out
    assert len(count_verl_validations) == 1


def test_saved_config_is_what_verl_receives(tmp_path, monkeypatch, count_verl_validations, capsys):
    """action=train with verl's run_ppo stood in for: the config it gets equals resolved_config.yaml key by key."""
    received = []
    monkeypatch.setattr(api, "run_ppo", lambda cfg, task_runner_class=None: received.append(copy.deepcopy(cfg)))
    monkeypatch.chdir(tmp_path)
    run_recipe("grpo", ["trainer.total_training_steps=1", "monitor=off", *CPU])
    assert len(received) == 1 and len(count_verl_validations) == 1
    (run_dir,) = (tmp_path / "runs" / "grpo").iterdir()
    saved = OmegaConf.to_container(OmegaConf.load(run_dir / "resolved_config.yaml"))
    given = OmegaConf.to_container(received[0], resolve=True)
    assert _flatten(saved) == _flatten(given)
    # what finalize adds is in both: the file logger, the run folder's env for every worker
    env = given["ray_kwargs"]["ray_init"]["runtime_env"]["env_vars"]
    assert env["VERL_FILE_LOGGER_PATH"] == str(run_dir / "metrics.jsonl") and "file" in given["trainer"]["logger"]


def _flatten(node, prefix=""):
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): node}


def test_the_readme_port_your_verl_script_command_validates(tmp_path, recipe_cli):
    """The README's "Port your verl script" command, as printed there and in docs/porting.md, validates and says what
    it adopted."""
    import re
    import shlex
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    shown = []
    for text in ((root / "README.md").read_text().split("## Port your verl script", 1)[1],
                 (root / "docs" / "porting.md").read_text()):
        block = re.search(r"```\n(.*?)```", text, re.S).group(1)
        shown.append(shlex.split(block.replace("\\\n", " ")))
    argv = shown[0]
    assert shown[1] == argv, "docs/porting.md's command is not the README's"
    assert argv[:3] == ["python", "-m", "recipes.grpo"]
    proc = recipe_cli("grpo", *argv[3:], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("config OK: megatron train dp2 tp2 pp2")
    assert "note: model_engine=megatron (verl's engine switch) chooses strategy=megatron" in proc.stderr


def test_machine_readable_output_is_only_data_on_stdout(tmp_path, recipe_cli):
    """On a machine without GPUs (notices on stderr): ``--cfg job`` prints YAML, ``plan.format=json`` JSON, whole."""
    import json

    import yaml

    job = recipe_cli("grpo", "--cfg", "job", cwd=tmp_path)
    assert job.returncode == 0, job.stderr[-2000:]
    assert yaml.safe_load(job.stdout)["run"]["name"] == "grpo"
    assert "embedded CPU defaults" in job.stderr
    # resolved: every interpolation filled in (the run folder it would get, the token budgets), nothing created
    resolved = recipe_cli("grpo", "--cfg", "job", "--resolve", cwd=tmp_path)
    assert resolved.returncode == 0 and "Traceback" not in resolved.stderr, resolved.stderr[-2000:]
    values = yaml.safe_load(resolved.stdout)
    assert values["trainer"]["default_local_dir"].startswith("runs/grpo/") and "${" not in resolved.stdout
    assert isinstance(values["actor_rollout_ref"]["actor"]["ppo_max_token_len_per_gpu"], int)
    assert values["ray_kwargs"]["ray_init"]["runtime_env"]["env_vars"] == {}  # nccl=off: the pack's map is empty
    assert not (tmp_path / "runs").exists()
    plan = recipe_cli("grpo", "parallel=tp2", "action=plan", "plan.format=json", cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr[-2000:]
    assert json.loads(plan.stdout)["fits"] is True


def test_an_override_before_a_hydra_flag_keeps_the_embedded_defaults_beside_it(tmp_path, recipe_cli):
    """``strategy=fsdp --cfg job``: the embedded CPU defaults go in beside the typed overrides (after ``job`` Hydra's
    parser refused them: "unrecognized arguments")."""
    from recipes.compose.overrides import with_overrides

    assert with_overrides(["strategy=fsdp", "--cfg", "job"], ["model=tiny"]) == [
        "model=tiny", "strategy=fsdp", "--cfg", "job"]
    assert with_overrides(["--cfg", "job", "strategy=fsdp"], ["model=tiny"]) == [
        "--cfg", "job", "model=tiny", "strategy=fsdp"]
    assert with_overrides(["-m", "--cfg", "job"], ["model=tiny"]) == ["-m", "--cfg", "job", "model=tiny"]
    import yaml

    job = recipe_cli("grpo", "strategy=fsdp", "--cfg", "job", cwd=tmp_path)  # as a user types it
    assert job.returncode == 0, job.stderr[-2000:]
    cfg = yaml.safe_load(job.stdout)
    assert cfg["strategy"]["name"] == "fsdp" and cfg["model"]["name"] == "tiny"
