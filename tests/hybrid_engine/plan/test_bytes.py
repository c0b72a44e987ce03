"""Bytes received per GPU: Table 2 of the HybridFlow paper on evenly divisible models, and a brute-force element
count (boolean masks over every tensor) on real tiny models with norms, GQA replication, uneven heads and experts."""

import itertools
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybrid_engine.groups import hybrid_groups
from hybrid_engine.layout import FSDP_ORDER, InferLayout, LayoutError, TrainLayout
from hybrid_engine.model_spec import ModelSpec, arch_from_config, build_spec
from hybrid_engine.plan.bytes import (
    compute_bytes,
    fraction_text,
    fsdp_chunk,
    generation_shard_peak,
    received_by_tensor,
    stage_bounds,
)
from hybrid_engine.plan.settings import ClusterSpec

CLUSTER = ClusterSpec(nnodes=1, gpus_per_node=64)


def _even_spec(with_ends: bool) -> ModelSpec:
    """64 layers, every split dim divisible by 64: heads 64 (head_dim 2), kv 64, ffn 128, vocab 256. No norms."""
    arch = arch_from_config(
        {
            "model_type": "llama",
            "hidden_size": 128,
            "intermediate_size": 128,
            "num_hidden_layers": 64,
            "num_attention_heads": 64,
            "num_key_value_heads": 64,
            "vocab_size": 256,
        },
        "even",
    )
    spec = build_spec(arch, "analytic")
    keep = [t for t in spec.tensors if t.partition != "replicated" and (with_ends or t.layer is not None)]
    return ModelSpec(arch=arch, tensors=tuple(keep), method="analytic")


EVEN = _even_spec(with_ends=False)
EVEN_ENDS = _even_spec(with_ends=True)


def _plan_bytes(spec, t, p, d, t_g, p_g, cluster=CLUSTER, **kwargs):
    groups = hybrid_groups(TrainLayout(dp=d, tp=t, pp=p, **kwargs), InferLayout(tp=t_g, pp=p_g).resolve(t * p * d))
    return compute_bytes(spec, groups, cluster, 2)


def test_paper_vector_t8_p4_to_t4():
    b = _plan_bytes(EVEN, 8, 4, 1, 4, 1)
    m = b["hybridflow"].model_bytes
    assert b["hybridflow"].max == b["hybridflow"].min == m * 7 // 32
    assert b["hybridflow"].fraction == Fraction(7, 32) and fraction_text(b["hybridflow"].fraction) == "7/32 M"
    assert b["full_gather"].fraction == Fraction(31, 32) and b["full_gather"].min == m * 31 // 32
    assert b["tp_group_gather"].fraction == Fraction(31, 32)
    assert b["hybridflow"].peak_param_bytes == m // 4  # M / (t_g * p_g)
    assert b["hybridflow"].total == 32 * m * 7 // 32


def test_paper_vector_t4_to_t2_on_4_ranks():
    b = _plan_bytes(EVEN, 4, 1, 1, 2, 1)
    assert b["hybridflow"].fraction == Fraction(1, 4)
    assert b["tp_group_gather"].fraction == Fraction(3, 4)
    assert b["full_gather"].fraction == Fraction(3, 4)


def _divisor_layouts(max_world=64):
    for t, p, d in itertools.product([1, 2, 4, 8, 16, 32, 64, 3, 6, 12], [1, 2, 4, 8, 16, 32, 64], [1, 2, 4, 8, 3]):
        if t * p * d > max_world or (t == 1 and p == 1) or 64 % t and t not in (3, 6, 12):
            continue
        for t_g in (x for x in range(1, t + 1) if t % x == 0):
            for p_g in (x for x in range(1, p + 1) if p % x == 0):
                yield t, p, d, t_g, p_g


