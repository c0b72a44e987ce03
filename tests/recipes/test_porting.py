"""A pasted verl script keeps verl's semantics where it leaves keys unset: its batching mode follows its own keys
(recipes/compose/compose.py ``adopt_batching``), and every other verl default the pack changes is listed once on stderr
with the override that restores it (recipes/verl_ext/verl_tree.py; checked against verl's own composition of each
example script by tests/recipes/test_verl_examples.py)."""

from __future__ import annotations

import importlib.util

import pytest
from omegaconf import OmegaConf

from recipes.compose.compose import adopt_batching
from recipes.launch import run_recipe
from recipes.verl_ext.verl_tree import hydra_value, is_verl_script, restoring_override
from tests.conftest import ROOT

MICRO = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"
NOTE = ("note: actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu typed without use_dynamic_bsz: batching=fixed, "
        "verl's fixed micro-batches (batching=dynamic for the pack's token-balanced ones)")


@pytest.mark.parametrize("typed,added", [
    ([MICRO], True),
    (["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4"], True),
    ([MICRO, "actor_rollout_ref.actor.use_dynamic_bsz=True"], False),  # the script's own mode
    ([MICRO, "batching=dynamic"], False),  # the pack's group, typed, decides
    (["actor_rollout_ref.actor.use_dynamic_bsz=false"], True),
    (["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null"], False),
    (["trainer.total_training_steps=4"], False),
])
def test_batching_follows_the_scripts_own_keys(typed, added):
    command, notes = adopt_batching(list(typed))
    overrides = list(command.args)
    assert (overrides[-1] == "batching=fixed") is added and (len(notes) == 1) is added
    assert overrides[:len(typed)] == typed


