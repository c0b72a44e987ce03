"""Names verl 0.9.1 looks up at run time: the lists agree with verl's own code, and a wrong name is one line.

* every name a list holds is one verl's function takes, and a wrong one is one it refuses (run, not read, where the
  function runs on a CPU without a model: the KL estimators, the KL controllers, the learning-rate schedules);
* :func:`name_problems` reads only the keys verl reads in this run (``when``, inactive sections, the FSDP optimizer);
* on the CLI, a wrong name, a value out of range, or a non-finite coefficient exits 2 with one line
  (tests/recipes/test_bad_inputs.py holds the in-process cases).
"""

from __future__ import annotations

import inspect

import pytest
import torch
from omegaconf import OmegaConf

from recipes.verl_ext import names as N

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.mark.parametrize("name", N._kl_estimators())
def test_every_listed_kl_estimator_runs_in_verl(name):
    from verl.trainer.ppo import core_algos

    logprob, ref = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]])
    assert core_algos.kl_penalty(logprob, ref, name).shape == (1, 2)


@pytest.mark.parametrize("name", ["kl2", "full", "k4+"])
def test_a_kl_estimator_not_listed_fails_in_verl(name):
    from verl.trainer.ppo import core_algos

    assert name not in N._kl_estimators()
    with pytest.raises(NotImplementedError):
        core_algos.kl_penalty(torch.zeros(1, 2), torch.zeros(1, 2), name)


def test_kl_controllers_are_verls():
    from verl.trainer.ppo import core_algos

    for kind in N.KL_CONTROLLERS:
        ctrl = OmegaConf.create({"type": kind, "kl_coef": 0.1, "target_kl": 0.1, "horizon": 100})
        assert core_algos.get_kl_controller(ctrl).value == pytest.approx(0.1)
    with pytest.raises(NotImplementedError):
        core_algos.get_kl_controller(OmegaConf.create({"type": "pid", "kl_coef": 0.1}))


def test_lr_schedulers_are_verls():
    from verl.workers.config import FSDPOptimizerConfig

    for kind in N.LR_SCHEDULERS:
        assert FSDPOptimizerConfig(lr=1e-6, lr_scheduler_type=kind).lr_scheduler_type == kind
    with pytest.raises(AssertionError):
        FSDPOptimizerConfig(lr=1e-6, lr_scheduler_type="linear")


@pytest.mark.parametrize("listed,where", [
    (N.RESUME_MODES, "verl.utils.checkpoint.checkpoint_handler:CheckpointHandler._determine_resume_path"),
    (N.CHECKPOINT_CONTENTS, "verl.utils.checkpoint.checkpoint_manager:BaseCheckpointManager"),
    (N.TRUNCATIONS, "verl.utils.torch_functional:postprocess_data"),
])
def test_each_listed_name_is_tested_in_verls_code(listed, where):
    """Functions that need a checkpoint folder or a tokenizer to run: each listed name is a literal their code
    compares against."""
    import importlib

    module, attr = where.split(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    source = inspect.getsource(obj)
    for name in listed:
        assert f'"{name}"' in source, (name, where)


def _container(**over):
    base = {
        "algorithm": {"adv_estimator": "grpo", "use_kl_in_reward": False, "kl_penalty": "nope",
                      "kl_ctrl": {"type": "pid"}},
        "actor_rollout_ref": {"actor": {"use_kl_loss": True, "kl_loss_type": "low_var_kl",
                                        "policy_loss": {"loss_mode": "vanilla"},
                                        "checkpoint": {"save_contents": ["model", "optimizer"]},
                                        "optim": {"_target_": N._FSDP_OPTIM, "optimizer": "AdamW",
                                                  "optimizer_impl": "torch.optim", "lr_scheduler_type": "cosine"}}},
        "critic": {"optim": {"_target_": N._FSDP_OPTIM, "optimizer": "Adamm", "optimizer_impl": "torch.optim"}},
        "trainer": {"resume_mode": "auto", "logger": ["console"]},
        "data": {"truncation": "error"},
    }
    for key, value in over.items():
        node = base
        *path, last = key.split("__")
        for part in path:
            node = node[part]
        node[last] = value
    return base


def test_keys_verl_does_not_read_in_this_run_are_not_checked():
    """kl_penalty and kl_ctrl.type without KL in the reward; the critic's optimizer without a critic."""
    assert N.name_problems(_container(), inactive=frozenset({"critic"})) == {}


def test_a_wrong_name_is_one_line_with_verls_choices_and_a_suggestion():
    problems = N.name_problems(_container(algorithm__use_kl_in_reward=True), inactive=frozenset({"critic"}))
    assert set(problems) == {"algorithm.kl_penalty", "algorithm.kl_ctrl.type"}
    assert problems["algorithm.kl_ctrl.type"] == (
        "algorithm.kl_ctrl.type: must be one of verl 0.9.1's KL controllers: fixed, adaptive; got 'pid'")
    problems = N.name_problems(_container(trainer__logger=["console", "tensorbord"]), inactive=frozenset({"critic"}))
    assert problems == {"trainer.logger": "trainer.logger: each item must be one of verl 0.9.1's tracking backends: "
                        "wandb, mlflow, swanlab, vemlp_wandb, tensorboard, console, clearml, trackio, file, "
                        "rl_insight (did you mean tensorboard?); got 'tensorbord'"}


def test_the_optimizer_class_is_looked_up_as_verl_builds_it():
    problems = N.name_problems(_container())
    assert problems == {"critic.optim.optimizer": "critic.optim.optimizer: torch.optim has no optimizer 'Adamm' "
                        "(did you mean Adam?) (verl 0.9.1 builds getattr(torch.optim, optimizer))"}
    # a package this machine lacks is the cluster's to have; a module of a package it has must import
    lacking = _container(critic__optim__optimizer_impl="bitsandbytes_not_here.optim")
    assert N.name_problems(lacking) == {}
    typo = _container(critic__optim__optimizer_impl="torch.optimz")
    assert list(N.name_problems(typo)) == ["critic.optim.optimizer_impl"]


def test_megatron_optimizer_nodes_are_not_fsdp_ones():
    megatron = _container(actor_rollout_ref__actor__optim={"_target_": "verl.workers.config.McoreOptimizerConfig",
                                                           "optimizer": "adam", "lr_scheduler_type": "linear"})
    assert N.name_problems(megatron, inactive=frozenset({"critic"})) == {}


def test_the_cli_refuses_a_wrong_kl_estimator_before_anything_starts(tmp_path, recipe_main):
    proc = recipe_main("kl_ppo", "algorithm.kl_penalty=low_var", "action=validate", cwd=tmp_path, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[-1] == ("config error: algorithm.kl_penalty: must be one of verl 0.9.1's KL estimators: kl, k1, "
                         "abs, mse, k2, low_var_kl, k3, kl+, k1+, abs+, mse+, k2+, low_var_kl+, k3+ (did you mean "
                         "low_var_kl?); got 'low_var'")
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert not (tmp_path / "runs").exists()
