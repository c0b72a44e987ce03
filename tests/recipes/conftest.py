from __future__ import annotations

import pytest

from recipes.compose import compose_recipe
from recipes.resolvers import register_resolvers

register_resolvers()

# Options that need a context to be valid (the rest compose with the recipe's defaults).
CONTEXT = {
    ("parallel", "cpu"): ["cluster=cpu"],
    ("parallel", "tp4pp2"): ["strategy=megatron"],
    ("parallel", "tp8pp4"): ["strategy=megatron", "cluster.nnodes=4"],
    ("cluster", "cpu"): ["parallel=cpu"],
    ("strategy", "megatron"): ["parallel=tp8"],
    ("model", "tiny"): ["parallel=tp1"],
    ("model", "qwen2_5_0_5b"): ["parallel=tp2"],
}


@pytest.fixture
def compose():
    return compose_recipe
