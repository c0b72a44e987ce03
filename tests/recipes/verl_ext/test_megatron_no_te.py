"""strategy=megatron without TransformerEngine: the pins of the ``[megatron]`` extra and the no-TE patch.

The round trip through megatron-core runs only where the extra is importable (CI does not install it):
``PYTHONPATH=/path/to/megatron_site python -m pytest tests/recipes/verl_ext/test_megatron_no_te.py``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import verl  # noqa: F401  (imports the plugin through the verl.plugins entry point)

from recipes.verl_ext.plugin import patches

ROOT = Path(__file__).resolve().parents[3]
PATCHED_MODULES = {
    "verl.workers.config.engine",
    "verl.models.mcore.model_forward",
    "mbridge.core.llm_bridge",
    "mbridge.core.bridge",
}


def _megatron_extra() -> dict[str, str]:
    import tomllib  # Python 3.11+, as in test_packaging

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["megatron"]
    return dict(re.fullmatch(r"([A-Za-z0-9_.-]+)(.*)", requirement).groups() for requirement in extra)


def test_megatron_extra_pins_exactly_the_patched_versions():
    extra = _megatron_extra()
    assert {name: spec for name, spec in extra.items() if name in patches.SUPPORTED_MEGATRON} == {
        name: f"=={version}" for name, version in patches.SUPPORTED_MEGATRON.items()
    }


def test_docs_name_the_pinned_versions():
    docs = (ROOT / "docs" / "megatron.md").read_text()
    for name, version in patches.SUPPORTED_MEGATRON.items():
        assert f"| {name} | {version} |" in docs


def _registered_hooks(monkeypatch) -> list[str]:
    calls: list[str] = []
    monkeypatch.setattr(patches, "when_imported", lambda module_name, callback: calls.append(module_name))
    patches.apply_no_te_patches()
    return calls


def test_nothing_changes_where_transformer_engine_imports(tmp_path, monkeypatch):
    (tmp_path / "transformer_engine").mkdir()
    (tmp_path / "transformer_engine" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert patches.transformer_engine_installed()
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


megatron_installed = pytest.mark.skipif(
    importlib.util.find_spec("megatron") is None or importlib.util.find_spec("mbridge") is None,
    reason="the [megatron] extra is not installed",
)


@megatron_installed
@pytest.mark.slow
def test_tiny_qwen2_round_trips_through_the_local_spec():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "probe_megatron_no_te.py")],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout[done.stdout.index("{") :])
    assert result["max_abs_logit_diff"] < 0.02  # bf16 noise on logits of magnitude ~0.5
    assert result["argmax_agreement"] == 1.0
    assert result["export_bit_exact"] and result["exported_tensors"] == result["hf_tensors"]
