"""HybridFlow groups: the paper's test vectors and properties over every divisor layout up to 64 ranks."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybrid_engine.groups import hybrid_groups
from hybrid_engine.layout import FSDP_ORDER, InferLayout, LayoutError, TrainLayout


def _layouts(max_world=64):
    for t, p, d in itertools.product(range(1, max_world + 1), repeat=3):
        if t * p * d > max_world or (t == 1 and p == 1):
            continue
        for t_g in (x for x in range(1, t + 1) if t % x == 0):
            for p_g in (x for x in range(1, p + 1) if p % x == 0):
                yield t, p, d, t_g, p_g


ALL_LAYOUTS = list(_layouts())


def _groups(t, p, d, t_g, p_g, **train):
    world = t * p * d
    return hybrid_groups(TrainLayout(dp=d, tp=t, pp=p, **train), InferLayout(tp=t_g, pp=p_g).resolve(world))


def _engine_of(g, rank):
    """The ranks of ``rank``'s generation engine, read from the per-rank ``engine`` array the planner reads."""
    engines = g.arrays["engine"]
    return [int(r) for r in (engines == engines[rank]).nonzero()[0]]


def _group_of(g, kind, rank):
    """``rank``'s group of ``kind`` as the planner reads it (the group matrix), members in generation rank order."""
    (row,) = [row for row in g._group_matrix(kind).tolist() if rank in row]
    return row


def test_paper_vector_t8_p4_to_t4():
    g = _groups(8, 4, 1, 4, 1)
    assert g.groups("micro_dp") == [
        [0, 1, 8, 9, 16, 17, 24, 25],
        [2, 3, 10, 11, 18, 19, 26, 27],
        [4, 5, 12, 13, 20, 21, 28, 29],
        [6, 7, 14, 15, 22, 23, 30, 31],
    ]
    assert (g.k_t, g.k_p, g.d_g) == (2, 4, 8)
    assert _group_of(g, "gen_tp", 9) == [9, 11, 13, 15]
    info = g.rank_info(9)  # rank 9 = 8*p_i + t_i with p_i = 1, t_i = 1
    assert (info.stage, info.tp, info.gen_tp, info.gen_pp, info.micro_dp) == (1, 1, 0, 0, 3)
    assert info.generation_shard == tuple((s, k) for s in range(4) for k in (0, 1))


def test_paper_vector_t4_to_t2_on_4_ranks():
    g = _groups(4, 1, 1, 2, 1)
    assert g.groups("micro_dp") == [[0, 1], [2, 3]]
    assert g.groups("gen_tp") == [[0, 2], [1, 3]]
    assert [g.rank_info(r).gen_tp for r in range(4)] == [0, 0, 1, 1]
    assert [g.rank_info(r).micro_dp for r in range(4)] == [0, 1, 0, 1]


def test_pipeline_merge_groups():
    g = _groups(2, 4, 1, 2, 2)  # k_p = 2: stages {0,1} and {2,3} merge
    assert g.groups("micro_dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert _group_of(g, "gen_pp", 0) == [0, 4]
    assert _engine_of(g, 0) == [0, 1, 4, 5]


def test_cp_folds_into_data():
    g = hybrid_groups(TrainLayout(dp=2, tp=2, pp=1, cp=2), InferLayout(tp=1).resolve(8))
    assert g.d == 4 and g.d_g == 2
    # ranks 0,1 are tp 0,1 of (cp 0, dp 0): one micro-DP group
    assert g.micro_dp_group(0) == [0, 1] and g.micro_dp_group(2) == [2, 3]
    assert g.rank_info(6).data == 3


def test_fsdp_groups_are_consecutive_shards():
    g = hybrid_groups(TrainLayout(dp=8, order=FSDP_ORDER), InferLayout(tp=2).resolve(8))
    assert g.fsdp and (g.t, g.k_t) == (8, 4)
    assert g.groups("micro_dp") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert g.groups("gen_tp") == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_expert_gather_group():
    train = TrainLayout(dp=4, tp=2, pp=1, ep=4)
    g = hybrid_groups(train, InferLayout(tp=2, ep=2).resolve(8))
    assert g.k_e == 2
    # rank 0: tp 0, data 0 (ep 0); partner has ep 1 = data 1 -> rank 2
    assert g.expert_gather_group(0) == [0, 2] and g.expert_gather_group(4) == [4, 6]


def test_incompatible_raises_with_every_problem():
    with pytest.raises(LayoutError) as info:
        hybrid_groups(TrainLayout(dp=1, tp=4, pp=2), InferLayout(tp=3, pp=4, dp=1))
    assert len(info.value.problems) == 3


def test_spans_nodes():
    g = _groups(8, 4, 1, 4, 1)
    assert g.spans_nodes("micro_dp", 8) == 4
    assert g.spans_nodes("gen_tp", 8) == 0
    assert g.spans_nodes("micro_dp", 32) == 0


def test_counts_and_truncated_dict():
    g = _groups(8, 16, 32, 8, 2)
    d = g.to_dict(limit=3)
    assert d["counts"] == {"micro_dp": 512, "gen_tp": 512, "gen_pp": 2048, "engines": 256}
    assert len(d["micro_dp"]) == 3 and d["truncated"]


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(ALL_LAYOUTS))
def test_groups_partition_and_shards_nest(layout):
    t, p, d, t_g, p_g = layout
    g = _groups(t, p, d, t_g, p_g)
    world = t * p * d
    for kind, size in (("micro_dp", g.d_g), ("gen_tp", t_g), ("gen_pp", p_g)):
        groups = g.groups(kind)
        flat = [r for grp in groups for r in grp]
        assert sorted(flat) == list(range(world)), kind
        assert all(len(grp) == size for grp in groups)
    infos = [g.rank_info(rank) for rank in range(world)]
    arrays = g.arrays
    for rank, info in enumerate(infos):
        # the rank's training shard lies inside its generation shard
        assert (info.stage, info.tp) in info.generation_shard
        # the generation shard is exactly the micro-DP group's training shards
        members = g.micro_dp_group(rank)
        assert sorted((infos[m].stage, infos[m].tp) for m in members) == sorted(info.generation_shard)
        assert members[info.micro_dp] == rank
        assert _group_of(g, "gen_tp", rank)[info.gen_tp] == rank
        assert _group_of(g, "gen_pp", rank)[info.gen_pp] == rank
        assert arrays["gen_tp"][rank] == info.gen_tp and arrays["micro_dp"][rank] == info.micro_dp
    # a generation TP group shares micro-DP rank, stage and data index, and covers every generation TP rank once
    for grp in g.groups("gen_tp"):
        assert sorted(infos[r].gen_tp for r in grp) == list(range(t_g))
        assert len({(infos[r].micro_dp, infos[r].stage, infos[r].data) for r in grp}) == 1
    # an engine has t_g * p_g ranks, one per (gen_pp, gen_tp)
    engine = _engine_of(g, 0)
    assert sorted((infos[r].gen_pp, infos[r].gen_tp) for r in engine) == [
        (a, b) for a in range(p_g) for b in range(t_g)
    ]


