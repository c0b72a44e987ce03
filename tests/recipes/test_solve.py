"""plan.solve=true (recipes/check/solve.py): every printed command validates and runs the layout it was ranked for, over
shipped models x clusters (in-process); the real CLI prints five ranked layouts, table and JSON alike, one of them
validates in a subprocess; the user's own overrides are kept; nothing fitting is one line with the shortfall."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from recipes.check.plan import cluster_spec, make_plan, plan_settings
from recipes.check.solve import solve_run
from recipes.check.validate import check, validate
from recipes.compose.compose import compose_recipe
from recipes.compose.defaults import embedded_defaults
from tests.conftest import run_recipe_main
from tests.readme import check_block

ROOT = Path(__file__).resolve().parents[2]
DONE_WHEN = ["model=qwen2_5_32b", "cluster.nnodes=2", "action=plan", "plan.solve=true"]
RANKED = re.compile(r"^(?P<rank>[1-9])\s+(?P<step>[\d.]+)s\s")

# (recipe, overrides): every shipped model once, every GPU cluster option, both recipes, one node and several,
# dynamic and fixed batching
MATRIX = [
    ("grpo", ["model=qwen2_5_0_5b", "cluster=a100_80g"]),
    ("kl_ppo", ["model=qwen2_7b", "cluster=h100_80g", "cluster.nnodes=2"]),
    ("grpo", ["model=llama3_1_8b", "cluster=h800_80g"]),
    ("kl_ppo", ["model=qwen2_5_7b", "cluster=h200_141g", "batching=fixed"]),
    ("grpo", ["model=qwen2_5_32b", "cluster=h200_141g", "cluster.nnodes=2"]),
    ("kl_ppo", ["model=llama3_1_70b", "cluster=h100_80g", "cluster.nnodes=4"]),
    ("grpo", ["model=qwen3_30b_a3b", "cluster=h100_80g", "cluster.nnodes=2"]),
    ("grpo", ["model=tiny", "cluster=a100_80g", "cluster.gpus_per_node=4"]),
    ("kl_ppo", ["experiment=kl_ppo-qwen2_7b-2n8g-fsdp2_prefetch-vllm_tp2"]),
]


def _solve(recipe: str, typed: list[str]):
    run = check(compose_recipe(recipe, typed), run_verl=False)
    return run, solve_run(run, plan_settings(run.cfg, run.use_critic, run.use_ref), cluster_spec(run.cfg),
                          typed=typed)


@pytest.mark.slow  # 4-5 s a case on 2 cores next to a training run: five validations and a search each
@pytest.mark.parametrize(("recipe", "args"), MATRIX, ids=[f"{r}-{a[0]}" for r, a in MATRIX])
def test_every_printed_command_validates_and_runs_the_ranked_layout(recipe, args):
    typed = [*args, "action=plan", "plan.solve=true"]
    _, (result, rows) = _solve(recipe, typed)
    assert len(rows) == 5, result.refused
    for row in rows:
        words = shlex.split(row["command"])
        assert words[:3] == ["python", "-m", f"recipes.{recipe}"]
        assert all(arg in words for arg in args)  # the user's own overrides, kept
        run = validate(compose_recipe(recipe, [*words[3:], "action=validate"]))  # verl's validator included
        t, i = row["train"], row["infer"]
        assert (run.train.dp, run.train.tp, run.train.pp, run.train.cp, run.train.ep) == (
            t["dp"], t["tp"], t["pp"], t["cp"], t["ep"])
        assert (run.infer.tp, run.infer.pp, run.infer.ep) == (i["tp"], i["pp"], i["ep"])
        plan = make_plan(run)
        assert plan.settings.strategy == row["strategy"] and plan.settings.offload == row["offload"]
        assert plan.settings.gpu_memory_utilization == row["gpu_memory_utilization"]
        assert plan.memory["peak_bytes"] == row["memory"]["peak_bytes"]  # what was ranked is what runs
        assert plan.fits


def test_the_search_replaces_typed_layout_keys_and_keeps_the_rest():
    typed = ["model=qwen2_7b", "cluster=h100_80g", "parallel=tp8", "strategy=fsdp2", "offload=full",
             "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "actor_rollout_ref.actor.optim.lr=5e-7",
             "batching.actor_factor=3", "action=plan", "plan.solve=true"]
    _, (result, rows) = _solve("kl_ppo", typed)
    assert result.request.strategies == ("fsdp2",)  # a typed strategy pins the search to it
    for row in rows:
        words = shlex.split(row["command"])
        assert "actor_rollout_ref.actor.optim.lr=5e-7" in words and "model=qwen2_7b" in words
        for decided in ("parallel=tp8", "offload=full", "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
                        "batching.actor_factor=3", "action=plan", "plan.solve=true"):
            assert decided not in words
        assert f"offload={row['offload']}" in words and row["strategy"] == "fsdp2"


def test_a_typed_role_strategy_pins_the_search_and_every_command_agrees_with_it():
    """verl's actor_rollout_ref.actor.strategy=fsdp2 typed: no command may add strategy=megatron beside it."""
    typed = ["model=qwen2_5_7b", "cluster=h100_80g", "actor_rollout_ref.actor.strategy=fsdp2", "action=plan",
             "plan.solve=true"]
    _, (result, rows) = _solve("kl_ppo", typed)
    assert result.request.strategies == ("fsdp2",) and rows
    for row in rows:
        words = shlex.split(row["command"])
        assert "actor_rollout_ref.actor.strategy=fsdp2" in words and "strategy=fsdp2" in words
        validate(compose_recipe("kl_ppo", [*words[3:], "action=validate"]))


