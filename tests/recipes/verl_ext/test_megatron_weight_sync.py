"""strategy=megatron -> the hf rollout through the resharder: a real megatron-core GPTModel built by verl's mbridge path
(tiny Qwen2, GQA 4 heads / 2 kv heads, qkv bias) is exported by the patched ``MegatronEngine.get_per_tensor_param``
and streamed by ``open_weight_stream``; what the feeder gets equals mbridge's ``export_weights``, tensor for tensor,
bit for bit. Runs where the ``[megatron]`` extra is importable or ``make install`` put it in build/megatron-site
(tests/conftest.py ``megatron_path``); each check runs in a child process.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, megatron_child_env, megatron_path

pytestmark = [
    pytest.mark.skipif(megatron_path() is None, reason="the [megatron] extra is not installed (make install)"),
    pytest.mark.slow,  # a child process building megatron-core models: 7-9 s each
]


def _probe(*flags: str) -> dict:
    """megatron_sync_probe in a subprocess (megatron-core's CPU set-up patches torch globally)."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.recipes.verl_ext.megatron_sync_probe", *flags],
        capture_output=True, text=True, env=megatron_child_env(), cwd=ROOT, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _assert_resharded_equals_mbridge(result: dict) -> None:
    assert result["exported"] == "MegatronShardedWeights"
    assert result["scheme"] == "gather_to_feeders" and result["fallback_reason"] is None
    assert not result["verl_generator_started"]  # mbridge's export is never run on the resharder's path
    assert sorted(result["streamed_names"]) == sorted(result["reference_names"])
    assert len(result["streamed_names"]) == len(set(result["streamed_names"]))
    assert result["mismatched"] == [] and result["dtypes"] == ["torch.bfloat16"]
    assert result["storage_aliases_parameters"]  # the shards are the parameters, not copies
    assert result["received_bytes"] == 0 and result["full_tensor_bytes"] == 0  # one rank holds the whole model
    assert result["training_checksums"] and result["checksums_match"]


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_resharded_stream_equals_mbridge_export_bit_for_bit(tied):
    result = _probe(*(["--tied"] if tied else []))
    _assert_resharded_equals_mbridge(result)
    assert ("lm_head.weight" in result["streamed_names"]) is not tied
    assert len(result["streamed_names"]) == 26 + (not tied)  # 2 layers x 12 + embedding + final norm (+ lm_head)


@pytest.mark.slow
def test_padded_vocabulary_rows_stay_behind():
    result = _probe("--padded")
    assert result["embedding_rows"] == 192  # 128 padded to a multiple of 96
    _assert_resharded_equals_mbridge(result)


@pytest.mark.slow
def test_parameters_the_spec_does_not_describe_fall_back_to_verl_with_one_reason():
    result = _probe("--wrong-config")
    assert result["exported"] == "generator" and result["verl_generator_started"]
    assert result["scheme"] == "verl_full_tensor" and not result["training_checksums"]
    assert result["mismatched"] == [] and sorted(result["streamed_names"]) == sorted(result["reference_names"])
    assert len(result["warnings"]) == 1 and "linear_fc1.weight" in result["warnings"][0]
