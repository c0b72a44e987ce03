"""The resharding plan without processes: every rank of a layout simulated in one process (the executor's plan,
packing and unpacking; collectives replaced by copies), bit-exact against the full model and byte-exact against the
planner, up to the paper's 32-rank tp8pp4 -> tp4 geometry. Also: Megatron's fused qkv / fc1 layout, buckets, errors."""

from fractions import Fraction

import pytest
import torch
from reshard_harness import small_spec

from hybrid_engine.groups import hybrid_groups
from hybrid_engine.layout import InferLayout, TrainLayout
from hybrid_engine.model_spec import ModelSpec, arch_from_config, build_spec
from hybrid_engine.plan.bytes import compute_bytes, received_by_tensor, stage_placement
from hybrid_engine.plan.settings import ClusterSpec
from hybrid_engine.reshard import Scheme, fsdp_shards, make_buckets, megatron_shards, simulate, synthetic_source
from hybrid_engine.reshard.shards import box_shape, full_box, narrow_box, synthetic_tensor

SEED = 5


def _groups(t, p, t_g, p_g=1, dp=1, fsdp_world=None):
    if fsdp_world:
        world = fsdp_world
        return hybrid_groups(TrainLayout(dp=world), InferLayout(tp=t_g, pp=p_g).resolve(world), fsdp=True)
    return hybrid_groups(TrainLayout(dp=dp, tp=t, pp=p), InferLayout(tp=t_g, pp=p_g).resolve(t * p * dp))


_FULL: dict[tuple, torch.Tensor] = {}


def _reference(spec: ModelSpec, name: str, box, dtype=torch.float32) -> torch.Tensor:
    """``box`` of the full tensor (the full tensor is built once per test session)."""
    shape = spec.shapes()[name]
    key = (name, shape, dtype)
    if key not in _FULL:
        _FULL[key] = synthetic_tensor(name, shape, full_box(shape), seed=SEED, dtype=dtype)
    return narrow_box(_FULL[key], full_box(shape), box)


def _final_box(scheme: Scheme, rank: int, name: str):
    for step in reversed(range(len(scheme.steps))):
        if scheme.steps[step].final and scheme.target(step, rank, name) is not None:
            return scheme.target(step, rank, name)
    return None


def _check_layout(spec, groups, schemes, bucket_bytes, dtype=torch.float32):
    source = synthetic_source(SEED, dtype)
    size = torch.empty((), dtype=dtype).element_size()
    planned = compute_bytes(spec, groups, ClusterSpec(gpus_per_node=groups.world_size), size, schemes)
    fractions = {}
    for name in schemes:
        scheme = Scheme(name, spec, groups)
        world = groups.world_size
        if scheme.source_kind == "megatron":
            shards = {r: megatron_shards(spec, groups, r, source) for r in range(world)}
        else:
            shards = {r: fsdp_shards(spec, world, r, source) for r in range(world)}
        for rank, rank_shards in shards.items():
            scheme.check_shards(rank, rank_shards)  # what the executor checks before it moves anything
        result = simulate(scheme, shards, bucket_bytes)
        for rank in range(world):
            outputs = result.outputs[rank]
            assert list(outputs) != [] or scheme.final_names(rank) == []
            assert sorted(outputs) == sorted(scheme.final_names(rank)), (name, rank)
            for tensor_name, tensor in outputs.items():
                box = _final_box(scheme, rank, tensor_name)
                assert tuple(tensor.shape) == box_shape(box)
                assert torch.equal(tensor, _reference(spec, tensor_name, box, dtype)), (name, rank, tensor_name)
            measured = {n: e * size for n, e in result.received[rank].items()}
            assert sum(measured.values()) == planned[name].received[rank], (name, rank)
            for tensor_name, nbytes in received_by_tensor(spec, groups, rank, name, size).items():
                assert measured.get(tensor_name, 0) == nbytes, (name, rank, tensor_name)
        for phase in planned[name].phases:
            measured_max = max(result.by_phase[r].get(phase.name, 0) * size for r in range(world))
            assert measured_max == phase.max_bytes, (name, phase.name)
        fractions[name] = Fraction(planned[name].max, planned[name].model_bytes)
    return fractions


