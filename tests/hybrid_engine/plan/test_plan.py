"""The plan as the recipes use it: build_plan, its JSON, its text report, its picture, warnings and errors."""

import json

import pytest

from hybrid_engine.layout import InferLayout, LayoutError, TrainLayout
from hybrid_engine.model_spec import load_arch
from hybrid_engine.plan import ClusterSpec, PlanSettings, build_plan, plan_from_names

QWEN_32 = dict(
    model="qwen2_7b",
    train={"tp": 8, "pp": 4},
    infer={"tp": 4},
    cluster=ClusterSpec(nnodes=4, gpus_per_node=8),
    settings=PlanSettings(strategy="megatron"),
)


def _plan(model, train, infer, cluster, settings):
    return plan_from_names(model, train, infer, cluster=cluster, settings=settings)


def test_qwen2_7b_tp8pp4_to_tp4():
    plan = _plan(**QWEN_32)
    assert plan.errors == []
    assert (plan.train.dp, plan.infer.dp) == (1, 8)
    assert plan.groups.groups("micro_dp", 1) == [[0, 1, 8, 9, 16, 17, 24, 25]]
    assert plan.zero_redundancy_scheme == "hybridflow"
    assert set(plan.bytes) == {"hybridflow", "tp_group_gather", "full_gather"}
    m = plan.model_bytes
    assert m == 7_615_616_512 * 2
    # real shapes: tp 8 over 4 kv heads and 28 query heads is not even, so a little more than 7/32 M
    assert 7 / 32 * m < plan.bytes["hybridflow"].max < 0.23 * m
    assert plan.bytes["full_gather"].max == m * 31 // 32
    assert plan.fits and plan.headroom_bytes > 0


def test_warnings_name_their_keys():
    plan = _plan(**QWEN_32)
    text = "\n".join(plan.warnings)
    assert "layout.train.tp: tp(8) > num_key_value_heads(4)" in text
    assert "layout.train.tp: num_attention_heads(28) % tp(8) = 4" in text
    assert "groups: 4 of 4 micro-DP groups span nodes (size 8)" in text


def test_token_budget_warning():
    settings = PlanSettings(strategy="fsdp2", ppo_max_token_len_per_gpu=3000)
    plan = _plan("qwen2_5_0_5b", {"dp": -1}, {"tp": 1}, ClusterSpec(nnodes=1), settings)
    assert any(w.startswith("actor.ppo_max_token_len_per_gpu: 3000 < 2 * (") and "= 4096" in w for w in plan.warnings)


def test_does_not_fit_warning():
    plan = _plan("llama3_1_70b", {"dp": -1}, {"tp": 8}, ClusterSpec(nnodes=1), PlanSettings(strategy="fsdp2"))
    assert plan.fits is False
    assert any(w.startswith("memory: peak") and w.endswith("does not fit") for w in plan.warnings)


def test_errors_are_collected_not_raised():
    plan = _plan("qwen2_7b", {"dp": 1, "tp": 8, "pp": 4}, {"tp": 4}, ClusterSpec(nnodes=2), PlanSettings())
    assert plan.errors[0] == (
        "layout.train: dp(1)*tp(8)*pp(4)*cp(1)=32 != world_size 16 (cluster.nnodes 2 * cluster.gpus_per_node 8)"
    )
    assert "strategy fsdp2 shards with FSDP only" in plan.errors[1]
    assert plan.groups is None and plan.bytes == {} and plan.memory is None and plan.fits is None
    with pytest.raises(LayoutError):
        plan.raise_for_errors()
    assert "errors:" in plan.render_table()
    assert json.loads(json.dumps(plan.to_dict()))["errors"] == plan.errors


def test_incompatible_layouts_are_errors():
    settings = PlanSettings(strategy="megatron")
    plan = _plan("qwen2_7b", {"tp": 4, "pp": 2}, {"tp": 12}, ClusterSpec(nnodes=3), settings)
    assert plan.errors == [
        "layout.infer: an engine of tp(12)*pp(1)=12 GPUs spans nodes of 8 GPUs and must take whole nodes (12 % 8 = 4)"
    ]
    plan = _plan("qwen2_7b", {"tp": 4, "pp": 2}, {"tp": 12, "dp": 1}, ClusterSpec(nnodes=1), settings)
    assert plan.errors[0].startswith("layout.infer: tp(12)*pp(1)*dp(1)=12 != world_size 8")
    assert plan.groups is None and plan.bytes == {} and plan.sync_path is None


