"""``hybrid_engine.reshard.megatron``: a GPTModel's own parameters (Megatron names, local layer numbers, either layer
spec's layernorm names) wrapped as training shards without copying, against the library's own ``megatron_shards``
of the same synthetic weights; the stream to feeders simulated for tp2 / tp2pp2 / dp2 (bit-exact, the planner's
bytes), run on 2 real gloo processes at tp2, and the refusals."""

from __future__ import annotations

import re

import pytest
import torch
from reshard_harness import run_world, small_spec

from hybrid_engine.reshard import Scheme, megatron_shards, simulate, synthetic_source
from hybrid_engine.reshard.checksum import tensor_checksum, wrap
from hybrid_engine.reshard.megatron import (
    MegatronRank,
    megatron_checksums,
    megatron_feeder_groups,
    megatron_shards_from_state_dict,
    megatron_stream_to_feeders,
)
from hybrid_engine.reshard.shards import full_box, synthetic_tensor, unique_tensors
from hybrid_engine.reshard.stats import planned_bytes

SEED = 7
_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.*)$")
_LOCAL = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
}


def _as_gpt_model(storage: dict, first_layer: int, local_spec: bool) -> dict:
    """The library's layout keys (global layer numbers, TE names) as a stage's GPTModel names them."""
    out = {}
    for key, value in storage.items():
        match = _LAYER.match(key)
        if match:
            rest = _LOCAL.get(match.group(2), match.group(2)) if local_spec else match.group(2)
            key = f"decoder.layers.{int(match.group(1)) - first_layer}.{rest}"
        out[key] = value
    return out


def _wrapped_world(spec, tp: int, pp: int, dp: int, local_spec: bool = True):
    """(groups, built shards per rank, wrapped shards per rank) of one synthetic model."""
    groups = megatron_feeder_groups(tp * pp * dp, tp, pp)
    layers_per_stage = spec.arch.num_hidden_layers // pp
    built, wrapped = {}, {}
    for rank in range(groups.world_size):
        _, stage, tp_rank, _ = groups.train_coords(rank)
        built[rank] = megatron_shards(spec, groups, rank, synthetic_source(SEED))
        params = _as_gpt_model(built[rank].storage, stage * layers_per_stage, local_spec)
        wrapped[rank] = megatron_shards_from_state_dict(params, spec, tp, tp_rank, pp, stage, rank=rank)
    return groups, built, wrapped


def _full(spec) -> dict[str, torch.Tensor]:
    return {t.name: synthetic_tensor(t.name, t.shape, full_box(t.shape), seed=SEED) for t in unique_tensors(spec)}


@pytest.mark.parametrize("local_spec", [True, False], ids=["local-spec", "te-spec"])
@pytest.mark.parametrize(("tp", "pp", "dp"), [(2, 1, 1), (2, 2, 1), (1, 1, 2), (1, 2, 2)])
def test_wrapping_is_the_library_layout_without_copies(tp, pp, dp, local_spec):
    spec = small_spec("qwen2_5_0_5b_reduced")  # 14 heads / 2 kv heads, qkv bias, tied embedding
    groups, built, wrapped = _wrapped_world(spec, tp, pp, dp, local_spec)
    scheme = Scheme("gather_to_feeders", spec, groups, feeders=(0,))
    for rank in range(groups.world_size):
        assert wrapped[rank].kind == "megatron" and wrapped[rank].segments == built[rank].segments
        assert sorted(wrapped[rank].storage) == sorted(built[rank].storage)
        for key, tensor in built[rank].storage.items():
            assert wrapped[rank].storage[key].data_ptr() == tensor.data_ptr()  # a view of the parameter, no copy
        scheme.check_shards(rank, wrapped[rank])


@pytest.mark.parametrize(("tp", "pp", "dp"), [(2, 1, 1), (2, 2, 1), (1, 1, 2)])
def test_feeders_get_every_full_tensor_bit_exact(tp, pp, dp):
    spec = small_spec("llama_untied")
    groups, _, wrapped = _wrapped_world(spec, tp, pp, dp)
    scheme = Scheme("gather_to_feeders", spec, groups, feeders=(0,))
    result = simulate(scheme, wrapped, bucket_bytes=64 << 10)
    full = _full(spec)
    assert sorted(result.outputs[0]) == sorted(full)
    assert all(torch.equal(result.outputs[0][name], full[name]) for name in full)
    assert all(result.outputs[rank] == {} for rank in range(1, groups.world_size))
    planned = planned_bytes(spec, groups, "gather_to_feeders", 0, 4, feeders=(0,))
    assert sum(result.received[0].values()) * 4 == planned.received  # the model minus rank 0's own shard
    assert (planned.received == 0) == (tp * pp == 1)  # dp replicas hold the whole model: nothing moves


