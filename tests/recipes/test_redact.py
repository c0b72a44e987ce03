"""The redaction policy hides secrets and nothing else: no key of verl 0.9.1's tree or the pack's is redacted."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from recipes.compose.compose import compose_recipe
from recipes.record.redact import REDACTED, is_secret_name, redact_config

LAYOUTS = [
    ("grpo", ["parallel=tp2"]),
    ("kl_ppo", ["parallel=tp2"]),
    ("grpo", ["strategy=megatron", "parallel=tp8"]),
    ("kl_ppo", ["strategy=megatron", "parallel=tp4pp2"]),
    ("grpo", ["rollout=sglang", "logger=wandb"]),
    ("grpo", ["strategy=veomni", "parallel=tp2"]),
    # verl's distillation teachers are a map keyed by data source; each entry's `key` names that source
    ("grpo", ["parallel=tp2", "+distillation.teacher_models.gsm8k.key=openai/gsm8k",
              "+distillation.teacher_models.geo3k.key=hiyouga/geometry3k"]),
]


def _leaf_keys(node, prefix=""):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaf_keys(value, f"{prefix}{key}.")
    elif isinstance(node, list):
        for item in node:
            yield from _leaf_keys(item, prefix)
    else:
        yield prefix.rstrip(".")


@pytest.mark.parametrize("recipe,overrides", LAYOUTS, ids=[" ".join([r, *o]) for r, o in LAYOUTS])
def test_no_key_of_the_composed_tree_is_treated_as_a_secret(recipe, overrides):
    container = OmegaConf.to_container(compose_recipe(recipe, overrides), resolve=False)
    flagged = sorted({key for key in _leaf_keys(container) if is_secret_name(key)})
    assert flagged == []
    assert redact_config(container) == container  # no value of the shipped tree looks like a key either


def test_secrets_of_every_kind_are_hidden_in_a_config():
    cfg = {"trainer": {"wandb_key": "abc", "hub_token": "t"}, "logger": {"apiKey": 1},
           "db": {"password": "pw", "url": "postgres://u:pw@host/db"}, "note": "hf_abcdefghijklmnopqrstuvwxyz"}
    out = redact_config(cfg)
    assert out["trainer"] == {"wandb_key": REDACTED, "hub_token": REDACTED}
    assert out["logger"] == {"apiKey": REDACTED} and out["db"]["password"] == REDACTED
    assert out["db"]["url"] == f"postgres://u:{REDACTED}@host/db" and out["note"] == REDACTED


def test_a_bare_key_is_secret_by_its_parent_or_by_the_map_it_sits_in():
    assert is_secret_name("trainer.wandb.key") and is_secret_name("wandb.key") and is_secret_name("service.token")
    assert not is_secret_name("actor_rollout_ref.model.teacher_model.key")
    assert not is_secret_name("distillation.teacher_models.gsm8k.key")
