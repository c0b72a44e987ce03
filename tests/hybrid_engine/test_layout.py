"""Layouts checked on CPU without building a mesh (like torchtitan's test_parallel_dims.py)."""

from dataclasses import replace

import pytest

from hybrid_engine.layout import (
    FSDP_ORDER,
    InferLayout,
    LayoutError,
    TrainLayout,
    check_compatible,
    collect_layout_errors,
    hybridflow_problems,
)

DESC = "cluster.nnodes 2 * cluster.gpus_per_node 8"


def test_error_shows_the_arithmetic():
    with pytest.raises(LayoutError) as info:
        TrainLayout(dp=1, tp=8, pp=4).resolve(16, world_desc=DESC)
    assert str(info.value) == (
        "layout.train: dp(1)*tp(8)*pp(4)*cp(1)=32 != world_size 16 (cluster.nnodes 2 * cluster.gpus_per_node 8)"
    )
    assert isinstance(info.value, ValueError)


def test_leftover_dp_is_filled():
    layout = TrainLayout(tp=2, pp=2, cp=2).resolve(32)
    assert layout.dp == 4 and layout.world_size == 32
    assert InferLayout(tp=4).resolve(32).dp == 8
    assert TrainLayout(dp=-1, tp=8).resolve(8).dp == 1


def test_leftover_dp_not_divisible():
    with pytest.raises(LayoutError, match=r"dp=-1 needs tp\(3\)\*pp\(1\)\*cp\(1\)=3 to divide world_size 16"):
        TrainLayout(tp=3).resolve(16)


def test_unresolved_world_size_raises():
    with pytest.raises(LayoutError, match="not resolved"):
        _ = TrainLayout(tp=2).world_size


@pytest.mark.parametrize("field", ["tp", "pp", "cp", "ep"])
def test_non_positive_degrees(field):
    with pytest.raises(LayoutError, match=rf"layout.train.{field}: must be a positive integer, got 0"):
        TrainLayout(**{field: 0})


def test_bad_order():
    with pytest.raises(LayoutError, match="order"):
        TrainLayout(tp=2, order="tp-dp")


def test_world_size_leaves_ep_inside_dp_cp():
    layout = TrainLayout(dp=2, tp=4, pp=1, cp=2, ep=2)
    assert layout.world_size == 16


def test_megatron_rank_order():
    layout = TrainLayout(dp=1, tp=8, pp=4)
    for rank in range(32):
        coords = layout.coords(rank)
        assert rank == 8 * coords["pp"] + coords["tp"]
        assert layout.rank_of(tp=coords["tp"], pp=coords["pp"]) == rank
    assert layout.coords(17) == {"tp": 1, "cp": 0, "ep": 0, "edp": 0, "dp": 0, "pp": 2}


def test_megatron_order_with_cp_and_dp():
    layout = TrainLayout(dp=2, tp=2, pp=2, cp=2)
    # tp fastest, then cp, dp, pp
    assert layout.rank_of(tp=1, cp=1, dp=1, pp=1) == 1 + 2 * 1 + 4 * 1 + 8 * 1
    assert layout.coords(6) == {"tp": 0, "cp": 1, "ep": 0, "edp": 3, "dp": 1, "pp": 0}


