"""Compositions that reuse Hydra's parsed config files (recipes/compose/hydra_cache.py) are the compositions Hydra
makes."""

from __future__ import annotations

import shutil

import pytest
from omegaconf import OmegaConf

from recipes.compose import hydra_cache
from recipes.compose.compose import compose_recipe
from recipes.compose.confdir import CONF_DIR_ENV, conf_dir

COMMANDS = [("grpo", []), ("kl_ppo", ["kl=ramp", "parallel=tp2"]), ("grpo", [])]


@pytest.fixture
def hydras_own():
    """Hydra's own loading during the test, and whatever was installed before it afterwards."""
    was = hydra_cache.ConfigRepository.load_config
    hydra_cache.uninstall()
    yield
    hydra_cache.ConfigRepository.load_config = was


def _composed(commands) -> list[str]:
    return [OmegaConf.to_yaml(compose_recipe(recipe, list(overrides))) for recipe, overrides in commands]


def test_kept_files_compose_what_hydra_composes(hydras_own):
    # Hydra's own: compose_recipe installs the cache after its first composition, so take it out after each
    hydras = []
    for command in COMMANDS:
        hydras += _composed([command])
        hydra_cache.uninstall()
    hydra_cache.install()
    kept = _composed(COMMANDS)
    assert hydra_cache._KEPT, "nothing was kept"
    assert kept == hydras  # the repeated commands (grpo) too: a kept file is copied, never edited in place
    # every kept file is one of the pack's or verl's, by its path on disk
    paths = {key[3][0] for key in hydra_cache._KEPT}
    assert any(p.startswith(str(conf_dir())) for p in paths) and any("/verl/trainer/config/" in p for p in paths)


def test_a_file_changed_on_disk_is_read_again(hydras_own, tmp_path, monkeypatch):
    conf = tmp_path / "conf"
    shutil.copytree(conf_dir(), conf)
    monkeypatch.setenv(CONF_DIR_ENV, str(conf))
    hydra_cache.install()
    lr = "actor_rollout_ref.actor.optim.lr"
    before = OmegaConf.select(compose_recipe("grpo", ["model=tiny"]), lr)
    model = conf / "model" / "tiny.yaml"
    text = model.read_text()
    assert text.count("lr: 7.0e-3") == 1 and before == 7e-3
    model.write_text(text.replace("lr: 7.0e-3", "lr: 2.1e-2"))
    assert OmegaConf.select(compose_recipe("grpo", ["model=tiny"]), lr) == 2.1e-2