LAYOUTS = [layout for layout in _divisor_layouts() if 64 % layout[0] == 0]


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(LAYOUTS))
def test_table2_formulas_when_tensors_divide(layout):
    t, p, d, t_g, p_g = layout
    n = t * p * d
    d_g = (t // t_g) * (p // p_g)
    b = _plan_bytes(EVEN, t, p, d, t_g, p_g)
    m = b["hybridflow"].model_bytes
    expected = {"hybridflow": Fraction(d_g - 1, t * p), "tp_group_gather": Fraction(t * p - 1, t * p)}
    if 128 % n == 0:  # FSDP shards every dim 0 (128 rows) evenly
        expected["full_gather"] = Fraction(n - 1, n)
    for scheme, fraction in expected.items():
        assert b[scheme].max == b[scheme].min == m * fraction, scheme
    assert b["hybridflow"].peak_param_bytes == m // (t_g * p_g)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(LAYOUTS))
def test_exact_formula_with_embedding_and_lm_head(layout):
    """Stages differ in size (embedding first, lm_head last): received = own generation block / t_g - own stage / t."""
    t, p, d, t_g, p_g = layout
    b = _plan_bytes(EVEN_ENDS, t, p, d, t_g, p_g)
    groups = hybrid_groups(TrainLayout(dp=d, tp=t, pp=p), InferLayout(tp=t_g, pp=p_g).resolve(t * p * d))
    layer_bytes = sum(x.numel for x in EVEN_ENDS.tensors if x.layer == 0) * 2
    end_bytes = 256 * 128 * 2
    bounds = stage_bounds(64, p)
    stage_bytes = [(bounds[s + 1] - bounds[s]) * layer_bytes for s in range(p)]
    stage_bytes[0] += end_bytes
    stage_bytes[-1] += end_bytes
    k_p = p // p_g
    for rank in range(0, t * p * d, max(1, t * p * d // 16)):
        info = groups.rank_info(rank)
        block = sum(stage_bytes[info.gen_pp * k_p : (info.gen_pp + 1) * k_p])
        assert b["hybridflow"].received[rank] == block // t_g - stage_bytes[info.stage] // t


# ---------------------------------------------------------------------------------------------------------------------
# brute force: boolean masks per tensor element
# ---------------------------------------------------------------------------------------------------------------------


def _range_mask(length, ranges):
    mask = np.zeros(length, dtype=bool)
    for lo, hi in ranges:
        mask[lo:hi] = True
    return mask


def _balanced(units, parts, rank):
    if units < parts:
        unit = rank * units // parts
        return unit, unit + 1
    return rank * units // parts, (rank + 1) * units // parts


def _tp_mask(tensor, parts_count, rank):
    """Mask over the whole tensor of what TP rank `rank` of `parts_count` holds (all experts)."""
    shape = tensor.shape
    full = np.ones(shape, dtype=bool)
    if tensor.tp_dim is None:
        return full
    ranges, offset = [], 0
    for units, size in tensor.tp_parts:
        lo, hi = _balanced(units, parts_count, rank)
        ranges.append((offset + lo * size, offset + hi * size))
        offset += units * size
    along = _range_mask(shape[tensor.tp_dim], ranges)
    view = [1] * len(shape)
    view[tensor.tp_dim] = shape[tensor.tp_dim]
    return full & along.reshape(view)


def _ep_mask(tensor, ep, rank):
    if tensor.ep_dim is None:
        return np.ones(tensor.shape, dtype=bool)
    lo, hi = _balanced(tensor.shape[0], ep, rank)
    return _range_mask(tensor.shape[0], [(lo, hi)]).reshape([-1] + [1] * (len(tensor.shape) - 1)) & np.ones(
        tensor.shape, dtype=bool
    )


def _stage_keys(spec, stages):
    """{stage: {key: tensor}} with the same placement rules, written out independently."""
    layers = spec.arch.num_hidden_layers
    out = {s: {} for s in range(stages)}
    for x in spec.tensors:
        if x.layer is not None:
            stage = next(s for s in range(stages) if s * layers // stages <= x.layer < (s + 1) * layers // stages)
            out[stage][x.name] = x
        elif x.tied_to is not None:
            if stages > 1:
                out[stages - 1][x.tied_to] = x
        elif "embed" in x.name:
            out[0][x.name] = x
        else:
            out[stages - 1][x.name] = x
    return out


def _brute_hybridflow(spec, t, p, d, t_g, p_g, ep=1, ep_g=1):
    groups = hybrid_groups(
        TrainLayout(dp=d, tp=t, pp=p, ep=ep), InferLayout(tp=t_g, pp=p_g, ep=ep_g).resolve(t * p * d)
    )
    placed = _stage_keys(spec, p)
    k_p, k_e = p // p_g, ep // ep_g
    received = []
    for rank in range(t * p * d):
        info = groups.rank_info(rank)
        own = {key: _tp_mask(x, t, info.tp) & _ep_mask(x, ep, info.ep) for key, x in placed[info.stage].items()}
        need = {}
        for s in range(info.gen_pp * k_p, (info.gen_pp + 1) * k_p):
            for key, x in placed[s].items():
                need[key] = _tp_mask(x, t_g, info.gen_tp) & _ep_mask(x, ep_g, info.ep // k_e)
        received.append(sum(int((mask & ~own.get(key, False)).sum()) for key, mask in need.items()) * 2)
    return received


def _brute_tp_group(spec, t, p, d, ep=1):
    groups = hybrid_groups(TrainLayout(dp=d, tp=t, pp=p, ep=ep), InferLayout(tp=1).resolve(t * p * d))
    placed = _stage_keys(spec, p)
    total = sum(x.numel for x in spec.tensors if x.tied_to is None)
    out = []
    for rank in range(t * p * d):
        info = groups.rank_info(rank)
        held = sum(int((_tp_mask(x, t, info.tp) & _ep_mask(x, ep, info.ep)).sum()) for x in placed[info.stage].values())
        out.append((total - held) * 2)
    return out


def _brute_fsdp(spec, world, t_g):
    """(full_gather, fsdp_to_tp) received per rank from FSDP2 Shard(0) shards."""
    k_t = world // t_g
    full, to_tp = [], []
    for rank in range(world):
        f = g = 0
        for x in spec.tensors:
            if x.tied_to is not None:
                continue
            start, stop = (int(v[0]) for v in fsdp_chunk(x.shape[0], world, np.array([rank])))
            own = _range_mask(x.shape[0], [(start, stop)]).reshape([-1] + [1] * (len(x.shape) - 1)) & np.ones(
                x.shape, dtype=bool
            )
            f += int((~own).sum())
            g += int((_tp_mask(x, t_g, rank // k_t) & ~own).sum())
        full.append(f * 2)
        to_tp.append(g * 2)
    return full, to_tp


TINY = build_spec("tiny")  # qwen2: 4 heads, 2 kv heads, tied embeddings, biases
ODD = build_spec(
    arch_from_config(
        {
            "model_type": "llama",
            "hidden_size": 48,
            "intermediate_size": 100,
            "num_hidden_layers": 3,
            "num_attention_heads": 6,
            "num_key_value_heads": 2,
            "vocab_size": 101,
        },
        "odd",
    )
)
MOE = build_spec(
    arch_from_config(
        {
            "model_type": "qwen3_moe",
            "hidden_size": 32,
            "intermediate_size": 64,
            "moe_intermediate_size": 16,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "vocab_size": 64,
        },
        "moe",
    )
)
MLA = build_spec(
    arch_from_config(
        {
            "model_type": "deepseek_v3",
            "hidden_size": 32,
            "intermediate_size": 64,
            "moe_intermediate_size": 16,
            "num_hidden_layers": 3,
            "first_k_dense_replace": 1,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "n_routed_experts": 4,
            "n_shared_experts": 1,
            "num_experts_per_tok": 2,
            "q_lora_rank": 16,
            "kv_lora_rank": 8,
            "qk_rope_head_dim": 4,
            "qk_nope_head_dim": 8,
            "v_head_dim": 8,
            "vocab_size": 64,
        },
        "mla",
    )
)

CASES = [
    (TINY, 4, 2, 1, 2, 1, 1, 1),  # tp 4 > 2 kv heads: replicated kv heads in training
    (TINY, 2, 2, 2, 1, 1, 1, 1),  # tied lm_head copy on the last stage, merged to one generation stage
    (TINY, 2, 2, 1, 2, 2, 1, 1),
    (ODD, 4, 3, 1, 2, 1, 1, 1),  # 6 heads over tp 4, ffn 100, vocab 101: uneven splits
    (ODD, 4, 1, 2, 4, 1, 1, 1),
    (MOE, 2, 2, 4, 1, 1, 4, 2),  # experts: ep 4 -> 2, second gather
    (MOE, 2, 1, 4, 2, 1, 2, 1),
    (MLA, 2, 3, 2, 1, 1, 2, 2),  # MLA + shared experts + first dense layer
]


@pytest.mark.parametrize("spec,t,p,d,t_g,p_g,ep,ep_g", CASES, ids=[f"{c[0].arch.name}-{c[1:]}" for c in CASES])
def test_hybridflow_matches_brute_force(spec, t, p, d, t_g, p_g, ep, ep_g):
    groups = hybrid_groups(
        TrainLayout(dp=d, tp=t, pp=p, ep=ep), InferLayout(tp=t_g, pp=p_g, ep=ep_g).resolve(t * p * d)
    )
    b = compute_bytes(spec, groups, CLUSTER, 2, ["hybridflow"])["hybridflow"]
    assert b.received.tolist() == _brute_hybridflow(spec, t, p, d, t_g, p_g, ep, ep_g)


@pytest.mark.parametrize("spec,t,p,d,ep", [(TINY, 4, 2, 1, 1), (ODD, 4, 3, 1, 1), (MOE, 2, 2, 2, 2), (MLA, 2, 3, 2, 2)])
def test_tp_group_gather_matches_brute_force(spec, t, p, d, ep):
    groups = hybrid_groups(TrainLayout(dp=d, tp=t, pp=p, ep=ep), InferLayout(tp=1).resolve(t * p * d))
    b = compute_bytes(spec, groups, CLUSTER, 2, ["tp_group_gather"])["tp_group_gather"]
    assert b.received.tolist() == _brute_tp_group(spec, t, p, d, ep)


@pytest.mark.parametrize("spec,world,t_g", [(TINY, 8, 2), (TINY, 8, 8), (ODD, 12, 4), (ODD, 7, 1), (MOE, 4, 2)])
def test_fsdp_schemes_match_brute_force(spec, world, t_g):
    groups = hybrid_groups(TrainLayout(dp=world, order=FSDP_ORDER), InferLayout(tp=t_g).resolve(world))
    b = compute_bytes(spec, groups, CLUSTER, 2)
    full, to_tp = _brute_fsdp(spec, world, t_g)
    assert b["full_gather"].received.tolist() == full
    assert b["fsdp_to_tp"].received.tolist() == to_tp


def test_replicated_tensors_are_not_received_twice():
    """Norms are replicated over TP: a TP-only reshard (p = 1) never moves them."""
    b = _plan_bytes(TINY, 2, 1, 1, 1, 1)["hybridflow"]
    split = sum(x.numel for x in TINY.tensors if x.partition != "replicated" and x.tied_to is None)
    assert b.max == b.min == split // 2 * 2  # half of every split tensor, 2 bytes each


def test_fsdp_column_all_gather_equals_union_of_consecutive_shards():
    """Column-parallel tensors whose rows divide N: each rank receives (N/t_g - 1)/N of them."""
    even = _even_spec(with_ends=True)
    groups = hybrid_groups(TrainLayout(dp=16, order=FSDP_ORDER), InferLayout(tp=4).resolve(16))
    b = compute_bytes(even, groups, CLUSTER, 2)["fsdp_to_tp"]
    column = sum(x.numel for x in even.tensors if x.tp_dim == 0) * 2
    row = sum(x.numel for x in even.tensors if x.tp_dim == 1) * 2
    gather, all_to_all = b.phases
    assert gather.max_bytes == column * 3 // 16
    assert all_to_all.max_bytes == row // 4 - row // 4 // 16  # its columns of every row but its own rows
    assert b.min == b.max == gather.max_bytes + all_to_all.max_bytes


def test_time_uses_the_link_the_groups_span():
    cluster = ClusterSpec(nnodes=4, gpus_per_node=8, nvlink_GBps=400, network_GBps=40)
    b = _plan_bytes(EVEN, 8, 4, 1, 4, 1, cluster=cluster)
    (phase,) = b["hybridflow"].phases
    assert phase.link == "network"  # micro-DP groups take one TP pair from every stage = every node
    assert phase.seconds == pytest.approx(b["hybridflow"].max / 40e9)
    tp_phase, pp_phase = b["tp_group_gather"].phases
    assert (tp_phase.link, pp_phase.link) == ("nvlink", "network")
    assert b["tp_group_gather"].time_s == pytest.approx(tp_phase.max_bytes / 400e9 + pp_phase.max_bytes / 40e9)


def test_deepseek_v3_on_4096_gpus_without_per_rank_work_and_sane(planner_work):
    """No per-rank Python calls and one slice table per distinct tensor signature over 4096 ranks (the planner's
    wall-clock figures are ``scripts/bench_plan.py``'s)."""
    spec = build_spec("deepseek_v3", "analytic")
    groups = hybrid_groups(TrainLayout(tp=8, pp=16, ep=32).resolve(4096), InferLayout(tp=8, pp=2, ep=16).resolve(4096))
    b = compute_bytes(spec, groups, ClusterSpec(nnodes=512), 2)
    assert planner_work.per_rank_calls() == 0 and planner_work.calls["rank_of"] <= 8
    assert planner_work.slice_tables() <= planner_work.distinct_signatures(spec)
    assert b["full_gather"].max < b["full_gather"].model_bytes
    assert b["hybridflow"].max < b["tp_group_gather"].min / 100
    assert len(b["hybridflow"].received) == 4096


@pytest.mark.parametrize("spec,t,p,d,t_g,p_g,ep,ep_g", CASES, ids=[f"{c[0].arch.name}-{c[1:]}" for c in CASES])
def test_received_by_tensor_sums_to_the_rank_total(spec, t, p, d, t_g, p_g, ep, ep_g):
    groups = hybrid_groups(
        TrainLayout(dp=d, tp=t, pp=p, ep=ep), InferLayout(tp=t_g, pp=p_g, ep=ep_g).resolve(t * p * d)
    )
    totals = compute_bytes(spec, groups, CLUSTER, 2)
    for scheme, result in totals.items():
        for rank in range(t * p * d):
            per_tensor = received_by_tensor(spec, groups, rank, scheme, 2)
            assert sum(per_tensor.values()) == result.received[rank], (scheme, rank)


@pytest.mark.parametrize("spec,world,t_g", [(TINY, 8, 2), (ODD, 12, 4)])
def test_received_by_tensor_fsdp(spec, world, t_g):
    groups = hybrid_groups(TrainLayout(dp=world, order=FSDP_ORDER), InferLayout(tp=t_g).resolve(world))
    totals = compute_bytes(spec, groups, CLUSTER, 2)
    for scheme, result in totals.items():
        for rank in range(world):
            assert sum(received_by_tensor(spec, groups, rank, scheme, 2).values()) == result.received[rank]


def test_received_by_tensor_names_the_tensors():
    groups = hybrid_groups(TrainLayout(dp=1, tp=4, pp=1), InferLayout(tp=2).resolve(4))
    per_tensor = received_by_tensor(TINY, groups, 0, "hybridflow", 2)
    assert per_tensor["model.layers.0.input_layernorm.weight"] == 0  # replicated: already held
    assert per_tensor["model.layers.0.self_attn.q_proj.weight"] == 16 * 64 * 2  # one more head of 16 rows
    # tp 4 > 2 kv heads: rank 0 holds kv head 0 in training and keeps just head 0 at tp 2
    assert per_tensor["model.layers.0.self_attn.k_proj.weight"] == 0
    assert per_tensor["model.embed_tokens.weight"] == 128 * 64 * 2


# ---------------------------------------------------------------------------------------------------------------------
# layouts the HybridFlow scheme cannot take (generation TP above training TP, ...): verl's placement and sync
# ---------------------------------------------------------------------------------------------------------------------

DIFF_TP = [
    (TINY, 2, 2, 2, 4, 1, 1, 1),  # verl's Megatron diff-TP example, shrunk: train tp2 pp2 -> generate tp4
    (ODD, 1, 3, 4, 2, 1, 1, 1),  # tp=1 Megatron (whole layers per rank) -> tp2: 6 heads, ffn 100, vocab 101
    (ODD, 2, 1, 3, 3, 1, 1, 1),  # tp3 over 6 heads from tp2: neither divides the other
    (TINY, 2, 2, 2, 1, 4, 1, 1),  # infer.pp 4 does not divide train.pp 2
    (MOE, 2, 1, 4, 4, 1, 2, 4),  # generation tp and ep above training's
    (MLA, 2, 3, 2, 4, 1, 2, 1),
]


def _brute_generation_peak(spec, world, t_g, p_g, ep_g):
    """Largest generation shard (bytes) over the ranks of verl's placement: tau = rank % t_g, pi = rank // t_g % p_g,
    experts of the fullest generation EP rank, written out with masks."""
    placed = _stage_keys(spec, p_g)
    best = 0
    for rank in range(world):
        tau, pi = rank % t_g, rank // t_g % p_g
        for e in range(ep_g):
            need = sum(int((_tp_mask(x, t_g, tau) & _ep_mask(x, ep_g, e)).sum()) for x in placed[pi].values())
            best = max(best, need * 2)
    return best


@pytest.mark.parametrize("spec,t,p,d,t_g,p_g,ep,ep_g", DIFF_TP, ids=[f"{c[0].arch.name}-{c[1:]}" for c in DIFF_TP])
def test_verl_placement_bytes_match_brute_force(spec, t, p, d, t_g, p_g, ep, ep_g):
    world = t * p * d
    train, infer = TrainLayout(dp=d, tp=t, pp=p, ep=ep), InferLayout(tp=t_g, pp=p_g, ep=ep_g).resolve(world)
    with pytest.raises(LayoutError):
        hybrid_groups(train, infer)  # the resharder's placement refuses it
    groups = hybrid_groups(train, infer, placement="auto")
    assert groups.placement == "verl"
    b = compute_bytes(spec, groups, CLUSTER, 2)
    assert set(b) == {"tp_group_gather", "full_gather"}
    # verl's sync: every rank receives the whole model less its training shard, whatever the generation layout
    assert b["tp_group_gather"].received.tolist() == _brute_tp_group(spec, t, p, d, ep)
    full, _ = _brute_fsdp(spec, world, 1)
    assert b["full_gather"].received.tolist() == full
    assert generation_shard_peak(spec, groups, 2) == _brute_generation_peak(spec, world, t_g, p_g, ep_g)
    for rank in range(world):
        per_tensor = received_by_tensor(spec, groups, rank, "tp_group_gather", 2)
        assert sum(per_tensor.values()) == b["tp_group_gather"].received[rank]
    with pytest.raises(ValueError, match="HybridFlow's placement"):
        compute_bytes(spec, groups, CLUSTER, 2, ["hybridflow"])


@pytest.mark.parametrize("spec,t,p,d,t_g,p_g,ep,ep_g", CASES, ids=[f"{c[0].arch.name}-{c[1:]}" for c in CASES])
def test_generation_shard_peak_is_hybridflows_peak(spec, t, p, d, t_g, p_g, ep, ep_g):
    groups = hybrid_groups(
        TrainLayout(dp=d, tp=t, pp=p, ep=ep), InferLayout(tp=t_g, pp=p_g, ep=ep_g).resolve(t * p * d)
    )
    b = compute_bytes(spec, groups, CLUSTER, 2, ["hybridflow"])["hybridflow"]
    assert generation_shard_peak(spec, groups, 2) == b.peak_param_bytes