def test_expert_coordinates():
    layout = TrainLayout(dp=4, tp=2, pp=1, ep=2)
    # data index = dp_i; ep fastest inside it
    assert [layout.coords(r)["ep"] for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert [layout.coords(r)["edp"] for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_fsdp_order_puts_ulysses_fastest():
    layout = TrainLayout(dp=4, cp=2, order=FSDP_ORDER)
    assert [layout.coords(r)["cp"] for r in range(4)] == [0, 1, 0, 1]
    assert layout.rank_of(dp=3, cp=1) == 7


def test_infer_coords():
    layout = InferLayout(tp=4, pp=2, dp=2)
    assert layout.coords(13) == {"tp": 1, "pp": 1, "dp": 1}
    assert layout.rank_of(tp=1, pp=1, dp=1) == 13
    assert layout.engine_size == 8


def test_rank_out_of_range():
    with pytest.raises(LayoutError, match=r"rank 32 outside \[0, 32\)"):
        TrainLayout(dp=1, tp=8, pp=4).coords(32)


def test_compatible_hybridflow():
    train = TrainLayout(dp=1, tp=8, pp=4)
    assert check_compatible(train, InferLayout(tp=4, pp=1, dp=8)) == []
    assert check_compatible(train, InferLayout(tp=2, pp=2, dp=8)) == []


def test_incompatible_tp_pp_ep_world():
    train = TrainLayout(dp=2, tp=4, pp=2, ep=2)
    infer = InferLayout(tp=3, pp=4, dp=1, ep=3)
    # what verl cannot run: generation on other GPUs than training
    assert check_compatible(train, infer) == [
        "layout.infer: tp(3)*pp(4)*dp(1)=12 != layout.train world dp(2)*tp(4)*pp(2)*cp(1)=16"
        " (generation runs on the training GPUs)",
    ]
    # what the pack's resharder cannot take (verl's own weight sync still runs such a pair)
    assert hybridflow_problems(train, infer) == [
        "layout.infer.tp: infer.tp(3) must divide layout.train.tp(4) (4 % 3 = 1)",
        "layout.infer.pp: infer.pp(4) must divide layout.train.pp(2) (2 % 4 = 2)",
        "layout.infer.ep: infer.ep(3) must divide layout.train.ep(2) (2 % 3 = 2)",
    ]


def test_generation_tp_above_training_tp_is_what_verl_runs():
    """verl's Megatron diff-TP example: train tp2 pp2 on 8 GPUs, generate with tp4 (verl 0.9.1 only needs the
    engines to divide the world); the pack's resharder needs infer.tp | train.tp, so it is not the sync path."""
    train = TrainLayout(tp=2, pp=2).resolve(8)
    infer = InferLayout(tp=4).resolve(8)
    assert check_compatible(train, infer) == []
    assert hybridflow_problems(train, infer) == [
        "layout.infer.tp: infer.tp(4) must divide layout.train.tp(2) (2 % 4 = 2)"
    ]
    assert collect_layout_errors({"tp": 2, "pp": 2}, {"tp": 4}, 8, DESC)[2] == []


def test_an_engine_larger_than_a_node_takes_whole_nodes():
    train = TrainLayout(tp=4).resolve(24)
    assert check_compatible(train, InferLayout(tp=12).resolve(24), gpus_per_node=8) == [
        "layout.infer: an engine of tp(12)*pp(1)=12 GPUs spans nodes of 8 GPUs and must take whole nodes"
        " (12 % 8 = 4)"
    ]
    assert check_compatible(train, InferLayout(tp=12).resolve(24), gpus_per_node=12) == []
    assert check_compatible(TrainLayout(tp=8).resolve(32), InferLayout(tp=16).resolve(32), gpus_per_node=8) == []


def test_fsdp_training_reshards_to_any_dividing_tp():
    train = TrainLayout(dp=8, order=FSDP_ORDER)
    assert check_compatible(train, InferLayout(tp=4, dp=2)) == []


def test_collect_never_raises_and_collects_everything():
    train, infer, problems = collect_layout_errors({"dp": 1, "tp": 8, "pp": 4}, {"tp": 3}, 16, DESC)
    assert train is None and infer is None
    assert problems == [
        "layout.train: dp(1)*tp(8)*pp(4)*cp(1)=32 != world_size 16 (cluster.nnodes 2 * cluster.gpus_per_node 8)",
        "layout.infer: dp=-1 needs tp(3)*pp(1)=3 to divide world_size 16"
        " (cluster.nnodes 2 * cluster.gpus_per_node 8) (remainder 1)",
    ]


def test_collect_bad_values():
    train, infer, problems = collect_layout_errors({"tp": 0, "dp": "x", "foo": 1}, None, 8, None)
    assert train is None and infer is not None and infer.dp == 8
    assert problems == [
        "layout.train: unknown keys ['foo']; allowed: ['dp', 'tp', 'pp', 'cp', 'ep', 'etp', 'order']",
        "layout.train.dp: must be an integer, got 'x'",
        "layout.train.tp: must be a positive integer, got 0",
    ]


def test_collect_ep_against_resolved_dp():
    _, _, problems = collect_layout_errors({"tp": 8, "pp": 4, "ep": 3}, {"tp": 4}, 64, None)
    assert problems[0] == (
        "layout.train.ep: ep(3) must divide dp(2)*cp(1)=2 (experts are sharded over the data-parallel ranks of a stage)"
    )


def test_collect_good():
    train, infer, problems = collect_layout_errors({"tp": 8, "pp": 4}, {"tp": 4, "dp": -1}, 32, DESC)
    assert problems == []
    assert train == TrainLayout(dp=1, tp=8, pp=4) and infer == InferLayout(tp=4, pp=1, dp=8)


def test_moe_parallel_folding_lets_experts_span_tensor_ranks():
    # Moonlight on 24 GPUs as verl's example runs it: tp4 pp3 ep4 etp1 -> dp2; ep(4) > dp*cp(2), but 4*1 | 2*1*4
    _, _, folded = collect_layout_errors({"tp": 4, "pp": 3, "ep": 4, "etp": 1}, {"tp": 4}, 24, None)
    assert folded == []
    _, _, default = collect_layout_errors({"tp": 4, "pp": 3, "ep": 4}, {"tp": 4}, 24, None)  # etp = tp
    assert default == ["layout.train.ep: ep(4) must divide dp(2)*cp(1)=2 "
                       "(experts are sharded over the data-parallel ranks of a stage)"]
    _, _, too_wide = collect_layout_errors({"tp": 4, "pp": 3, "ep": 4, "etp": 3}, {"tp": 4}, 24, None)
    assert too_wide == ["layout.train.ep: ep(4)*etp(3)=12 must divide dp(2)*cp(1)*tp(4)=8 "
                        "(Megatron's expert layers tile the ranks of a stage)"]
    with pytest.raises(LayoutError, match=r"layout.train.etp: must be a positive integer or null \(= tp\), got 0"):
        TrainLayout(tp=4, etp=0)


def test_folded_experts_leave_the_weight_sync_to_verl():
    train = TrainLayout(dp=2, tp=4, pp=3, ep=4, etp=1)
    assert hybridflow_problems(train, InferLayout(tp=4, dp=6)) == [
        "layout.train.etp: experts split over etp(1) != tp(4) tensor ranks (MoE parallel folding); "
        "the resharder maps experts over data-parallel ranks only"]
    assert hybridflow_problems(replace(train, ep=2, etp=4), InferLayout(tp=4, dp=6)) == []
