"""scripts/gpu/random_model.py: a shipped architecture as a local folder with random weights and the tiny tokenizer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu" / "random_model.py"


@pytest.mark.slow  # child processes
def test_builds_the_shipped_shape_once_with_a_tokenizer_whose_ids_it_covers(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "models" / "tiny"
    run = subprocess.run([sys.executable, str(SCRIPT), "tiny", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == str(out.resolve())
    shipped = json.loads((REPO / "hybrid_engine" / "model_configs" / "tiny" / "config.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size"):
        assert getattr(model.config, key) == shipped[key], key
    assert len(tokenizer) <= model.config.vocab_size
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    again = subprocess.run([sys.executable, str(SCRIPT), "tiny", str(out)], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and (out / "model.safetensors").stat().st_mtime_ns == stamp  # not rewritten
    assert [p.name for p in out.parent.iterdir()] == ["tiny"]  # no staging folder left beside it