def test_generation_tp_above_training_tp_is_planned_as_verl_runs_it():
    """verl's Megatron diff-TP example (Qwen2.5-7B, train tp2 pp2, rollout tp4, 8 GPUs): verl's own sync path, the
    whole model on every GPU; the resharder's scheme is not offered."""
    plan = _plan("qwen2_5_7b", {"tp": 2, "pp": 2}, {"tp": 4}, ClusterSpec(nnodes=1), PlanSettings(strategy="megatron"))
    assert plan.errors == []
    assert plan.groups.placement == "verl" and plan.zero_redundancy_scheme is None
    assert set(plan.bytes) == {"tp_group_gather", "full_gather"}
    assert plan.sync_path["by"] == "verl" and plan.sync_path["scheme"] == "tp_group_gather"
    assert plan.sync_path["line"].endswith("infer.tp 4 does not divide train.tp 2")
    m = plan.model_bytes
    # every rank receives what its (stage, tp) shard lacks of the whole model, about 3/4 M (the stages differ a
    # little: the embedding sits on the first, norm and lm_head on the last); test_bytes counts it element by element
    assert 0.74 * m < plan.bytes["tp_group_gather"].min <= plan.bytes["tp_group_gather"].max <= m * 3 // 4 + 1
    # the rollout holds its generation shard: a quarter of every layer (tp 4), all layers (pp 1)
    assert plan.memory["rollout"]["weights"] == pytest.approx(m / 4, rel=0.01)
    assert plan.fits
    text = plan.render_table()
    assert "sync     verl's own (tp_group_gather" in text and "no micro-DP groups" in text
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["groups"]["placement"] == "verl" and data["sync_path"]["by"] == "verl"


def test_sync_path_names_the_resharder_where_it_applies():
    assert _plan(**QWEN_32).sync_path["scheme"] == "hybridflow"
    fsdp = _plan("qwen2_5_0_5b", {"dp": -1}, {"tp": 2}, ClusterSpec(nnodes=1), PlanSettings(strategy="fsdp2"))
    assert fsdp.sync_path == {
        "by": "hybrid_engine", "scheme": "fsdp_to_tp",
        "line": "the pack's resharder (fsdp_to_tp: FSDP Shard(0) over 8 ranks -> generation TP 2, zero redundancy)"}


def test_to_dict_schema():
    plan = _plan(**QWEN_32)
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["world_size"] == 32
    assert data["layouts"]["train"] == {"dp": 1, "tp": 8, "pp": 4, "cp": 1, "ep": 1, "order": "tp-cp-ep-dp-pp"}
    assert data["groups"]["counts"] == {"micro_dp": 4, "gen_tp": 8, "gen_pp": 32, "engines": 8}
    assert data["groups"]["micro_dp_groups_spanning_nodes"] == 4
    hybrid = data["bytes"]["hybridflow"]
    assert hybrid["table2_formula"] == "(d_g-1)/(t*p) * M"
    assert hybrid["per_gpu_received_bytes"]["max"] == plan.bytes["hybridflow"].max
    assert data["time_s"]["hybridflow"] == pytest.approx(plan.bytes["hybridflow"].max / 50e9)
    assert data["memory"]["peak_phase"] in ("generation", "training", "log_prob")
    assert data["fits"] is True and data["model"]["params"] == 7_615_616_512


def test_render_table_shows_fractions_and_groups():
    text = _plan(**QWEN_32).render_table()
    assert "micro-DP {0,1,8,9,16,17,24,25} {2,3,10,11,18,19,26,27}" in text
    assert "31/32 M" in text and "GiB" in text
    assert "memory per GPU (80.00 GiB)" in text