def test_layout_count():
    assert len(ALL_LAYOUTS) == 3588


def test_diff_tp_gets_verl_placement_only_when_asked():
    """verl's Megatron diff-TP example (train tp2 pp2, generate tp4 on 8 GPUs): no micro-DP groups exist; the
    resharder's placement refuses it, ``auto`` describes verl's run: engines on consecutive ranks."""
    train, infer = TrainLayout(tp=2, pp=2).resolve(8), InferLayout(tp=4).resolve(8)
    with pytest.raises(LayoutError, match=r"infer.tp\(4\) must divide layout.train.tp\(2\)"):
        hybrid_groups(train, infer)
    g = hybrid_groups(train, infer, placement="auto")
    assert g.placement == "verl" and not g.hybridflow
    assert (g.k_t, g.k_p, g.d_g, g.num_micro_dp_groups, g.num_engines) == (0, 0, 0, 0, 2)
    assert g.groups("gen_tp") == [[0, 1, 2, 3], [4, 5, 6, 7]] and g.groups("micro_dp") == []
    assert _group_of(g, "gen_tp", 6) == [4, 5, 6, 7] and _engine_of(g, 6) == [4, 5, 6, 7]
    a = g.arrays
    assert a["gen_tp"].tolist() == [0, 1, 2, 3, 0, 1, 2, 3] and a["engine"].tolist() == [0] * 4 + [1] * 4
    # Megatron order tp-cp-ep-dp-pp: ranks 0-3 are stage 0 (tp 0, 1 of dp 0 and 1), ranks 4-7 stage 1
    assert a["stage"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1] and a["tp"].tolist() == [0, 1, 0, 1, 0, 1, 0, 1]
    info = g.rank_info(6)
    assert (info.gen_tp, info.gen_pp, info.engine, info.micro_dp, info.generation_shard) == (2, 0, 1, -1, ())
    assert g.to_dict()["placement"] == "verl" and g.spans_nodes("micro_dp", 4) == 0
    with pytest.raises(LayoutError, match="no micro-DP groups"):
        g.micro_dp_group(0)


def test_verl_placement_with_generation_pipeline():
    g = hybrid_groups(TrainLayout(tp=2, pp=2).resolve(8), InferLayout(tp=2, pp=4).resolve(8), placement="auto")
    assert g.placement == "verl"  # infer.pp(4) does not divide train.pp(2)
    assert _group_of(g, "gen_pp", 3) == [1, 3, 5, 7] and g.groups("gen_pp") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert _engine_of(g, 5) == list(range(8))


def test_auto_keeps_hybridflow_where_it_applies():
    g = hybrid_groups(TrainLayout(tp=8, pp=4).resolve(32), InferLayout(tp=4).resolve(32), placement="auto")
    assert g.placement == "hybridflow" and g.d_g == 8


def test_auto_still_refuses_what_verl_cannot_run():
    with pytest.raises(LayoutError, match="generation runs on the training GPUs"):
        hybrid_groups(TrainLayout(dp=1, tp=4, pp=2), InferLayout(tp=3, pp=4, dp=1), placement="auto")
