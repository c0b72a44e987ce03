"""python -m recipes.copy: a copied recipe composes and validates from its own folder, and its own files win."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from recipes.cli.copy import MARKER, copy_recipe, main
from recipes.compose.confdir import CONF_DIR_ENV, entry_command, group_options, pack_groups

ROOT = Path(__file__).resolve().parents[2]


def _run(script: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != CONF_DIR_ENV}
    env["PYTHONPATH"] = str(ROOT)  # the pack "installed"; the copy itself is only on disk in DEST
    return subprocess.run([sys.executable, str(script), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


def test_copy_every_option(tmp_path):
    dest = tmp_path / "team_repo" / "rl"
    entry = copy_recipe("kl_ppo", dest)
    assert entry == dest / "kl_ppo.py"
    # the primary config and the shared files it includes, unchanged
    for name in ("kl_ppo.yaml", "_base.yaml", "_groups.yaml"):
        assert (dest / "conf" / name).read_text() == (ROOT / "conf" / name).read_text(), name
    assert not (dest / "conf" / "grpo.yaml").exists()
    for group in pack_groups():
        copied = sorted(p.stem for p in (dest / "conf" / group).glob("*.yaml") if not p.stem.startswith("_"))
        assert copied == group_options(group), group
    # the shared part of the cluster options comes along; it is not an option
    assert (dest / "conf" / "cluster" / "_node.yaml").is_file() and "_node" not in group_options("cluster")
    marker = json.loads((dest / ".klppo-copy.json").read_text())
    assert marker["recipe"] == "kl_ppo" and marker["pack_version"] and marker["only_used"] is False
    with pytest.raises(FileExistsError):
        copy_recipe("kl_ppo", dest)


@pytest.mark.slow  # child processes
def test_copied_recipe_composes_and_validates_from_its_folder(tmp_path):
    """Run the copy's entry point from its folder: it reads its own conf/ (an edit there shows in the result)."""
    dest = tmp_path / "rl"
    copy_recipe("kl_ppo", dest, only_used=True)
    primary = dest / "conf" / "kl_ppo.yaml"
    primary.write_text(primary.read_text().replace("  name: kl_ppo\n", "  name: team_ppo\n", 1))
    proc = _run(dest / "kl_ppo.py", "action=validate", cwd=dest)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "config OK" in proc.stdout
    (run,) = (dest / "runs" / "team_ppo").iterdir()
    resolved = OmegaConf.load(run / "resolved_config.yaml")
    assert resolved.run.name == "team_ppo" and resolved.algorithm.adv_estimator == "gae"
    bundle = json.loads((run / "repro" / "bundle.json").read_text())
    assert bundle["command"][1] == "kl_ppo.py"  # the copy's own entry point, relative to the launch folder
    # only the options in use were copied: others are unknown here, with the copy's choices listed
    proc = _run(dest / "kl_ppo.py", "kl=adaptive", "action=validate", cwd=dest)
    assert proc.returncode == 2
    assert "kl=adaptive: no such option; choose from fixed" in proc.stderr


