"""The layout search (hybrid_engine.plan.solve) and its step-time model: the branch and bound returns the exhaustive
search's best layouts, every result re-plans as fitting with the settings it reports (and no larger share would),
every result obeys the model's shape rules, and an impossible request reports the smallest planned shortfall."""

from dataclasses import replace

import pytest

from hybrid_engine.layout import InferLayout, TrainLayout
from hybrid_engine.model_spec import build_spec, load_arch
from hybrid_engine.plan import ClusterSpec, PlanSettings, build_plan
from hybrid_engine.plan.settings import GIB
from hybrid_engine.plan.solve import MAX_SHARE, SHARE_STEP, SolveRequest, solve
from hybrid_engine.plan.step_time import Workload, gpu_figures, group_spans_nodes, step_time

H100 = dict(gpus_per_node=8, gpu="h100_80g", memory_gib=80.0)


def _request(model: str, nnodes: int, *, top: int = 5, critic: bool = False, n: int = 5, dynamic: bool = True,
             **cluster) -> SolveRequest:
    settings = PlanSettings(max_prompt_length=512, max_response_length=1024, rollout_n=n, has_critic=critic,
                            use_dynamic_bsz=dynamic, gpu_memory_utilization=0.6)
    return SolveRequest(arch=load_arch(model), cluster=ClusterSpec(nnodes=nnodes, **{**H100, **cluster}),
                        settings=settings, workload=Workload(train_batch_size=1024, ppo_mini_batch_size=256),
                        top=top)


A100 = {"gpu": "a100_80g"}
H200 = {"gpu": "h200_141g", "memory_gib": 141.0}
# every shipped model that fits somewhere small (DeepSeek-V3 needs hundreds of GPUs: the benchmark's case), on
# each GPU kind, both batching modes, with and without a critic
CASES = [("qwen2_7b", 2, {}), ("qwen2_5_32b", 2, {"critic": True, "n": 1}), ("qwen3_30b_a3b", 1, {}),
         ("qwen2_5_0_5b", 1, {"dynamic": False}), ("llama3_1_70b", 2, A100), ("llama3_1_8b", 2, H200),
         ("qwen2_5_7b", 2, {**A100, "critic": True, "n": 1}), ("tiny", 1, H200)]


SLOW_CASES = {"qwen3_30b_a3b", "qwen2_5_32b"}
"""The cases whose exhaustive search takes over 5 s on 2 cores next to a training run (4.9-6.4 s, 2026-12-05)."""


@pytest.fixture(scope="module", ids=[case[0] for case in CASES], params=[
    pytest.param(case, marks=pytest.mark.slow) if case[0] in SLOW_CASES else case for case in CASES])
def solved(request):
    model, nnodes, extra = request.param
    return _request(model, nnodes, **extra), solve(_request(model, nnodes, **extra))


def _key(candidate):
    return candidate.strategy, candidate.train, candidate.infer


def test_the_bound_keeps_the_exhaustive_top_five(solved):
    req, result = solved
    everything = solve(replace(req, top=10_000))  # nothing is bounded out before 10 000 layouts fit
    assert everything.evaluated == everything.allowed
    assert result.evaluated < everything.evaluated  # the bound did prune
    assert [_key(c) for c in result.candidates] == [_key(c) for c in everything.candidates[:5]]
    assert [c.time.total for c in result.candidates] == pytest.approx([c.time.total for c in
                                                                       everything.candidates[:5]])
    assert len(result.candidates) == 5
    totals = [c.time.total for c in result.candidates]
    assert totals == sorted(totals)


def test_each_result_replans_as_fitting_and_no_larger_share_would(solved):
    req, result = solved
    spec = build_spec(req.arch)
    for candidate in result.candidates:
        plan = build_plan(req.arch, candidate.train, candidate.infer, req.cluster, candidate.settings, spec=spec)
        assert not plan.errors
        assert plan.fits
        assert plan.memory["peak_bytes"] == candidate.memory["peak_bytes"]
        assert plan.headroom_bytes >= req.settings.min_headroom_gib * GIB
        share = candidate.settings.gpu_memory_utilization
        if share < MAX_SHARE:
            larger = replace(candidate.settings, gpu_memory_utilization=share + 1 / SHARE_STEP)
            assert not build_plan(req.arch, candidate.train, candidate.infer, req.cluster, larger, spec=spec).fits


def test_each_result_obeys_the_model_shape_and_batch_rules(solved):
    req, result = solved
    arch = req.arch
    for c in result.candidates:
        t, i = c.train, c.infer
        assert t.dp * t.tp * t.pp * t.cp == i.tp * i.pp * i.dp == req.cluster.world_size
        if c.strategy == "megatron":
            assert arch.num_attention_heads % t.tp == arch.num_key_value_heads % t.tp == 0
            assert arch.num_hidden_layers % t.pp == 0
        else:
            assert t.tp == t.pp == 1 and t.ep == 1
        assert arch.num_attention_heads % i.tp == 0
        assert arch.num_key_value_heads % i.tp == 0 or i.tp % arch.num_key_value_heads == 0
        assert i.pp == 1 and i.ep in (1, i.tp)
        if arch.is_moe:
            assert arch.num_experts % t.ep == 0 and (t.dp * t.cp) % t.ep == 0
        assert (req.workload.ppo_mini_batch_size * req.settings.rollout_n) % t.dp == 0
        if not req.settings.use_dynamic_bsz:
            per_gpu = req.workload.ppo_mini_batch_size * req.settings.rollout_n // t.dp
            assert per_gpu % c.settings.ppo_micro_batch_size_per_gpu == 0