def test_hybridflow_bytes_from_real_shapes_llama_8b():
    """Every split divides (32 heads, 8 kv heads, tp 8), norms are replicated: received(stage s) =
    split/t_g + norms - (split_s/t + norms_s), the generation shard minus the rank's own shard."""
    settings = PlanSettings(strategy="megatron")
    plan = _plan("llama3_1_8b", {"tp": 8, "pp": 4}, {"tp": 4}, ClusterSpec(nnodes=4), settings)
    layer_split = 2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 14336 * 4096
    vocab = 128256 * 4096
    split, norms = 32 * layer_split + 2 * vocab, 32 * 2 * 4096 + 4096
    middle = 8 * layer_split, 8 * 2 * 4096  # stage 1: 8 layers, no embedding, no head
    expected = 2 * (split // 4 + norms - middle[0] // 8 - middle[1])
    received = plan.bytes["hybridflow"].received
    assert received[8] == received[15] == expected  # ranks 8..15 are stage 1
    assert plan.bytes["hybridflow"].max == expected


@pytest.mark.parametrize("suffix,magic", [("png", b"\x89PNG"), ("svg", b"<?xml")])
def test_draw_picture(tmp_path, suffix, magic):
    path = tmp_path / f"plan.{suffix}"
    _plan(**QWEN_32).draw_picture(path)
    assert path.read_bytes()[:5].startswith(magic)
    assert path.stat().st_size > 1000


def test_draw_picture_rejects_other_suffixes(tmp_path):
    with pytest.raises(ValueError, match=r"\.png or \.svg"):
        _plan(**QWEN_32).draw_picture(tmp_path / "plan.pdf")


def test_fsdp_plan_uses_fsdp_to_tp():
    settings = PlanSettings(strategy="fsdp2")
    plan = _plan("qwen2_5_7b", {"dp": -1}, {"tp": 2}, ClusterSpec(nnodes=1), settings)
    assert plan.errors == [] and plan.zero_redundancy_scheme == "fsdp_to_tp"
    assert set(plan.bytes) == {"fsdp_to_tp", "full_gather"}
    assert plan.bytes["fsdp_to_tp"].max < plan.bytes["full_gather"].max / 2
    assert plan.groups.groups("gen_tp", 1) == [[0, 4]]


def test_deepseek_v3_on_4096_gpus_plans_without_per_rank_work(planner_work):
    """A 4096-GPU plan does no per-rank Python work and builds one slice table per distinct tensor signature (the
    wall-clock figure, under 2 s, is ``scripts/bench_plan.py``'s)."""
    arch = load_arch("deepseek_v3")
    plan = build_plan(
        arch,
        TrainLayout(tp=8, pp=16, ep=32),
        InferLayout(tp=8, pp=2, ep=16),
        ClusterSpec(nnodes=512, gpus_per_node=8),
        PlanSettings(strategy="megatron", param_offload=True, optimizer_offload=True),
    )
    assert planner_work.per_rank_calls() == 0 and planner_work.calls["rank_of"] <= 8
    assert planner_work.slice_tables() <= planner_work.distinct_signatures(plan.spec) < len(plan.spec.tensors) / 50
    assert plan.errors == [] and plan.spec.method == "analytic"
    data = plan.to_dict()
    assert data["groups"]["counts"]["micro_dp"] == 512 and len(data["groups"]["micro_dp"]) == 8
    assert data["groups"]["truncated"] is True
    assert plan.bytes["hybridflow"].max < plan.model_bytes / 100


def test_qwen2_7b_on_32_gpus_plans_without_per_rank_work(planner_work):
    """As for DeepSeek-V3: no per-rank calls, one slice table per distinct signature (``scripts/bench_plan.py`` times
    it: under 0.5 s)."""
    arch = load_arch("qwen2_7b")
    plan = build_plan(arch, TrainLayout(tp=8, pp=4), InferLayout(tp=4), QWEN_32["cluster"], QWEN_32["settings"])
    assert plan.errors == [] and planner_work.per_rank_calls() == 0 and planner_work.calls["rank_of"] <= 8
    assert planner_work.slice_tables() <= planner_work.distinct_signatures(plan.spec) < len(plan.spec.tensors) / 10
