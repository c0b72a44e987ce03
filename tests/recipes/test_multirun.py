"""Hydra multirun works through the recipes: a two-job sweep validates both jobs, each in its own folder."""

from __future__ import annotations

from omegaconf import OmegaConf


def test_multirun_validates_every_job(tmp_path, recipe_cli):
    proc = recipe_cli("grpo", "-m", "kl=fixed,adaptive", "action=validate", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Launching 2 jobs locally" in proc.stdout + proc.stderr
    written = sorted((tmp_path / "runs" / "grpo").glob("multirun-*/*/resolved_config.yaml"))
    assert [p.parent.name for p in written] == ["0", "1"]
    kinds = [OmegaConf.load(p).algorithm.kl_ctrl.type for p in written]
    assert kinds == ["fixed", "adaptive"]
    assert OmegaConf.load(written[1]).algorithm.kl_ctrl.target_kl == 0.1