# -- the real command line ----------------------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def _main(module: str, *args: str) -> subprocess.CompletedProcess:
    """:func:`_cli`'s command line run in-process (tests.conftest.run_recipe_main) in a scratch folder."""
    with tempfile.TemporaryDirectory() as scratch:
        return run_recipe_main(module.removeprefix("recipes."), *args, cwd=scratch)


@pytest.fixture(scope="module")
def done_when():
    return _cli("recipes.kl_ppo", *DONE_WHEN)


def _ranked(stdout: str) -> list[tuple[int, float, str]]:
    """(rank, step seconds, command) of each printed layout."""
    lines = stdout.splitlines()
    out = []
    for n, line in enumerate(lines):
        match = RANKED.match(line)
        if match:
            command = lines[n + 2].strip()
            out.append((int(match["rank"]), float(match["step"]), command))
    return out


@pytest.mark.slow  # a child process (the done_when fixture, or its own)
def test_the_cli_prints_five_ranked_layouts_with_their_commands(done_when):
    assert done_when.returncode == 0, done_when.stderr
    assert "Traceback" not in done_when.stderr
    ranked = _ranked(done_when.stdout)
    assert [rank for rank, _, _ in ranked] == [1, 2, 3, 4, 5]
    steps = [step for _, step, _ in ranked]
    assert steps == sorted(steps)
    for _, _, command in ranked:
        assert command.startswith("python -m recipes.kl_ppo model=qwen2_5_32b cluster.nnodes=2 cluster=h100_80g ")
    assert done_when.stdout.count("why: ") == 5
    why_lines = [line for line in done_when.stdout.splitlines() if line.strip().startswith("why: ")]
    assert why_lines[0].strip().startswith("why: fastest estimate; ")
    for line, (_, step, _) in zip(why_lines[1:], ranked[1:], strict=True):
        gap = float(re.search(r"why: \+([\d.]+) s vs #1", line)[1])
        assert gap == pytest.approx(step - ranked[0][1], abs=0.11)


