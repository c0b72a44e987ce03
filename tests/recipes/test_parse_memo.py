"""Kept interpolation parses (recipes/compose/parse_memo.py) resolve every config as OmegaConf's own parsing does."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf
from omegaconf import base as omegaconf_base
from omegaconf.errors import GrammarParseError

from recipes.compose import parse_memo
from recipes.compose.compose import compose_recipe


@pytest.fixture
def own_parsing():
    """OmegaConf's own parsing for the test, the kept parses again after it (what every entry point installs)."""
    parse_memo.uninstall()
    yield
    parse_memo.install()


@pytest.mark.parametrize("recipe, overrides", [
    ("grpo", []),
    ("kl_ppo", []),
    ("kl_ppo", ["strategy=megatron", "parallel=tp8pp4", "cluster.nnodes=4", "batching=dynamic"]),
    ("grpo", ["cluster=cpu", "parallel=cpu", "kl=ramp"]),
])
def test_resolutions_are_the_same_with_kept_parses(recipe, overrides, own_parsing):
    cfg = compose_recipe(recipe, overrides)
    parse_memo.uninstall()  # compose_recipe installs them
    own = OmegaConf.to_container(cfg, resolve=True)
    parse_memo.install()
    first = OmegaConf.to_container(cfg, resolve=True)  # parses kept
    again = OmegaConf.to_container(cfg, resolve=True)  # read from the kept trees
    assert own == first == again
    assert parse_memo._kept_parse.cache_info().hits > 0


def test_a_string_that_does_not_parse_raises_each_time():
    parse_memo.install()
    cfg = OmegaConf.create({"a": 1})
    for _ in range(2):
        with pytest.raises(GrammarParseError):
            cfg.b = "${a"  # an interpolation left open: OmegaConf validates it on assignment


def test_uninstall_gives_omegaconf_its_own_parse_back(own_parsing):
    assert omegaconf_base.parse is parse_memo._OMEGACONF_PARSE
    assert parse_memo._kept_parse.cache_info().currsize == 0
    parse_memo.install()
    assert omegaconf_base.parse is parse_memo._kept_parse
    tree = omegaconf_base.parse("${x.y}")
    assert omegaconf_base.parse("${x.y}") is tree  # one parse, kept
