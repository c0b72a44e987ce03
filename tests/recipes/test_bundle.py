"""The reproducibility bundle: secrets redacted (names and token-shaped values), versions, git state, rerun command."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from omegaconf import OmegaConf

from recipes.cluster.nccl_env import worker_env
from recipes.compose.compose import compose_recipe
from recipes.compose.defaults import embedded_defaults
from recipes.record.bundle import collect, write_record
from recipes.record.gitstate import git_state
from recipes.record.redact import REDACTED, is_secret_name, redact_arg, redact_config, redact_env

CPU = embedded_defaults([], accelerator=False)  # parallel=cpu cluster=cpu rollout=hf model=tiny task=tiny


SECRET_NAMES = ["WANDB_API_KEY", "HF_TOKEN", "GITHUB_TOKEN", "MY_SERVICE_TOKEN", "AWS_SECRET_ACCESS_KEY",
                "AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN", "DB_PASSWORD", "PGPASSWORD", "apiKey", "SSH_AUTH_SOCK",
                "NPM_PASS", "OPENAI_API_KEY", "RAY_AUTH_TOKEN", "hf_token"]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["PATH", "PWD", "HOME", "NCCL_IB_HCA", "CUDA_VISIBLE_DEVICES", "GIT_AUTHOR_NAME",
                                  "PYTHONHASHSEED", "WANDB_PROJECT", "HF_HOME", "TOKENIZERS_PARALLELISM",
                                  "ppo_max_token_len_per_gpu", "max_num_batched_tokens", "num_speculative_tokens",
                                  "data.prompt_key", "image_key", "pad_token_id", "eos_token"])
def test_plain_names(name):
    assert not is_secret_name(name)


def test_env_redacts_planted_secrets_and_token_shaped_values():
    env = {
        "WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567",
        "HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz012345",
        "CI_JOB_TOKEN": "glpat-abcdefghijklmnopqrst",
        "SOME_OTHER_TOKEN": "x",
        "PIP_INDEX_URL": "https://user:s3cret@pypi.example.com/simple",
        "NOTES": "see hf_ABCDEFGHIJKLMNOPQRSTUVWX123 for access",
        "NCCL_IB_HCA": "mlx5_0",
        "EMPTY_TOKEN": "",
    }
    out = redact_env(env)
    for key in ("WANDB_API_KEY", "HF_TOKEN", "CI_JOB_TOKEN", "SOME_OTHER_TOKEN"):
        assert out[key] == REDACTED
    assert out["PIP_INDEX_URL"] == f"https://user:{REDACTED}@pypi.example.com/simple"
    assert "hf_ABCDEF" not in out["NOTES"] and REDACTED in out["NOTES"]
    assert out["NCCL_IB_HCA"] == "mlx5_0"
    assert out["EMPTY_TOKEN"] == ""
    text = json.dumps(out)
    for secret in ("0123456789abcdef", "hf_abcdefghij", "s3cret", "glpat-"):
        assert secret not in text


def test_config_and_command_line_redaction():
    cfg = {"logger": {"wandb": {"api_key": "abc123", "project": "p"}},
           "trainer": {"token_budget": 4096, "wandb_key": 12345},
           "data": {"prompt_key": "prompt"}, "hub": {"url": "https://u:pw@host/x"}}
    out = redact_config(cfg)
    assert out["logger"]["wandb"] == {"api_key": REDACTED, "project": "p"}
    # a secret's value is hidden whatever its type; a budget or a data field's name is not a secret
    assert out["trainer"] == {"token_budget": 4096, "wandb_key": REDACTED}
    assert out["data"] == {"prompt_key": "prompt"}
    assert out["hub"]["url"] == f"https://u:{REDACTED}@host/x"
    assert redact_arg("+logger.wandb.api_key=abc123") == f"+logger.wandb.api_key={REDACTED}"
    assert redact_arg("kl=adaptive") == "kl=adaptive"
    assert redact_arg("data.train_batch_size=8") == "data.train_batch_size=8"


def test_git_state_clean_then_dirty(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "a.txt").write_text("1\n")
    subprocess.run([*git, "add", "a.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], check=True)
    state = git_state(repo)
    assert len(state["sha"]) == 40 and state["dirty"] is False and state["changed"] == []
    (repo / "a.txt").write_text("2\n")
    (repo / "untracked.txt").write_text("u\n")
    state = git_state(repo)
    assert state["dirty"] is True and state["changed"] == ["a.txt"]
    assert git_state(tmp_path / "nowhere") is None or git_state(tmp_path) is None


def test_write_bundle_files(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "planted-wandb-key-0123456789")
    monkeypatch.setenv("PLANTED_TOKEN", "planted-token-value")
    monkeypatch.chdir(tmp_path)
    cfg = compose_recipe("grpo", CPU + ["nccl=debug"])
    lines = write_record(tmp_path / "run", cfg, worker_env(cfg), "grpo", ["nccl=debug", "+logger.wandb.api_key=k"])
    folder = tmp_path / "run" / "repro"
    data = json.loads((folder / "bundle.json").read_text())
    assert data["env"]["WANDB_API_KEY"] == REDACTED and data["env"]["PLANTED_TOKEN"] == REDACTED
    text = "".join(p.read_text() for p in (tmp_path / "run").rglob("*") if p.is_file())
    assert "planted-wandb-key" not in text and "planted-token-value" not in text
    for package in ("klppo-recipes", "verl", "torch", "ray", "hydra-core"):
        assert data["versions"][package], package
    assert "nccl" in data["versions"]  # None without CUDA, NCCL's version with it
    assert data["command"] == ["python", "-m", "recipes.grpo", "nccl=debug", f"+logger.wandb.api_key={REDACTED}"]
    assert data["pack_git"]["sha"] and isinstance(data["pack_git"]["dirty"], bool)
    rerun = (folder / "rerun.sh").read_text()
    assert f"cd {tmp_path}" in rerun and "python -m recipes.grpo nccl=debug" in rerun
    assert os.access(folder / "rerun.sh", os.X_OK)
    assert data["config"] == "../resolved_config.yaml" and not (folder / "config.yaml").exists()
    config = OmegaConf.load(tmp_path / "run" / "resolved_config.yaml")
    assert config.nccl.env.NCCL_DEBUG == "INFO" and "hydra" not in config
    nccl = json.loads((tmp_path / "run" / "nccl_env.json").read_text())
    assert nccl["env"]["NCCL_DEBUG"] == "INFO" and nccl["sources"]["NCCL_DEBUG"] == "nccl.env"
    assert any("NCCL_DEBUG" in line and "WARN" in line for line in data["nccl_env"]["conflicts"])
    assert any(line.startswith("warning: nccl env: NCCL_DEBUG") for line in lines)


def test_collect_without_a_repository(tmp_path):
    cfg = compose_recipe("grpo", CPU)
    data = collect(cfg, "grpo", overrides=[], cwd=tmp_path, environ={"HF_TOKEN": "hf_x"})
    assert data["git"] is None and data["env"] == {"HF_TOKEN": REDACTED}


def test_validate_run_writes_bundle_with_secrets_redacted(tmp_path, recipe_cli):
    """The real entry point: every action's run folder gets repro/ and nccl_env.json, planted secrets hidden."""
    secrets = {"WANDB_API_KEY": "planted-wandb-0123456789", "HF_TOKEN": "hf_plantedplantedplantedplanted",
               "TEAM_DEPLOY_TOKEN": "planted-deploy"}
    proc = recipe_cli("grpo", "action=validate", "kl=adaptive", cwd=tmp_path, env=secrets)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (run,) = (tmp_path / "runs" / "grpo").iterdir()
    data = json.loads((run / "repro" / "bundle.json").read_text())
    assert data["action"] == "validate" and data["recipe"] == "grpo"
    assert data["command"][:3] == ["python", "-m", "recipes.grpo"] and "kl=adaptive" in data["command"]
    everything = "".join(p.read_text(errors="replace") for p in run.rglob("*") if p.is_file())
    for planted in ("planted-wandb", "hf_planted", "planted-deploy"):
        assert planted not in everything
    assert data["env"]["WANDB_API_KEY"] == data["env"]["HF_TOKEN"] == data["env"]["TEAM_DEPLOY_TOKEN"] == REDACTED
    assert (run / "nccl_env.json").is_file() and (run / "resolved_config.yaml").is_file()
