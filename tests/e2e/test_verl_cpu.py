"""verl's own entry point, ``python -m verl.trainer.main_ppo``, end to end on the CPU with the tiny assets.

Four runs of verl 0.9.1's default (v1, TransferQueue) trainer, FSDP2 over gloo, the plugin's ``hf`` rollout, with
the overrides of ``hybrid_engine.verl_plugin.cpu_overrides`` and fixed seeds (model init, prompt order, sampling):

========================  =====  ==========================================================================
run                       steps  what is asserted (numbers from verl's file logger, one JSON line per step)
========================  =====  ==========================================================================
GRPO, world size 1          12   mean reward of the last 3 steps >= first 3 + 0.15; rollout == actor
GRPO, world size 1, no      4    rollout == actor at step 1 only; then the gap grows, and ends 100x above
sync of weights                  the synced run's worst step
GRPO, world size 2          4    the batch is split over 2 ranks; rollout == actor on both
KL-PPO (GAE, critic, KL     4    critic trains; KL to the reference is 0 at step 1, then > 0; rollout ==
in reward and in loss)           actor
========================  =====  ==========================================================================

"rollout == actor": at every step verl's ``training/rollout_probs_diff_max`` (the largest |p_rollout - p_actor| over
the response tokens: the probability the hf server sampled each token with, against the actor's recomputed old
log-prob) and ``|rollout_corr/kl|`` (the KL between the two, in log space) stay below 1e-5, i.e. the rollout
generated with the actor's weights. About 6 minutes on 2 cores.
"""

from __future__ import annotations

import statistics

import pytest

from hybrid_engine.verl_plugin.demo_run import RunResult, demo_overrides, run_main_ppo
from hybrid_engine.verl_plugin.hf_rollout import SYNC_WEIGHTS_ENV

pytestmark = [pytest.mark.e2e, pytest.mark.ray, pytest.mark.slow]

SYNCED_GAP = 1e-5
DIFF_MAX = "training/rollout_probs_diff_max"
DIFF_MEAN = "training/rollout_probs_diff_mean"
ROLLOUT_KL = "rollout_corr/kl"
REWARD = "critic/score/mean"


@pytest.fixture(scope="module")
def assets():
    from hybrid_engine.assets import ensure_tiny_assets

    return ensure_tiny_assets()


def _run(assets, tmp_path_factory, name: str, *, algo: str, world_size: int, steps: int, env=None) -> RunResult:
    result = run_main_ppo(
        demo_overrides(assets, algo=algo, world_size=world_size, steps=steps),
        workdir=tmp_path_factory.mktemp(name),
        env=env,
        timeout_s=600,
    )
    if result.returncode != 0 or len(result.metrics) != steps:
        pytest.fail(
            f"{name}: exit code {result.returncode}, {len(result.metrics)}/{steps} steps logged\n{result.log_tail(80)}"
        )
    return result


@pytest.fixture(scope="module")
def grpo(assets, tmp_path_factory) -> RunResult:
    return _run(assets, tmp_path_factory, "grpo_ws1", algo="grpo", world_size=1, steps=12)


@pytest.fixture(scope="module")
def grpo_no_sync(assets, tmp_path_factory) -> RunResult:
    env = {SYNC_WEIGHTS_ENV: "0"}
    return _run(assets, tmp_path_factory, "grpo_no_sync", algo="grpo", world_size=1, steps=4, env=env)


@pytest.fixture(scope="module")
def grpo_ws2(assets, tmp_path_factory) -> RunResult:
    return _run(assets, tmp_path_factory, "grpo_ws2", algo="grpo", world_size=2, steps=4)


@pytest.fixture(scope="module")
def kl_ppo(assets, tmp_path_factory) -> RunResult:
    return _run(assets, tmp_path_factory, "kl_ppo_ws1", algo="kl_ppo", world_size=1, steps=4)


def _assert_rollout_is_the_actor(result: RunResult) -> None:
    gaps = result.series(DIFF_MAX)
    assert len(gaps) == len(result.metrics), "the hf rollout returned no log-probs"
    assert max(gaps) < SYNCED_GAP, f"rollout/actor probability gap per step: {gaps}"
    kls = result.series(ROLLOUT_KL)
    assert len(kls) == len(result.metrics) and max(abs(kl) for kl in kls) < SYNCED_GAP, f"rollout/actor KL: {kls}"


def test_grpo_reward_rises(grpo):
    rewards = grpo.series(REWARD)
    first, last = statistics.mean(rewards[:3]), statistics.mean(rewards[-3:])
    assert last >= first + 0.15, f"mean reward per step: {[round(r, 3) for r in rewards]}"
    assert grpo.series("actor/grad_norm")[0] > 0


def test_grpo_rollout_uses_the_actors_weights_every_step(grpo):
    _assert_rollout_is_the_actor(grpo)


def test_without_weight_sync_the_rollout_actor_gap_grows(grpo, grpo_no_sync):
    gaps, means = grpo_no_sync.series(DIFF_MAX), grpo_no_sync.series(DIFF_MEAN)
    assert gaps[0] < SYNCED_GAP, "before the first update the rollout and the actor hold the same weights"
    assert means[-1] > means[1] > means[0], f"mean gap per step: {means}"
    assert gaps[-1] > 100 * max(grpo.series(DIFF_MAX)), f"gap per step without sync: {gaps}"
    kls = grpo_no_sync.series(ROLLOUT_KL)
    assert abs(kls[0]) < SYNCED_GAP and kls[-1] > 0.01, f"rollout/actor KL per step without sync: {kls}"


def test_grpo_world_size_2_splits_the_batch_and_keeps_rollout_and_actor_in_step(grpo_ws2):
    for step in grpo_ws2.metrics:
        # verl balances the batch over the data-parallel ranks: each holds half of the step's tokens
        assert step["global_seqlen/mean"] * 2 == pytest.approx(step["perf/total_num_tokens"], abs=1)
    _assert_rollout_is_the_actor(grpo_ws2)
    assert all(norm > 0 for norm in grpo_ws2.series("actor/grad_norm"))


def test_kl_ppo_trains_the_critic_with_kl_to_the_reference(kl_ppo):
    assert all(loss > 0 for loss in kl_ppo.series("critic/vf_loss"))
    assert len(kl_ppo.series("critic/values/mean")) == 4
    kl_loss, kl_penalty = kl_ppo.series("actor/kl_loss"), kl_ppo.series("actor/reward_kl_penalty")
    assert kl_loss[0] == pytest.approx(0, abs=1e-6), "step 1: the actor is the reference"
    assert kl_loss[-1] > 1e-4 and kl_penalty[-1] > 1e-3, f"kl loss {kl_loss}, reward kl penalty {kl_penalty}"
    _assert_rollout_is_the_actor(kl_ppo)