def test_nothing_fits_reports_the_smallest_planned_shortfall():
    # 512 GiB of host memory: FSDP2's CPUOffloadPolicy would need 70.6 B x 18 B = 1,183 GiB on the node
    req = _request("llama3_1_70b", 1, gpus_per_node=2, host_memory_gib=512)
    result = solve(req)
    assert result.candidates == [] and result.fitting == 0
    short = result.shortfall
    assert short["offload"] == "full"
    spec = build_spec(req.arch)
    lightest = replace(req.settings, param_offload=True, optimizer_offload=True, offload_policy=True,
                       strategy=short["strategy"],
                       ppo_max_token_len_per_gpu=2 * 1536, log_prob_max_token_len_per_gpu=2 * 1536)
    shortfalls = []
    for infer_tp in (1, 2):
        for strategy, train in (("fsdp2", TrainLayout(dp=2, order="cp-dp-tp-pp")), ("megatron", TrainLayout(tp=2)),
                                ("megatron", TrainLayout(pp=2))):
            plan = build_plan(req.arch, train, InferLayout(tp=infer_tp), req.cluster,
                              replace(lightest, strategy=strategy, gpu_memory_utilization=0.9), spec=spec)
            if plan.memory is not None and infer_tp == 2:
                host = plan.memory["host"]
                shortfalls.append(max(plan.memory["phases"]["training"] + 2 * GIB - plan.memory["gpu_bytes"],
                                      host["per_node"] + 16 * GIB - 512 * GIB))
    assert short["peak_phase"] == "training"
    assert short["bytes"] == min(shortfalls)  # the training phase does not depend on the rollout share
    assert short["bytes"] > 400 * GIB


def test_a_tiny_world_refuses_by_rule_and_says_why():
    result = solve(_request("llama3_1_70b", 1, gpus_per_node=1))
    assert result.allowed == 0 and result.candidates == []
    assert result.refused == {"generation shard > largest rollout share": 2}  # fsdp2 and megatron, infer tp 1
    assert result.shortfall["shard_bytes"] > result.shortfall["share_bytes"] == int(MAX_SHARE * 80 * GIB)


# -- the step-time model ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("stride", "size", "spans"), [(1, 8, False), (1, 4, False), (2, 4, False), (1, 16, True),
                                                       (8, 2, True), (1, 3, True), (4, 1, False)])
def test_a_group_spans_nodes_when_its_ranks_leave_one_node(stride, size, spans):
    assert group_spans_nodes(stride, size, 8) is spans


def test_gpu_figures_come_from_the_datasheets_by_name():
    assert (gpu_figures("h200_141g").tflops, gpu_figures("h200_141g").hbm_GBps) == (989.0, 4800.0)
    assert gpu_figures("a100_80g").tflops == 312.0
    unknown = gpu_figures("mi300x")
    assert unknown.assumed and unknown.hbm_GBps == gpu_figures("h100_80g").hbm_GBps


def _memory(kv_tokens: int, params: int = 10 * GIB) -> dict:
    return {"rollout": {"weights": 4 * GIB, "kv_bytes_per_token": 57344, "kv_cache_tokens": kv_tokens},
            "actor": {"params": params, "grads": params * 2, "optimizer": params * 4, "master_weights": params * 2},
            "activations": {"tokens_per_micro_batch": 8 * 1536, "log_prob_tokens": 8 * 1536}}


def test_generation_speeds_up_with_the_kv_cache_until_one_wave_holds_the_engine_share():
    req = _request("qwen2_7b", 1)
    spec = build_spec(req.arch)
    train, infer = TrainLayout(dp=8, order="cp-dp-tp-pp"), InferLayout(tp=2, dp=4)
    seqs_per_engine = 1024 * 5 // 4

    def generation(tokens, max_num_seqs=100_000):
        workload = replace(req.workload, max_num_seqs=max_num_seqs)
        return step_time(spec, train, infer, req.cluster, req.settings, workload, _memory(tokens), 0.0).generation

    times = [generation(1536 * k) for k in (40, 160, 640, seqs_per_engine, 4 * seqs_per_engine)]
    assert times[0] > times[1] > times[2] > times[3]
    assert times[3] == times[4]  # the cache beyond one wave of the engine's sequences buys nothing
    # verl's default rollout.max_num_seqs (256) caps a wave: a cache for more sequences buys nothing either
    assert generation(1536 * 256, 256) == generation(1536 * 640, 256) > times[2]


def test_offload_only_adds_pcie_time_to_the_update_and_log_prob_passes():
    req = _request("qwen2_7b", 1)
    spec = build_spec(req.arch)
    train, infer = TrainLayout(dp=8, order="cp-dp-tp-pp"), InferLayout(tp=2, dp=4)
    memory = _memory(100_000)
    base = step_time(spec, train, infer, req.cluster, req.settings, req.workload, memory, 0.5)
    full = step_time(spec, train, infer, req.cluster, replace(req.settings, param_offload=True,
                                                              optimizer_offload=True), req.workload, memory, 0.5)
    assert (full.generation, full.weight_sync) == (base.generation, base.weight_sync)
    params = 10 * GIB
    assert full.log_prob - base.log_prob == pytest.approx(2 * params / 25e9)  # actor + ref onto the GPU
    # params and grads onto the GPU and back, optimizer states and master weights onto the GPU and back
    assert full.update - base.update == pytest.approx((2 * (params + 2 * params) + 2 * (4 * params + 2 * params))
                                                      / 25e9)


def test_each_result_runs_the_fastest_offload_that_fits_on_its_layout(solved):
    _, result = solved
    for candidate in result.candidates:
        tried = candidate.offloads
        assert list(tried) == ["none", "optimizer", "param", "full"][:len(tried)]  # mildest first
        assert tried[candidate.offload] == pytest.approx(candidate.time.total)
        assert all(total is None or total >= candidate.time.total for total in tried.values())