@pytest.mark.slow  # child processes
def test_copy_with_choices_rewrites_the_defaults(tmp_path):
    dest = tmp_path / "rl"
    assert main(["grpo", str(dest), "--only-used", "parallel=tp8", "strategy=megatron", "nccl=ib"]) == 0
    # the groups' defaults live in _groups.yaml: rewritten there, the primary config copied as it is
    text = (dest / "conf" / "_groups.yaml").read_text()
    assert "  - parallel: tp8\n" in text and "  - strategy: megatron\n" in text and "  - nccl: ib\n" in text
    assert "# training backend: fsdp | fsdp2 | megatron" in text  # comments kept
    assert (dest / "conf" / "grpo.yaml").read_text() == (ROOT / "conf" / "grpo.yaml").read_text()
    assert sorted(p.stem for p in (dest / "conf" / "parallel").glob("*.yaml")) == ["cpu", "tp8"]
    assert sorted(p.stem for p in (dest / "conf" / "launcher").glob("*.yaml")) == ["local", "ray"]
    assert not (dest / "conf" / "experiment").exists()
    proc = _run(dest / "grpo.py", "action=validate", "cluster=h100_80g", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "megatron train dp1 tp8 pp1" in proc.stdout
    # the default nccl choice of the copy reaches every worker's env
    (run,) = (tmp_path / "runs" / "grpo").iterdir()
    assert json.loads((run / "nccl_env.json").read_text())["env"]["NCCL_IB_HCA"] == "mlx5_0"


@pytest.mark.slow  # a child process composes from the copy
def test_only_used_copies_what_an_option_includes(tmp_path):
    """strategy=fsdp is a delta of fsdp2, the GPU clusters share cluster/_node.yaml: both come along."""
    dest = tmp_path / "rl"
    assert main(["kl_ppo", str(dest), "--only-used", "strategy=fsdp", "cluster=a100_80g", "nccl=nvlink"]) == 0
    conf = dest / "conf"
    assert sorted(p.stem for p in (conf / "strategy").glob("*.yaml")) == ["fsdp", "fsdp2"]
    assert sorted(p.stem for p in (conf / "cluster").glob("*.yaml")) == ["_node", "a100_80g", "cpu"]
    marker = json.loads((dest / MARKER).read_text())
    assert marker["groups"]["strategy"] == ["fsdp", "fsdp2"] and marker["groups"]["cluster"] == ["a100_80g", "cpu"]
    env = {k: v for k, v in os.environ.items() if k != CONF_DIR_ENV}
    env[CONF_DIR_ENV] = str(conf)
    probe = ("from recipes.compose.compose import compose_recipe; c = compose_recipe('kl_ppo', []); "
             "print(c.strategy.name, c.critic.strategy, c.cluster.gpu.name, c.cluster.world_size, "
             "c.nccl.env.NCCL_IB_DISABLE)")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["fsdp", "fsdp", "a100_80g", "8", "1"]


def test_copy_refuses_bad_input(tmp_path, capsys):
    assert main(["grpo", str(tmp_path / "a"), "parallel=tp9"]) == 2
    assert "parallel=tp9: no such option" in capsys.readouterr().err
    assert main(["grpo", str(tmp_path / "b"), "data.train_batch_size=8"]) == 2
    assert "give group=option pairs" in capsys.readouterr().err
    assert main(["nope", str(tmp_path / "c")]) == 2


def test_entry_command(monkeypatch, tmp_path):
    monkeypatch.delenv(CONF_DIR_ENV, raising=False)
    assert entry_command("grpo") == ["python", "-m", "recipes.grpo"]
    copy_recipe("grpo", tmp_path / "rl", only_used=True)
    monkeypatch.setenv(CONF_DIR_ENV, str(tmp_path / "rl" / "conf"))
    monkeypatch.chdir(tmp_path)
    assert entry_command("grpo") == ["python", str(Path("rl") / "grpo.py")]


def test_a_copy_keeps_the_tiny_models_schedule_on_both_engines(tmp_path):
    """conf/_schedule/ (included by strategy/ through ``${model}``) travels with a copy, even with --only-used."""
    from recipes.compose.compose import compose_recipe

    dest = tmp_path / "rl"
    copy_recipe("grpo", dest, only_used=True)
    assert sorted(p.name for p in (dest / "conf" / "_schedule").glob("*.yaml")) == sorted(
        p.name for p in (ROOT / "conf" / "_schedule").glob("*.yaml"))
    fsdp = compose_recipe("grpo", ["model=tiny", "cluster=cpu", "parallel=cpu"]).actor_rollout_ref.actor.optim
    assert (fsdp.lr_scheduler_type, fsdp.min_lr_ratio) == ("cosine", 0.2)
    mega = compose_recipe("grpo", ["model=tiny", "strategy=megatron", "parallel=tp1", "cluster=h200_141g",
                                   "cluster.gpus_per_node=1"]).actor_rollout_ref.actor.optim
    assert mega.lr_decay_style == "cosine" and mega.min_lr == pytest.approx(0.2 * mega.lr)
    assert "lr_scheduler_type" not in mega  # Megatron's optimizer config refuses FSDP's keys
    other = compose_recipe("grpo", ["model=qwen2_5_0_5b", "parallel=tp1"]).actor_rollout_ref.actor.optim
    assert other.lr_scheduler_type == "constant"  # verl's own, where a model has no schedule of its own
