"""recipes.record.yamlio writes the text OmegaConf.to_yaml writes, and it loads back to the same values."""

from __future__ import annotations

import yaml
from omegaconf import OmegaConf

from recipes.compose.compose import compose_recipe
from recipes.record import yamlio

TRICKY = {"exp": "1e-3", "bool_word": "true", "yes_no": "n", "null_word": "null", "tilde": "~", "empty": "",
          "hex": "0x1F", "underscored": "1_000", "unicode": "ünïcode", "colon": "x: y", "multi": "two\nlines",
          "numbers": [1, "2", None, 1.5e-8, float("inf"), -0.0], "nested": {"n": 5, "x": {"deep": [{"a": "3.0"}]}}}


def test_same_text_as_omegaconf_for_verl_config_and_tricky_strings():
    container = OmegaConf.to_container(compose_recipe("kl_ppo", ["model=tiny", "task=tiny"]), resolve=True)
    container = {k: v for k, v in container.items() if k != "hydra"} | {"tricky": TRICKY}
    text = yamlio.dump(container)
    assert text == OmegaConf.to_yaml(OmegaConf.create(container))
    loaded = OmegaConf.to_container(OmegaConf.create(text))
    assert loaded["tricky"]["exp"] == "1e-3" and loaded["tricky"]["numbers"][1] == "2"
    assert yaml.safe_load(text)["tricky"]["bool_word"] == "true"


def test_an_empty_key_loads_back_although_the_c_emitter_spells_it_as_a_complex_key():
    container = {"outer": {"": {"a": "1"}, "b": 2}}
    assert OmegaConf.to_container(OmegaConf.create(yamlio.dump(container))) == container
