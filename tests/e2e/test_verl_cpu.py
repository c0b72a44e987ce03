"""verl's own entry point, ``python -m verl.trainer.main_ppo``, end to end on the CPU with the tiny assets.

What a verl user gets from the plugin alone, without the recipes: one run of verl 0.9.1's default (v1,
TransferQueue) trainer, FSDP2 over gloo, the plugin's ``hf`` rollout, with the overrides of
``recipes.verl_ext.plugin.cpu_overrides`` and fixed seeds (model init, prompt order, sampling):

==========================  =====  ========================================================================
run                         steps  what is asserted (numbers from verl's file logger, one JSON line per step)
==========================  =====  ========================================================================
KL-PPO (GAE, critic, KL       4    the batch is split over 2 ranks; rollout == actor on both; every weight
in reward and in loss),            sync ran through the resharder (bytes measured == planned), each rank
world size 2, a rollout            feeding its own hf server, checked by checksum on both sides; the critic
server per rank (rollout           trains; KL to the reference is 0 at step 1, then > 0
tensor_model_parallel_size=1)
==========================  =====  ========================================================================

One launch covers what two did (GRPO at world size 2 and KL-PPO at world size 1): the recipes' runs cover GRPO at
world size 2 with one server fed by rank 0 on the same trainer and plugin (``test_interrupt.py``).

"rollout == actor": see ``tests/e2e/checks.py``. Learning (reward rising over 12 steps) and the run without weight
sync are asserted through the recipes, on the same trainer and plugin (``test_recipes_cpu.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from recipes.verl_ext.demo.run import RunResult, demo_overrides, run_main_ppo
from recipes.verl_ext.plugin.weight_sync import SYNC_LOG_ENV, read_sync_log
from tests.conftest import SECOND_TRAINING_GROUP
from tests.e2e.checks import (
    assert_every_sync_checked_by_checksum,
    assert_rollout_is_the_actor,
    assert_the_batch_is_split_over,
    assert_weight_sync_through_the_resharder,
)

pytestmark = [pytest.mark.e2e, pytest.mark.ray, pytest.mark.slow, pytest.mark.xdist_group(SECOND_TRAINING_GROUP)]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def assets():
    from recipes.verl_ext.demo import ensure_tiny_assets

    return ensure_tiny_assets()


def _run(assets, tmp_path_factory, name: str, *, algo: str, world_size: int, steps: int, extra=()) -> RunResult:
    workdir = tmp_path_factory.mktemp(name)
    result = run_main_ppo(
        demo_overrides(assets, algo=algo, world_size=world_size, steps=steps, extra=extra),
        workdir=workdir,
        # the checkout first on the path, as for the recipes' runs (an installed copy of the pack may be older)
        env={SYNC_LOG_ENV: str(workdir / "weight_sync.jsonl"), "PYTHONPATH": str(ROOT)},
        timeout_s=600,
    )
    if result.returncode != 0 or len(result.metrics) != steps:
        pytest.fail(
            f"{name}: exit code {result.returncode}, {len(result.metrics)}/{steps} steps logged\n{result.log_tail(80)}"
        )
    return result


@pytest.fixture(scope="module")
def kl_ppo_ws2(assets, tmp_path_factory) -> RunResult:
    # verl's own key for a rollout server per rank (cpu_overrides.world_size(2) gives one server for both)
    return _run(assets, tmp_path_factory, "kl_ppo_ws2", algo="kl_ppo", world_size=2, steps=4,
                extra=("actor_rollout_ref.rollout.tensor_model_parallel_size=1",))


def test_the_batch_is_split_and_rollout_and_actor_stay_in_step(kl_ppo_ws2):
    assert_the_batch_is_split_over(kl_ppo_ws2, ranks=2)
    assert_rollout_is_the_actor(kl_ppo_ws2)
    log = kl_ppo_ws2.log_path.parent / "weight_sync.jsonl"
    assert_weight_sync_through_the_resharder(log, world_size=2, rollout_tp=1, steps=4)  # every rank a feeder
    syncs = read_sync_log(log)
    assert all(sync["feeder"] for sync in syncs)
    assert_every_sync_checked_by_checksum(syncs)  # so both sides on every rank


def test_kl_ppo_trains_the_critic_with_kl_to_the_reference(kl_ppo_ws2):
    assert all(loss > 0 for loss in kl_ppo_ws2.series("critic/vf_loss"))
    assert len(kl_ppo_ws2.series("critic/values/mean")) == 4
    kl_loss, kl_penalty = kl_ppo_ws2.series("actor/kl_loss"), kl_ppo_ws2.series("actor/reward_kl_penalty")
    assert kl_loss[0] == pytest.approx(0, abs=1e-6), "step 1: the actor is the reference"
    # both grow from 0; the in-reward estimate (k1, a batch mean) can dip below 0 on one step
    assert kl_loss[-1] > 1e-4 and max(kl_penalty[1:]) > 1e-3, f"kl loss {kl_loss}, reward kl penalty {kl_penalty}"