MEGATRON_LAYOUTS = [
    pytest.param((2, 1, 1, 1), id="tp2-tp1"),
    pytest.param((4, 1, 2, 1), id="tp4-tp2"),
    pytest.param((4, 2, 2, 1), id="tp4pp2-tp2"),
    pytest.param((4, 2, 2, 2), id="tp4pp2-tp2pp2"),
    pytest.param((8, 1, 4, 1), id="tp8-tp4-gqa-replicated"),
    pytest.param((2, 4, 1, 1), id="tp2pp4-tp1"),
    pytest.param((8, 4, 4, 1), id="tp8pp4-tp4-32ranks", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("layout", MEGATRON_LAYOUTS)
def test_megatron_layouts_bit_exact_and_planned_bytes(layout):
    t, p, t_g, p_g = layout
    spec = small_spec("qwen2_5_0_5b_reduced")
    _check_layout(spec, _groups(t, p, t_g, p_g), ["hybridflow", "tp_group_gather", "full_gather"], 96 << 10)


@pytest.mark.parametrize(
    "layout", [(2, 1, 1, 1), (4, 2, 2, 1), (2, 4, 1, 1)], ids=["tp2-tp1", "tp4pp2-tp2", "tp2pp4-tp1"]
)
def test_untied_model_layouts(layout):
    t, p, t_g, p_g = layout
    spec = small_spec("llama_untied")
    _check_layout(spec, _groups(t, p, t_g, p_g), ["hybridflow", "tp_group_gather", "full_gather"], 96 << 10)


def test_dp2_megatron_layout():
    _check_layout(small_spec("qwen2_5_0_5b_reduced"), _groups(2, 2, 1, 1, dp=2), ["hybridflow"], None)


@pytest.mark.parametrize(
    "world,t_g",
    [(2, 1), (2, 2), (4, 2), (8, 4), pytest.param(32, 4, marks=pytest.mark.slow)],
    ids=["fsdp2-tp1", "fsdp2-tp2", "fsdp4-tp2", "fsdp8-tp4", "fsdp32-tp4"],
)
def test_fsdp_layouts_bit_exact_and_planned_bytes(world, t_g):
    spec = small_spec("qwen2_5_0_5b_reduced")
    _check_layout(spec, _groups(1, 1, t_g, fsdp_world=world), ["fsdp_to_tp", "full_gather"], 96 << 10)


def test_bf16_one_bucket():
    spec = small_spec("qwen2_5_0_5b_reduced")
    _check_layout(spec, _groups(4, 2, 2), ["hybridflow", "full_gather"], None, dtype=torch.bfloat16)


def _even_spec() -> ModelSpec:
    """Decoder layers only (equal stages), every split divisible, no replicated tensor: the paper's formulas hold."""
    arch = arch_from_config(
        {
            "model_type": "llama",
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 4,
            "num_attention_heads": 8,
            "num_key_value_heads": 8,
            "vocab_size": 64,
        },
        "even",
    )
    spec = build_spec(arch, "analytic")
    keep = tuple(t for t in spec.tensors if t.partition != "replicated" and t.layer is not None)
    return ModelSpec(arch=arch, tensors=keep, method="analytic")


@pytest.mark.slow
def test_paper_ratio_tp8pp4_to_tp4_is_31_over_7():
    fractions = _check_layout(_even_spec(), _groups(8, 4, 4), ["hybridflow", "full_gather"], None)
    assert fractions["hybridflow"] == Fraction(7, 32)
    assert fractions["full_gather"] == Fraction(31, 32)
    assert fractions["full_gather"] / fractions["hybridflow"] == Fraction(31, 7)  # 4.4x fewer bytes


def test_megatron_fused_qkv_and_fc1_rows_are_megatron_order():
    """linear_qkv of TP rank i = Megatron's: per query group [q heads; k; v], groups split over tp; fc1 = [gate; up]."""
    arch = arch_from_config(
        {
            "model_type": "qwen2",
            "hidden_size": 32,
            "intermediate_size": 48,
            "num_hidden_layers": 1,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "vocab_size": 16,
        },
        "fused",
    )
    spec = build_spec(arch, "analytic")
    groups = _groups(2, 1, 1)
    full = {t.name: _reference(spec, t.name, full_box(t.shape)) for t in spec.tensors}
    prefix = "model.layers.0."
    q = full[prefix + "self_attn.q_proj.weight"].view(4, 2 * 4, 32)  # kv groups x (2 heads * head_dim 4) x hidden
    k = full[prefix + "self_attn.k_proj.weight"].view(4, 4, 32)
    v = full[prefix + "self_attn.v_proj.weight"].view(4, 4, 32)
    megatron_qkv = torch.cat([q, k, v], dim=1).reshape(-1, 32)  # Megatron's fused layout, group after group
    gate, up = full[prefix + "mlp.gate_proj.weight"], full[prefix + "mlp.up_proj.weight"]
    for rank in range(2):
        shards = megatron_shards(spec, groups, rank, synthetic_source(SEED))
        qkv = shards.storage["decoder.layers.0.self_attention.linear_qkv.weight"]
        assert torch.equal(qkv, megatron_qkv.chunk(2)[rank])
        fc1 = shards.storage["decoder.layers.0.mlp.linear_fc1.weight"]
        assert torch.equal(fc1, torch.cat([gate.chunk(2)[rank], up.chunk(2)[rank]]))
        assert shards.storage["decoder.layers.0.self_attention.linear_proj.weight"].shape == (32, 16)


def test_tied_embedding_copy_moves_by_stage_all_gathers():
    """tp4pp2 -> tp2: both stages hold the tied embedding; each takes the missing half from its own stage."""
    spec = small_spec("qwen2_5_0_5b_reduced")
    groups = _groups(4, 2, 2)
    scheme = Scheme("hybridflow", spec, groups)
    exchange = scheme.exchange(0, 0, ("model.embed_tokens.weight",))
    assert exchange.p2p == ()
    assert sorted(gather.members for gather in exchange.gathers) == [(0, 1), (4, 5)]


def test_buckets_cover_the_model_once_and_interleave_stages():
    spec = small_spec("qwen2_5_0_5b_reduced")
    names = [t.name for t in spec.tensors if t.tied_to is None]
    for bucket_bytes in (None, 1, 50_000):
        buckets = make_buckets(spec, bucket_bytes, 4, stages=2)
        flat = [name for bucket in buckets for name in bucket]
        assert sorted(flat) == sorted(names)
        if bucket_bytes == 50_000:
            sizes = {t.name: t.numel * 4 for t in spec.tensors}
            assert all(sum(sizes[n] for n in b) <= 50_000 or len(b) == 1 for b in buckets)
            placed = stage_placement(spec, 2)
            layered = [b for b in buckets if all(".layers." in n for n in b) and len(b) > 2]
            assert any({n in placed[0] for n in b} == {True, False} for b in layered)  # both stages in one bucket
    assert make_buckets(spec, None, 4) == [tuple(names)]


def test_scheme_errors_name_the_fix():
    spec = small_spec("llama_untied")
    with pytest.raises(ValueError, match="fsdp_to_tp"):
        Scheme("hybridflow", spec, _groups(1, 1, 2, fsdp_world=4))
    with pytest.raises(ValueError, match="FSDP groups"):
        Scheme("fsdp_to_tp", spec, _groups(2, 1, 1))
    with pytest.raises(ValueError, match="choose from"):
        Scheme("zero3", spec, _groups(2, 1, 1))
    scheme = Scheme("hybridflow", spec, _groups(2, 1, 1))
    with pytest.raises(ValueError, match="megatron training shards, got fsdp"):
        scheme.check_shards(0, fsdp_shards(spec, 2, 0, synthetic_source()))
    with pytest.raises(ValueError, match="rank 0: shards hold"):
        scheme.check_shards(0, megatron_shards(spec, _groups(2, 1, 1), 1, synthetic_source()))
    with pytest.raises(ValueError, match="feeder"):
        Scheme("gather_to_feeders", spec, _groups(1, 1, 1, fsdp_world=2))
    moe = build_spec("qwen3_30b_a3b")
    with pytest.raises(NotImplementedError, match="experts"):
        megatron_shards(moe, _groups(2, 1, 1), 0, synthetic_source())


def test_synthetic_weights_any_box_equals_the_full_slice():
    shape = (37, 11)
    full = synthetic_tensor("w", shape, full_box(shape), seed=3, dtype=torch.bfloat16)
    for box in (((0, 37), (0, 11)), ((5, 6), (2, 9)), ((36, 37), (0, 11)), ((3, 3), (0, 11))):
        part = synthetic_tensor("w", shape, box, seed=3, dtype=torch.bfloat16)
        assert torch.equal(part, narrow_box(full, full_box(shape), box))
    assert not torch.equal(full, synthetic_tensor("w", shape, full_box(shape), seed=4, dtype=torch.bfloat16))
    assert full.float().std() > 0.01
