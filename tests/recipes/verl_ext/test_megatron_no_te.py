"""strategy=megatron without TransformerEngine: the pins of the ``[megatron]`` extra and the no-TE patch.

The round trip through megatron-core runs in a child process where the extra is importable or ``make install`` put it
in build/megatron-site (tests/conftest.py ``megatron_path``); the in-process checks only where this process imports
it (``PYTHONPATH=build/megatron-site python -m pytest tests/recipes/verl_ext/test_megatron_no_te.py``).
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import types

import pytest
import verl  # noqa: F401  (imports the plugin through the verl.plugins entry point)

from recipes.verl_ext.plugin import megatron_no_te
from tests.conftest import ROOT, megatron_child_env, megatron_path

PATCHED_MODULES = {
    "verl.workers.config.engine",
    "megatron.core.transformer.dot_product_attention",
    "mbridge.core.llm_bridge",
    "mbridge.core.bridge",
    "megatron.core.optimizer.distrib_optimizer",
    "mbridge.core.safetensor_io",
}


def _megatron_extra() -> dict[str, str]:
    import tomllib  # Python 3.11+, as in test_packaging

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["megatron"]
    return dict(re.fullmatch(r"([A-Za-z0-9_.-]+)(.*)", requirement).groups() for requirement in extra)


def test_megatron_extra_pins_exactly_the_patched_versions():
    extra = _megatron_extra()
    assert {name: spec for name, spec in extra.items() if name in megatron_no_te.SUPPORTED_MEGATRON} == {
        name: f"=={version}" for name, version in megatron_no_te.SUPPORTED_MEGATRON.items()
    }


def test_the_test_site_pins_what_the_extra_pins():
    """requirements/megatron-site.txt (make install's build/megatron-site for the tests) holds the extra's pins."""
    lines = (ROOT / "requirements" / "megatron-site.txt").read_text().splitlines()
    site = dict(line.split("==") for line in lines if line and not line.startswith("#"))
    extra = _megatron_extra()
    assert {name: f"=={site[name]}" for name in megatron_no_te.SUPPORTED_MEGATRON} == {
        name: spec for name, spec in extra.items() if name in megatron_no_te.SUPPORTED_MEGATRON}
    assert set(site) == set(extra)  # einops too, which mbridge imports


def test_docs_name_the_pinned_versions():
    docs = (ROOT / "docs" / "megatron.md").read_text()
    for name, version in megatron_no_te.SUPPORTED_MEGATRON.items():
        assert f"| {name} | {version} |" in docs


def _registered_hooks(monkeypatch) -> list[str]:
    calls: list[str] = []
    monkeypatch.setattr(megatron_no_te, "when_imported", lambda module_name, callback: calls.append(module_name))
    megatron_no_te.apply_no_te_patches()
    return calls


def test_nothing_changes_where_transformer_engine_imports(tmp_path, monkeypatch):
    (tmp_path / "transformer_engine").mkdir()
    (tmp_path / "transformer_engine" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert megatron_no_te.transformer_engine_installed()
    assert _registered_hooks(monkeypatch) == []


@pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is not None, reason="TransformerEngine installed")
def test_patch_registered_where_transformer_engine_is_missing(monkeypatch):
    assert set(_registered_hooks(monkeypatch)) == PATCHED_MODULES


@pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is not None, reason="TransformerEngine installed")
def test_engine_config_takes_local_spec_values_and_says_nothing(capsys):
    from verl.workers.config import McoreEngineConfig

    configs = [McoreEngineConfig(override_transformer_config={"attention_backend": "flash"}) for _ in range(2)]
    assert capsys.readouterr().err == ""  # the launcher notes it once the run is valid (tests/recipes/test_needs.py)
    for config in configs:
        assert (config.vanilla_mbridge, config.use_remove_padding) == (True, False)
        assert config.override_transformer_config["masked_softmax_fusion"] is False
    # verl's engine workers copy the model's use_remove_padding (true in both recipes) onto the engine config
    configs[0].use_remove_padding = True
    configs[0].forward_only = True
    assert (configs[0].use_remove_padding, configs[0].forward_only) == (False, True)


megatron_installed = pytest.mark.skipif(megatron_path() != "",
                                        reason="the [megatron] extra is not importable in this process")
megatron_for_children = pytest.mark.skipif(megatron_path() is None,
                                           reason="the [megatron] extra is not installed (make install)")


@megatron_for_children
@pytest.mark.slow
def test_tiny_qwen2_round_trips_through_the_local_spec():
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "probe_megatron_no_te.py")],
        capture_output=True, text=True, env=megatron_child_env(), cwd=ROOT, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout[done.stdout.index("{") :])
    assert result["max_abs_logit_diff"] < 0.02  # bf16 noise on logits of magnitude ~0.5
    assert result["argmax_agreement"] == 1.0
    assert result["export_bit_exact"] and result["exported_tensors"] == result["hf_tensors"]
    # a critic of a tied model beside its tied actor: saved and resumed as verl's Megatron checkpoint does (the
    # H200 resume of 2026-12-05 failed here, its value head saved over the embedding)
    assert result["critic_unequal_after_resume"] == []
    assert result["critic_tensors"] == 17  # 2 layers of 7, the embedding, the final norm, the value head
    assert result["critic_saved_value_head_shape"] == [1, 64]


IN_PROCESS = "distributed_optimizer_state_dict_before_the_first_step or tied_checkpoint_hands_the_embedding"
"""The checks below that import megatron-core in this process (-k expression)."""


@megatron_for_children
@pytest.mark.slow
def test_the_in_process_checks_pass_where_megatron_is_importable():
    """Where this process cannot import megatron-core (the suite keeps it out: tests/recipes/test_needs.py), the two
    checks that need it in-process run in a child pytest with build/megatron-site on its path."""
    if megatron_path() == "":
        pytest.skip("megatron-core is importable here: the checks run in this process")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
         IN_PROCESS], capture_output=True, text=True, env=megatron_child_env(), cwd=ROOT, timeout=300,
    )
    assert done.returncode == 0 and "2 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]


@megatron_installed
def test_distributed_optimizer_state_dict_before_the_first_step(monkeypatch):
    """A resume asks megatron-core's DistributedOptimizer for its state dict before any step (torch's Adam, no TE)."""
    import torch
    from megatron.core.optimizer import distrib_optimizer

    monkeypatch.setattr(distrib_optimizer, "HAVE_APEX_OR_TE", False)
    megatron_no_te._fresh_optimizer_state(distrib_optimizer)
    weights = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))]
    adam = torch.optim.Adam(weights, lr=0.1)

    def init_state_fn(opt, config=None):  # megatron-core's own for adam (megatron/core/optimizer/__init__.py)
        for group in opt.param_groups:
            for p in group["params"]:
                opt.state[p]["exp_avg"] = torch.zeros_like(p.data)
                opt.state[p]["exp_avg_sq"] = torch.zeros_like(p.data)

    fresh = types.SimpleNamespace(optimizer=adam, init_state_fn=init_state_fn, config=None, grad_scaler=None)
    state = distrib_optimizer.DistributedOptimizer.state_dict(fresh)
    assert [group["step"] for group in state["optimizer"]["param_groups"]] == [0.0]
    # the state created is the one torch's Adam creates at its first step: one step from here matches a fresh Adam
    reference = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))]
    fresh_adam = torch.optim.Adam(reference, lr=0.1)
    for params, opt in ((weights, adam), (reference, fresh_adam)):
        for p, g in zip(params, (torch.tensor([1.0, -2.0, 3.0]), torch.tensor([0.5, 0.25])), strict=True):
            p.grad = g
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(weights, reference, strict=True))


@megatron_installed
def test_a_tied_checkpoint_hands_the_embedding_for_lm_head(tmp_path):
    """mbridge loads a critic's lm_head.weight (to skip it); a tied-embedding checkpoint has only the embedding."""
    import torch
    from mbridge.core import safetensor_io
    from safetensors.torch import save_file

    megatron_no_te._tied_output_layer(safetensor_io)
    embedding, norm = torch.randn(8, 4), torch.randn(4)
    save_file({"model.embed_tokens.weight": embedding, "model.norm.weight": norm}, tmp_path / "model.safetensors")
    reader = safetensor_io.SafeTensorIO(str(tmp_path))
    weights = reader.load_some_hf_weight(["lm_head.weight", "model.norm.weight"])
    assert sorted(weights) == ["lm_head.weight", "model.norm.weight"]
    assert torch.equal(weights["lm_head.weight"], embedding) and torch.equal(weights["model.norm.weight"], norm)
    both = reader.load_some_hf_weight(["model.embed_tokens.weight", "lm_head.weight"])
    assert sorted(both) == ["lm_head.weight", "model.embed_tokens.weight"]
    assert torch.equal(both["lm_head.weight"], embedding)
    save_file({"lm_head.weight": norm[None]}, tmp_path / "model.safetensors")  # untied: read as it is
    assert torch.equal(reader.load_some_hf_weight(["lm_head.weight"])["lm_head.weight"], norm[None])
    # a critic's resume asked for lm_head.weight twice; mbridge counted the answer against the names asked
    assert list(reader.load_some_hf_weight(["lm_head.weight", "lm_head.weight"])) == ["lm_head.weight"]
