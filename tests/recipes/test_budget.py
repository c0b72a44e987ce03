"""``batching=dynamic``'s auto token budgets and the rollout's memory share, as a user reads them from
``python -m recipes.grpo ... action=plan`` (table and ``plan.format=json``), and the numbers behind them."""

from __future__ import annotations

import json
import subprocess
import tempfile

import pytest

from recipes.compose.compose import compose_recipe
from tests.conftest import run_recipe_main

H200 = ["model=qwen2_5_0_5b", "cluster=h200_141g", "cluster.gpus_per_node=1", "parallel=tp1"]
SEQ = 512 + 1024  # the grpo recipe's data.max_prompt_length + data.max_response_length


def _cli(*args: str) -> subprocess.CompletedProcess:
    """``python -m recipes.grpo *args``, run in-process (tests.conftest.run_recipe_main) in a scratch folder."""
    with tempfile.TemporaryDirectory() as scratch:
        return run_recipe_main("grpo", *args, cwd=scratch)


@pytest.fixture(scope="module")
def plan_table() -> subprocess.CompletedProcess:
    return _cli(*H200, "action=plan")


@pytest.fixture(scope="module")
def plan_json() -> dict:
    done = _cli(*H200, "action=plan", "plan.format=json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_plan_prints_the_auto_budgets_and_the_headroom(plan_table, plan_json):
    assert plan_table.returncode == 0, plan_table.stderr
    auto = plan_json["token_budgets"]["auto"]
    update, log_prob = auto["ppo_max_token_len_per_gpu"], auto["log_prob_max_token_len_per_gpu"]
    lines = [line for line in plan_table.stdout.splitlines() if line.startswith("token budgets:")]
    assert lines[0].startswith(f"token budgets: auto (batching.*_factor null): update {update:,} tokens per GPU "
                               f"(limited by memory), log-prob {log_prob:,} (limited by memory)")
    assert lines[1].endswith(f"headroom {auto['headroom_bytes'] / 2**30:.2f} GiB")
    # a 0.5B model on a 141 GiB GPU: far above the source article's 3x (the H200 run: 3x is 0.70x of fixed)
    assert update > 64 * SEQ and log_prob > update
    # the budget is what the config resolves to (verl gets the number)
    cfg = compose_recipe("grpo", H200)
    assert cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == update
    assert cfg.actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu == log_prob
    assert cfg.critic.ppo_max_token_len_per_gpu == 2 * update


def test_auto_budget_leaves_the_margin_and_the_headroom(plan_json):
    from dataclasses import replace

    from hybrid_engine.plan.memory import estimate_memory
    from recipes.check.plan import make_plan
    from recipes.check.validate import check

    auto, memory = plan_json["token_budgets"]["auto"], plan_json["memory"]
    room = memory["gpu_bytes"] - memory["min_headroom_bytes"]
    assert memory["phases"]["training"] == auto["training_bytes"] <= room
    # a model 15% short on every token-dependent byte is the plan at 1.15x the budget: it still fits; 256 tokens
    # more of budget would not
    plan = make_plan(check(compose_recipe("grpo", H200), run_verl=False))
    budget = auto["ppo_max_token_len_per_gpu"]

    def training(tokens: int) -> int:
        settings = replace(plan.settings, ppo_max_token_len_per_gpu=tokens)
        return estimate_memory(plan.spec, plan.groups, plan.cluster, settings, memory["rollout"]["weights"])[
            "phases"]["training"]

    assert training(int(1.15 * budget)) <= room < training(int(1.15 * (budget + 256)))


def test_a_typed_factor_or_number_still_wins():
    cfg = compose_recipe("grpo", [*H200, "batching.actor_factor=3", "batching.logprob_factor=4"])
    assert cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 3 * SEQ
    assert cfg.actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu == 4 * SEQ
    cfg = compose_recipe("grpo", [*H200, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=12288"])
    assert cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 12288
    done = _cli(*H200, "batching.actor_factor=3", "batching.logprob_factor=4", "action=plan")
    assert "token budgets: typed factors (actor 3x, log-prob 4x of prompt+response)" in done.stdout


def test_auto_budget_is_capped_by_the_mini_batch_on_the_cpu_demo():
    # the embedded CPU default (tiny model and task): one micro-batch holds the whole mini-batch per GPU
    cfg = compose_recipe("grpo", ["parallel=cpu", "cluster=cpu", "rollout=hf", "model=tiny", "task=tiny"])
    seq = cfg.data.max_prompt_length + cfg.data.max_response_length
    per_gpu = cfg.actor_rollout_ref.actor.ppo_mini_batch_size * cfg.actor_rollout_ref.rollout.n  # one rank
    assert cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == per_gpu * seq
    n = cfg.actor_rollout_ref.rollout.n
    assert cfg.actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu == cfg.data.train_batch_size * n * seq


def test_a_whole_7b_on_one_h200_plans_as_not_fitting():
    done = _cli("model=qwen2_5_7b", "cluster=h200_141g", "cluster.gpus_per_node=1", "parallel=tp1",
                "actor_rollout_ref.actor.use_kl_loss=false", "action=plan")
    assert "(limited by does not fit one sequence)" in done.stdout
    assert done.returncode == 2 and "DOES NOT FIT" in done.stdout


def test_every_plan_prints_the_rollout_share(plan_table, plan_json):
    share = plan_json["memory"]["rollout"]["gpu_memory_utilization"]
    assert share["configured"] == 0.6 and share["ok"]
    gpu = plan_json["memory"]["gpu_bytes"]
    beside = plan_json["memory"]["phases"]["generation"] - plan_json["memory"]["rollout"]["reserved"]
    assert share["max"] == int((gpu - 2 * 2**30 - beside) / gpu * 100) / 100
    assert (f"  share    gpu_memory_utilization 0.6 configured, {share['min']:.2f} to {share['max']:.2f} leaves the "
            f"training side its peak + headroom when the engine wakes: ok") in plan_table.stdout


def test_a_share_above_the_bound_warns():
    done = _cli(*H200, "actor_rollout_ref.rollout.gpu_memory_utilization=0.97", "action=plan")
    warning = [line for line in done.stdout.splitlines() if "rollout.gpu_memory_utilization: 0.97 is outside" in line]
    assert warning and "the share that leaves the training side its peak plus 2 GiB headroom" in warning[0]
    assert "NOT SAFE" in done.stdout


def test_an_awake_engine_counts_the_training_peak():
    # free_cache_engine=false: the engine keeps its share through training, so the bound is the training side's peak
    done = _cli(*H200, "actor_rollout_ref.rollout.free_cache_engine=false", "batching.actor_factor=8",
                "batching.logprob_factor=8", "action=plan", "plan.format=json")
    memory = json.loads(done.stdout)["memory"]
    share = memory["rollout"]["gpu_memory_utilization"]
    beside = max(memory["phases"][k] for k in ("training", "log_prob")) - memory["rollout"]["reserved"]
    assert share["beside_engine_bytes"] == beside


def test_the_hf_rollout_holds_its_fp32_model_on_the_gpu_and_reserves_nothing_more():
    typed = ("batching.actor_factor=8", "batching.logprob_factor=8")  # the auto budget would size around the model
    done = _cli(*H200, *typed, "rollout=hf", "action=plan", "plan.format=json")
    memory = json.loads(done.stdout)["memory"]
    rollout = memory["rollout"]
    # Qwen2.5-0.5B: 494,032,768 parameters (its model card; embeddings tied, counted once), 4 bytes each
    assert rollout["weights"] == rollout["reserved"] == 494_032_768 * 4
    assert rollout["kv_cache"] == 0 and rollout["gpu_memory_utilization"]["max"] is None
    assert rollout["sleeps_during_training"] is False  # the server keeps its model in every phase
    without = json.loads(_cli(*H200, *typed, "action=plan", "plan.format=json").stdout)["memory"]
    assert memory["phases"]["training"] - without["phases"]["training"] == rollout["reserved"]  # vLLM sleeps
    table = _cli(*H200, "rollout=hf", "action=plan").stdout
    assert "  rollout  hf: weights 1.84 GiB, nothing reserved (HF transformers: the whole model in fp32" in table


def test_a_typed_budget_is_the_one_the_plan_line_names(plan_json, tmp_path, monkeypatch, capsys):
    from recipes.launch import run_recipe

    auto = plan_json["token_budgets"]["auto"]
    monkeypatch.chdir(tmp_path)
    run_recipe("grpo", [*H200, "action=plan", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=20000"])
    (line, at_auto) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("token budgets")]
    assert line.startswith(
        "token budgets: auto where not typed (batching.*_factor null): update 20,000 tokens per GPU (typed "
        f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu; auto {auto['ppo_max_token_len_per_gpu']:,}), log-prob "
        f"{auto['log_prob_max_token_len_per_gpu']:,} (limited by memory)")
    assert at_auto.startswith("token budgets (at the auto values): training ")


# ---- the engine's share and CUDA graphs, sized to the step (rollout.share / rollout.graphs auto) ---------------------

STEP_1_5B = ["cluster=h100_80g", "cluster.gpus_per_node=1", "parallel=tp1", "rollout=vllm", "model=qwen2_5_1_5b",
             "data.train_batch_size=32", "actor_rollout_ref.rollout.n=5", "data.max_prompt_length=512",
             "data.max_response_length=512", "actor_rollout_ref.actor.ppo_mini_batch_size=8"]


def test_the_engine_share_holds_one_steps_kv_cache_and_no_more():
    cfg = compose_recipe("grpo", STEP_1_5B)
    # written out: bf16 weights 1,543,714,304 x 2 B; KV per token 28 layers x (K, V) x 2 kv heads x 128 x 2 B = 28,672;
    # 160 sequences of 1,024 tokens, 20% over; 4 GiB of working memory; over 80 GiB, rounded up to 0.01
    need = 1_543_714_304 * 2 + 1.2 * 160 * 1024 * 28_672 + 4 * 2**30
    assert need / (80 * 2**30) == pytest.approx(0.1516, abs=1e-4)
    assert cfg.actor_rollout_ref.rollout.gpu_memory_utilization == 0.16
    assert list(cfg.actor_rollout_ref.rollout.cudagraph_capture_sizes) == [1, 2, 4, *range(8, 161, 8)]


def test_the_engine_share_is_at_most_verls_and_the_graphs_at_most_max_num_seqs():
    cfg = compose_recipe("grpo", ["cluster=h100_80g", "rollout=vllm", "data.train_batch_size=1024"])
    assert cfg.actor_rollout_ref.rollout.gpu_memory_utilization == 0.6  # 1,280 sequences a replica: the cap
    assert list(cfg.actor_rollout_ref.rollout.cudagraph_capture_sizes)[-1] == 256  # verl's max_num_seqs


def test_a_typed_share_or_verl_key_wins():
    cfg = compose_recipe("grpo", [*STEP_1_5B, "rollout.share=0.45", "rollout.graphs=null"])
    assert cfg.actor_rollout_ref.rollout.gpu_memory_utilization == 0.45
    assert cfg.actor_rollout_ref.rollout.cudagraph_capture_sizes is None
    cfg = compose_recipe("grpo", [*STEP_1_5B, "actor_rollout_ref.rollout.gpu_memory_utilization=0.6"])
    assert cfg.actor_rollout_ref.rollout.gpu_memory_utilization == 0.6


def test_auto_budgets_that_cannot_be_planned_say_so(monkeypatch):
    from recipes.check import budget
    from recipes.check.validate import check

    def broken(*args, **kwargs):
        raise RuntimeError("planner broke")

    monkeypatch.setattr(budget, "build_plan", broken)
    monkeypatch.setattr(budget, "_MEMO", {})
    cfg = compose_recipe("grpo", STEP_1_5B)
    assert cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 3 * 1024  # the source article's 3x
    run = check(cfg, run_verl=False)
    said = [w for w in run.warnings if w.startswith("batching: the auto token budgets could not be planned")]
    assert said and "(RuntimeError: planner broke)" in said[0] and "3x / 4x / 6x" in said[0]