@pytest.mark.parametrize(("tp", "pp", "dp"), [(2, 1, 1), (2, 2, 2), (1, 1, 2)])
def test_checksums_of_first_held_boxes_add_up_to_the_full_tensors(tp, pp, dp):
    spec = small_spec("qwen2_5_0_5b_reduced")
    groups, _, wrapped = _wrapped_world(spec, tp, pp, dp)
    shares = [megatron_checksums(wrapped[rank], spec, groups) for rank in range(groups.world_size)]
    names = shares[0][0]
    total = wrap(sum(sums for _, sums in shares))
    full = _full(spec)
    assert torch.equal(total, torch.stack([tensor_checksum(full[name]) for name in names]))


def _one_rank(spec, tp: int = 1):
    groups = megatron_feeder_groups(tp, tp, 1)
    built = megatron_shards(spec, groups, 0, synthetic_source(SEED))
    return dict(_as_gpt_model(built.storage, 0, local_spec=True))


def test_refusals_name_the_tensor():
    spec = small_spec("llama_untied")
    params = _one_rank(spec)
    with pytest.raises(KeyError, match="decoder.layers.9"):
        megatron_shards_from_state_dict({**params, "decoder.layers.9.input_layernorm.weight": torch.ones(3)}, spec)
    missing = dict(params)
    missing.pop("decoder.final_layernorm.weight")
    with pytest.raises(KeyError, match="final_layernorm"):
        megatron_shards_from_state_dict(missing, spec)
    qkv = "decoder.layers.0.self_attention.linear_qkv.weight"
    with pytest.raises(ValueError, match="linear_qkv.weight: shape"):
        megatron_shards_from_state_dict({**params, qkv: params[qkv][1:]}, spec)
    with pytest.raises(NotImplementedError, match="uneven"):
        megatron_shards_from_state_dict(params, small_spec("qwen2_5_0_5b_reduced"), pp=3)
    extra = {**params, "decoder.layers.0.self_attention.linear_qkv._extra_state": torch.zeros(1)}
    assert "decoder.layers.0.self_attention.linear_qkv._extra_state" not in (
        megatron_shards_from_state_dict(extra, spec).storage
    )


def test_padded_vocabulary_taken_at_tp1_refused_at_tp2():
    spec = small_spec("llama_untied")
    params = _one_rank(spec)
    key = "embedding.word_embeddings.weight"
    rows = params[key].shape[0]
    padded = {**params, key: torch.cat([params[key], torch.zeros(5, params[key].shape[1])])}
    shards = megatron_shards_from_state_dict(padded, spec)
    assert torch.equal(shards.extract("model.embed_tokens.weight", full_box(params[key].shape)), params[key])
    assert shards.storage[key].shape[0] == rows + 5
    tp2 = _one_rank(spec, tp=2)
    tp2[key] = torch.cat([tp2[key], torch.zeros(3, tp2[key].shape[1])])
    with pytest.raises(NotImplementedError, match="padded vocabulary"):
        megatron_shards_from_state_dict(tp2, spec, tp=2, tp_rank=0)


def _stream_rank(rank: int, world: int) -> dict:
    spec = small_spec("qwen2_5_0_5b_reduced")
    groups = megatron_feeder_groups(world, world, 1)
    built = megatron_shards(spec, groups, rank, synthetic_source(SEED))
    params = _as_gpt_model(built.storage, 0, local_spec=True)
    stats: list = []
    stream = megatron_stream_to_feeders(params, spec, [0], MegatronRank(tp=world, tp_rank=rank), stats_out=stats)
    out = dict(stream)
    full = _full(spec)
    return {
        "names": sorted(out),
        "equal": all(torch.equal(out[name], full[name]) for name in out),
        "received": stats[0].received_bytes,
        "planned": stats[0].planned.received,
    }


def test_tp2_stream_on_two_gloo_processes():
    feeder, other = run_world(_stream_rank, 2)
    full_names = sorted(t.name for t in unique_tensors(small_spec("qwen2_5_0_5b_reduced")))
    assert feeder["names"] == full_names and feeder["equal"]
    assert feeder["received"] == feeder["planned"] > 0
    assert other["names"] == [] and other["received"] == other["planned"] == 0