@pytest.mark.slow  # a child process (the done_when fixture, or its own)
def test_a_printed_command_validates_in_a_subprocess(done_when):
    ranked = _ranked(done_when.stdout)
    megatron = [command for _, _, command in ranked if "strategy=megatron" in command]
    command = shlex.split((megatron or [ranked[0][2]])[0])
    result = _cli(*command[2:], "action=validate")
    assert result.returncode == 0, result.stderr
    tp = next(word.split("=")[1] for word in command if word.startswith("layout.train.tp="))
    assert re.search(rf"^config OK: \w+ train dp\d+ tp{tp} ", result.stdout, re.M)


@pytest.mark.slow  # a child process (the done_when fixture)
def test_json_carries_the_same_layouts_and_commands(done_when):
    result = _main("recipes.kl_ppo", *DONE_WHEN, "plan.format=json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert [row["command"] for row in document["candidates"]] == [c for _, _, c in _ranked(done_when.stdout)]
    assert [row["rank"] for row in document["candidates"]] == [1, 2, 3, 4, 5]
    first = document["candidates"][0]
    assert set(first["time_s"]) == {"generation", "log_prob", "update", "weight_sync", "total"}
    assert first["time_s"]["total"] == pytest.approx(sum(v for k, v in first["time_s"].items() if k != "total"))
    assert first["memory"]["headroom_bytes"] == 80 * 2**30 - first["memory"]["peak_bytes"]
    assert document["solve"]["considered"] >= document["solve"]["allowed"] >= document["solve"]["evaluated"]


def test_nothing_fits_is_one_line_with_the_shortfall_and_exit_2():
    # 512 GiB of host memory: FSDP2's CPUOffloadPolicy (offload=full) would put 1,183 GiB of states there
    result = _main("recipes.grpo", "model=llama3_1_70b", "cluster.gpus_per_node=2", "cluster.host_memory_gib=512",
                   "action=plan", "plan.solve=true")
    assert result.returncode == 2
    assert result.stdout == ""
    errors = [line for line in result.stderr.splitlines() if line.startswith("config error")]
    assert len(errors) == 1 and "Traceback" not in result.stderr
    match = re.search(r"offloaded ([\d.]+) GiB per node \(([\d.]+) GiB per GPU x 2\) \+ 16 GiB for the processes vs "
                      r"cluster.host_memory_gib 512: DOES NOT FIT: ([\d.]+) GiB short", errors[0])
    assert match and float(match[1]) == pytest.approx(2 * float(match[2]), abs=0.011)
    assert float(match[3]) == pytest.approx(float(match[1]) + 16 - 512, abs=0.011)
    assert errors[0].startswith("config error: plan.solve: no layout of llama3_1_70b fits 1x2 h100_80g")
    # docs/checking.md shows this line
    check_block("<!-- nothing fits: tests/recipes/test_solve.py -->", "<!-- end of nothing fits -->",
                ["$ python -m recipes.grpo model=llama3_1_70b cluster.gpus_per_node=2 cluster.host_memory_gib=512 "
                 "action=plan plan.solve=true"], errors, page="checking.md")


@pytest.mark.slow  # a child process (the done_when fixture, or its own)
def test_docs_checking_shows_what_the_search_prints(done_when):
    lines = done_when.stdout.rstrip("\n").splitlines()
    check_block("<!-- solve output: tests/recipes/test_solve.py -->", "<!-- end of solve output -->",
                [f"$ python -m recipes.kl_ppo {' '.join(DONE_WHEN)}"], lines, page="checking.md")


def test_plan_solve_is_a_gpu_request_only_with_action_plan():
    assert embedded_defaults(["model=qwen2_7b", "action=plan", "plan.solve=true"], accelerator=False) == []
    assert "cluster=cpu" in embedded_defaults(["plan.solve=true"], accelerator=False)  # training: the CPU default
    assert "cluster=cpu" in embedded_defaults(["action=plan", "plan.solve=false"], accelerator=False)


def test_a_bad_plan_solve_value_is_one_line_and_exit_2():
    result = _main("recipes.grpo", "action=plan", "plan.solve=maybe")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == "config error: plan.solve: expected a boolean, got 'maybe'"