def test_typed_micro_batches_validate_as_fixed_with_one_note(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    run_recipe("grpo", ["trainer.n_gpus_per_node=8", MICRO,
                        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
                        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8", "action=validate"])
    err = capsys.readouterr().err
    assert err.count(NOTE) == 1
    (saved,) = (tmp_path / "runs" / "grpo").glob("*/resolved_config.yaml")
    cfg = OmegaConf.load(saved)
    assert cfg.batching.mode == "fixed" and cfg.actor_rollout_ref.actor.use_dynamic_bsz is False
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 8
    # the note of changed defaults follows, and lists verl's trainer mode with its restoring override
    assert "of verl's defaults differ in this run" in err
    assert "  trainer.v1.trainer_mode: stability (verl: sync)  ->  trainer.v1.trainer_mode=sync" in err


def test_pack_commands_are_not_verl_scripts():
    assert not is_verl_script(["parallel=tp8", "trainer.total_training_steps=4", "strategy=megatron"])
    assert is_verl_script(["algorithm.adv_estimator=grpo"]) and is_verl_script(["+data.x=1"])


@pytest.mark.parametrize("key,value,override", [
    ("actor_rollout_ref.actor.strategy", "fsdp", "strategy=fsdp"),
    ("actor_rollout_ref.actor.use_dynamic_bsz", False, "batching=fixed"),
    ("actor_rollout_ref.rollout.tensor_model_parallel_size", 1, "layout.infer.tp=1"),
    ("trainer.default_local_dir", "checkpoints/a b", "trainer.default_local_dir='checkpoints/a b'"),
    ("critic.model.tokenizer_path", None, "critic.model.tokenizer_path=null"),
    ("trainer.logger", ["console", "wandb"], "trainer.logger=[console,wandb]"),
])
def test_each_restoring_override_is_written_as_typed(key, value, override):
    assert restoring_override(key, value) == override


def test_values_that_hydra_would_misread_are_quoted():
    assert [hydra_value(v) for v in ("null", "", "a:b", 1e-06, True)] == ["'null'", "''", "'a:b'", "1e-06", "true"]


def _readme_port_command_and_sample() -> tuple[list[str], list[str]]:
    """docs/porting.md's command (its overrides) and the note sample shown after it; the README's "Port your verl
    script" shows the same command."""
    text = (ROOT / "docs" / "porting.md").read_text()
    blocks = text.split("```")[1::2]
    command = blocks[0].replace("\\\n", " ").split()
    assert command[:3] == ["python", "-m", "recipes.grpo"]
    readme = (ROOT / "README.md").read_text().split("## Port your verl script", 1)[1]
    assert readme.split("```")[1].replace("\\\n", " ").split() == command, "the README's port command is not the page's"
    sample = next(block for block in blocks if "of verl's defaults differ" in block)
    return command[3:], [line for line in sample.strip("\n").splitlines() if line.strip() != "..."]


def test_the_readme_sample_of_the_note_is_what_its_command_prints(tmp_path, monkeypatch, capsys):
    overrides, sample = _readme_port_command_and_sample()
    monkeypatch.chdir(tmp_path)
    run_recipe("grpo", overrides)
    err = capsys.readouterr().err.splitlines()
    assert [line for line in sample if line not in err] == []
    head = next(line for line in err if "of verl's defaults differ" in line)
    rows = err[err.index(head) + 1:]
    keys = [key for row in rows if row.startswith("  ") and "  ->  " in row
            for key in row.strip().split(": ", 1)[0].split(", ")]
    assert head.split()[1] == str(len(keys))  # the count is of keys (keys one override restores share a row)


POLL_LINE = ("  trainer.v1.sampler.sampler_kwargs.poll_interval: 0.1 (verl: 2.0)  ->  "
             "trainer.v1.sampler.sampler_kwargs.poll_interval=2.0")
FALLBACK_NOTE = "run.flash_attn_fallbacks=false keeps verl's code"


@pytest.mark.slow  # two child processes
@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is not None, reason="the note is for machines without it")
def test_a_port_is_told_what_verls_code_would_do_and_gets_it_when_typed(tmp_path, recipe_cli):
    """Two differences from verl's run that no verl key shows: verl's replay buffer waits 2 s between polls for
    finished rollouts (a constant of its code; the recipes set 0.1 s on GPUs), and on a GPU without flash-attn the
    plugin stands in for verl's flash-attn code. A pasted script is told of both, each with the override that gives
    verl's; with both typed, neither is said, and every Ray worker gets KLPPO_FLASH_ATTN_FALLBACKS=0."""
    port = ["algorithm.adv_estimator=grpo", "cluster=h100_80g", "action=validate"]
    told = recipe_cli("grpo", *port, cwd=tmp_path)
    assert told.returncode == 0, told.stderr[-2000:]
    assert POLL_LINE in told.stderr.splitlines() and FALLBACK_NOTE in told.stderr
    (tmp_path / "as_verl").mkdir()
    typed = recipe_cli("grpo", *port, "trainer.v1.sampler.sampler_kwargs.poll_interval=2.0",
                       "run.flash_attn_fallbacks=false", cwd=tmp_path / "as_verl")
    assert typed.returncode == 0, typed.stderr[-2000:]
    assert "poll_interval" not in typed.stderr and "flash-attn" not in typed.stderr
    (saved,) = (tmp_path / "as_verl" / "runs" / "grpo").glob("*/resolved_config.yaml")
    workers = OmegaConf.load(saved).ray_kwargs.ray_init.runtime_env.env_vars
    assert workers.KLPPO_FLASH_ATTN_FALLBACKS == "0"
    assert "KLPPO_FLASH_ATTN_FALLBACKS" not in (next((tmp_path / "runs" / "grpo").glob("*/resolved_config.yaml"))
                                                .read_text())


def test_the_demo_on_this_cpu_is_not_told_of_flash_attn(tmp_path, monkeypatch, capsys):
    """The CPU run takes the plugin's CPU platform, where the flash-attn fallbacks do not apply: no such note."""
    monkeypatch.chdir(tmp_path)
    run_recipe("grpo", ["algorithm.adv_estimator=grpo", "action=validate"])
    err = capsys.readouterr().err
    assert "of verl's defaults differ" in err and "flash-attn" not in err
