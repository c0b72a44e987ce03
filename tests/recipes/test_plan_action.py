"""action=plan on both recipes: table, JSON with the same numbers, picture, exit 2 on errors."""

from __future__ import annotations

import io
import json

import pytest

from recipes.check.plan import make_plan, run_plan
from recipes.check.validate import check
from recipes.compose.compose import compose_recipe

SEED = ["strategy=megatron", "parallel=tp8pp4", "cluster.nnodes=4", "action=plan"]


@pytest.mark.parametrize("recipe", ["grpo", "kl_ppo"])
def test_plan_table_and_json_agree(recipe, tmp_path):
    checked = check(compose_recipe(recipe, SEED + ["plan.format=json", f"plan.picture={tmp_path}/grid.svg"]))
    assert checked.problems == ()
    out = io.StringIO()
    assert run_plan(checked, out=out) == 0
    data = json.loads(out.getvalue())
    assert data["world_size"] == 32
    assert data["groups"]["micro_dp"][0] == [0, 1, 8, 9, 16, 17, 24, 25]
    assert data["groups"]["d_g"] == 8
    assert data["bytes"]["full_gather"]["per_gpu_fraction_of_model"] == "31/32 M"
    hybrid = data["bytes"]["hybridflow"]["per_gpu_received_bytes"]
    full = data["bytes"]["full_gather"]["per_gpu_received_bytes"]
    # mean over GPUs: 7/32 M vs 31/32 M up to the embedding/lm_head/norm tensors that only some stages hold
    assert 31 / 7 * 0.9 < full["mean"] / hybrid["mean"] < 31 / 7 * 1.1
    assert (tmp_path / "grid.svg").read_text().startswith("<?xml")
    table = make_plan(checked).render_table()
    assert "31/32 M" in table and "micro-DP {0,1,8,9,16,17,24,25}" in table
    assert data["fits"] is True and data["memory"]["peak_bytes"] < data["memory"]["gpu_bytes"]
    assert data["settings"]["has_critic"] is (recipe == "kl_ppo")


def test_plan_of_a_layout_the_model_cannot_take_prints_and_fails():
    checked = check(compose_recipe("kl_ppo", SEED + ["model=qwen2_7b"]))
    assert list(checked.problems) == [
        "layout.train.tp: qwen2_7b has 28 attention heads, not divisible by tp(8): 28 % 8 = 4",
        "layout.train.tp: Megatron needs tp(8) to divide qwen2_7b's 4 kv heads: 4 % 8 = 4",
    ]
    out = io.StringIO()
    assert run_plan(checked, out=out) == 2
    text = out.getvalue()
    assert "31/32 M" in text and "errors:" in text and "28 % 8 = 4" in text
