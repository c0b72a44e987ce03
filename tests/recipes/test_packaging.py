"""The wheel ships the conf/ tree inside `recipes`, so `python -m recipes.grpo` works from any folder after install."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from recipes.compose.confdir import conf_dir, group_options

ROOT = Path(__file__).resolve().parents[2]


def test_conf_dir_found_from_checkout():
    assert conf_dir() == ROOT / "conf"
    assert "tp8pp4" in group_options("parallel")


def test_wheel_contains_conf_tree(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    wheel = next(tmp_path.glob("klppo_recipes-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for path in ("recipes/conf/grpo.yaml", "recipes/conf/kl_ppo.yaml", "recipes/conf/parallel/tp8pp4.yaml",
                 "recipes/conf/nccl/ib.yaml", "hybrid_engine/model_configs/qwen2_7b/config.json",
                 "recipes/grpo.py", "hybrid_engine/layout.py", "recipes/conf/launcher/ray.yaml",
                 "hydra_plugins/klppo_launcher/ray_jobs_launcher.py"):
        assert path in names, path
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "klppo = recipes.verl_ext.plugin" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_every_package_is_listed_in_pyproject():
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for top in ("recipes", "hybrid_engine", "hydra_plugins")
             for p in (ROOT / top).rglob("__init__.py")}
    assert found | {"recipes.conf"} == listed
