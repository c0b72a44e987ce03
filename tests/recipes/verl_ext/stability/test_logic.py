"""The stability package's logic without a training run: schedules, controller state, guard, bands, degradations."""

from __future__ import annotations

import json
import math

import pytest
from omegaconf import OmegaConf

from recipes.verl_ext.stability.bands import BandTally, RollbackRule, bands_from_config, evaluate
from recipes.verl_ext.stability.entropy import entropy_warnings
from recipes.verl_ext.stability.faults import classify, exit_description
from recipes.verl_ext.stability.guard import KLGuard, scalar
from recipes.verl_ext.stability.kl_control import (
    KLControl,
    KLSettings,
    log_error,
    one_step_factors,
    pi_update,
    proportional_update,
    ramp_target,
)
from recipes.verl_ext.stability.rollback import degrade


def _cfg(*overrides):
    from recipes.compose.compose import compose_recipe

    return compose_recipe("grpo", ["parallel=cpu", "cluster=cpu", "rollout=hf", "model=tiny", "task=tiny", *overrides])


def test_ramp_moves_target_from_start_to_end():
    assert [ramp_target(s, 0.1, 0.3, 4) for s in range(6)] == pytest.approx([0.1, 0.15, 0.2, 0.25, 0.3, 0.3])


def test_proportional_rule_follows_verl_and_state_round_trips(tmp_path):
    control = KLControl(KLSettings(mode="adaptive", rule="proportional", target=0.1, horizon=100.0,
                                   init_loss_coef=0.01))
    coefs = [control.state.loss_coef]
    for step, kl in enumerate([0.5, 0.5, 0.0, 0.1], start=1):
        control.update(step, kl, n_sequences=10)
        coefs.append(control.state.loss_coef)
    # KL above target: +20% error * 10/100 per step; below: -20%; on target: unchanged
    assert coefs == pytest.approx([0.01, 0.0102, 0.010404, 0.01019592, 0.01019592])
    assert proportional_update(1.0, 0.2, 0.1, 100, 100.0) == pytest.approx(1.2)
    control.save(tmp_path)
    restored = KLControl(KLSettings(mode="adaptive", target=0.1))
    assert restored.load(tmp_path)
    assert restored.state_dict() == control.state_dict()  # exactly, floats included
    assert json.loads((tmp_path / "kl_control.json").read_text())["state"]["loss_coef"] == control.state.loss_coef


def test_pi_rule_moves_both_coefficients_by_a_bounded_multiple():
    control = KLControl(KLSettings(mode="adaptive", target=0.1, init_loss_coef=0.05, init_reward_coef=0.02,
                                   kp=1.0, ki=0.5, max_step=0.7, lookahead=0.0))
    assert control.drives_reward_coef
    # step 1: KL 0 (loss side) and 1e-4 (in reward, a KL of 0 there is not a measurement) are the lower clip,
    # e = -2: kp*(-2 - 0) + ki*(-2) = -3, bounded to -0.7
    control.update(1, 0.0, 40, reward_kl=1e-4)
    assert control.state.loss_coef == pytest.approx(0.05 * math.exp(-0.7))
    assert control.state.reward_coef == pytest.approx(0.02 * math.exp(-0.7))
    # step 2: KL at e**0.5 x target: e = 0.5, change = 1.0 * (0.5 - -2) + 0.5 * 0.5 -> bounded to +0.7
    before = control.state.loss_coef
    metrics = control.update(2, 0.1 * math.exp(0.5), 40, reward_kl=None)
    assert control.state.loss_coef == pytest.approx(before * math.exp(0.7))
    assert control.state.reward_coef == pytest.approx(0.02 * math.exp(-0.7))  # not measured: unchanged
    assert metrics["kl_control/loss_coef"] == before and metrics["kl_control/reward_coef"] == control.state.reward_coef
    # step 3: on target after 0.5: e = 0 -> change = 1.0 * (0 - 0.5) = -0.5 (the KL fell: the coefficient eases)
    before = control.state.loss_coef
    control.update(3, 0.1, 40)
    assert control.state.loss_coef == pytest.approx(before * math.exp(-0.5))
    # a KL that stays above target keeps raising it: the integral part
    before = control.state.loss_coef
    control.update(4, 0.2, 40)
    control.update(5, 0.2, 40)
    step5 = math.log(2) * 0.5
    assert control.state.loss_coef == pytest.approx(before * math.exp(min(math.log(2) * 1.5, 0.7) + step5))


def test_pi_lookahead_extrapolates_the_kls_last_change(tmp_path):
    control = KLControl(KLSettings(mode="adaptive", target=0.1, init_loss_coef=1.0, kp=0.0, ki=1.0, max_step=5.0,
                                   lookahead=1.0))
    control.update(1, 0.1, 8)  # no earlier KL: the measured one, on target
    assert control.state.loss_coef == pytest.approx(1.0)
    control.update(2, 0.15, 8)  # rising by 0.05: taken as 0.2 next step, twice the target
    assert control.state.loss_coef == pytest.approx(2.0)
    control.save(tmp_path)
    restored = KLControl(control.settings)
    assert restored.load(tmp_path) and restored.state_dict() == control.state_dict()
    restored.update(3, 0.15, 8)
    control.update(3, 0.15, 8)
    assert restored.state.loss_coef == control.state.loss_coef == pytest.approx(2.0 * 1.5)


def test_pi_pieces():
    assert log_error(0.0, 0.1) == -2.0 and log_error(100.0, 0.1) == 2.0
    assert log_error(0.2, 0.1) == pytest.approx(math.log(2))
    assert pi_update(1.0, 0.0, None, 1.0, 0.5, 0.7) == 1.0  # on target from the start: no change
    assert pi_update(1e-6, -2.0, -2.0, 1.0, 0.5, 0.7) == 1e-6  # the floor


def test_proportional_rule_leaves_the_in_reward_coefficient_to_verl():
    control = KLControl(KLSettings(mode="adaptive", rule="proportional", target=0.1, init_reward_coef=0.02))
    assert not control.drives_reward_coef
    control.update(1, None, 8, reward_kl=1.0)
    assert control.state.reward_coef == 0.02


def test_fixed_mode_leaves_coefficient():
    control = KLControl(KLSettings(mode="fixed", init_loss_coef=0.001))
    metrics = control.update(1, 5.0, 40)
    assert control.state.loss_coef == 0.001 and "kl_control/target" not in metrics


def test_settings_from_each_kl_option():
    assert KLSettings.from_config(_cfg("kl=ramp", "kl.ramp.steps=4")).ramp_steps == 4
    adaptive = KLSettings.from_config(_cfg("kl=adaptive"))
    assert (adaptive.mode, adaptive.target, adaptive.max_kl) == ("adaptive", 0.1, 0.5)


def test_guard_stops_after_the_update_that_passes_max_kl():
    guard = KLGuard(0.5, planned=8)
    seen = []
    for i in guard.iterate(range(8)):
        seen.append(i)
        guard.observe([0.0, 0.1, 0.7, 0.2][i] if i < 4 else 0.0)
    assert seen == [0, 1, 2]
    assert guard.metrics() == {"guard/stopped": 1.0, "guard/updates": 3.0, "guard/planned": 8.0, "guard/kl": 0.7}
    quiet = KLGuard(0.5, planned=2)
    for _ in quiet.iterate(range(2)):
        quiet.observe(0.1)
    assert quiet.metrics()["guard/stopped"] == 0.0 and quiet.metrics()["guard/updates"] == 2.0
    nan = KLGuard(0.5, planned=2)
    assert nan.observe(float("nan"))
    assert scalar([1.0, 3.0]) == 2.0 and scalar(None) is None


def test_bands_warn_count_and_summarize(tmp_path):
    bands = bands_from_config(_cfg())
    assert {b.name for b in bands} == {"kl_mean", "grad_norm", "entropy", "weight_sync_s", "comm_share"}
    tally = BandTally(bands)
    # the embedded default's bands (task/tiny: KL <= 0.6; cluster/cpu: weight sync <= 1 s)
    step1 = {"actor/kl_loss": 0.1, "actor/grad_norm": 2.0, "actor/entropy": 0.01, "timing_s/update_weights": 1.5,
             "timing_s/step": 3.0}
    found = {v.band: v for v in tally.add(1, step1)}
    assert set(found) == {"grad_norm", "entropy", "weight_sync_s", "comm_share"}
    assert found["grad_norm"].unstable and found["entropy"].unstable and not found["comm_share"].unstable
    tally.add(2, {"actor/kl_loss": 0.9, "actor/grad_norm": 0.5})
    rows = {r["band"]: r for r in tally.rows()}
    assert rows["kl_mean"]["violations"] == 1 and rows["kl_mean"]["high"] == 1 and rows["grad_norm"]["steps"] == 2
    json_path, txt_path = tally.write(tmp_path)
    assert json.loads(json_path.read_text())["summary"][0]["band"] == "kl_mean"
    assert "grad_norm" in txt_path.read_text()
    assert bands_from_config(_cfg("monitor=off")) == []
    assert evaluate({"actor/grad_norm": float("inf")}, bands)[0].side == "nan"


def test_the_summary_counts_every_step_out_of_a_band_on_each_side():
    """Five steps of entropy (band >= 0.1) and grad norm (band <= 1.0), the counts written out by hand: a run's
    summary with at most one violation a band cannot tell a tally that keeps only the first, or drops a side."""
    tally = BandTally(bands_from_config(_cfg()))
    entropy = [0.05, 0.2, 0.02, 0.01, 0.3]  # below 0.1 at steps 1, 3, 4
    grad_norm = [1.5, 0.4, 2.0, 0.9, 1.1]  # above 1.0 at steps 1, 3, 5
    for step, (e, g) in enumerate(zip(entropy, grad_norm, strict=True), start=1):
        tally.add(step, {"actor/entropy": e, "actor/grad_norm": g})
    rows = {r["band"]: r for r in tally.rows()}
    assert (rows["entropy"]["violations"], rows["entropy"]["low"], rows["entropy"]["high"]) == (3, 3, 0)
    assert (rows["grad_norm"]["violations"], rows["grad_norm"]["low"], rows["grad_norm"]["high"]) == (3, 0, 3)
    assert rows["entropy"]["first_violation_step"] == 1 and rows["grad_norm"]["steps"] == 5
    assert rows["grad_norm"]["max"] == 2.0 and rows["entropy"]["min"] == 0.01


def test_degradations_in_order():
    # the driver degrades the resolved config (no interpolation left): every engine's own key is set
    cfg = OmegaConf.create(OmegaConf.to_container(_cfg("overlap=prefetch"), resolve=True))
    assert cfg.actor_rollout_ref.actor.fsdp_config.forward_prefetch is True
    changed = degrade(cfg, "forward_prefetch_off")
    assert cfg.actor_rollout_ref.actor.fsdp_config.forward_prefetch is False and changed
    assert cfg.critic.fsdp.forward_prefetch is False and cfg.actor_rollout_ref.ref.fsdp_config.forward_prefetch is False
    micro = cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu
    degrade(cfg, "batch_minus_20")
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == int(micro * 0.8)
    degrade(cfg, "offload_on")
    assert cfg.actor_rollout_ref.actor.fsdp_config.param_offload is True
    assert cfg.actor_rollout_ref.actor.fsdp_config.optimizer_offload is True
    assert cfg.critic.fsdp.param_offload is True and cfg.critic.fsdp.optimizer_offload is True


# Ray's stock text for an actor whose worker process died: it names the OOM killer among the possible causes
RAY_ACTOR_DIED = """Traceback (most recent call last):
  File "/x/verl/trainer/main_ppo.py", line 96, in run_ppo
    ray.get(runner.run.remote(config))
ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.
	class_name: TaskRunner
The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: Worker
unexpectedly exits with a connection error code 2. End of file. There are some potential root causes. (1) The process
is killed by SIGKILL by OOM killer due to high memory usage. (2) ray stop --force is called. (3) The worker is crashed
unexpectedly due to SIGSEGV or other unexpected errors.
"""


def test_failure_reasons_come_from_the_exception_types_not_the_words():
    assert classify("RuntimeError: StabilityFault[nan_loss] actor/pg_loss=nan at step 3") == "nan_loss"
    assert classify(RAY_ACTOR_DIED) == "worker_lost"  # "OOM killer" in the text is no out-of-memory error
    cuda = "ray.exceptions.RayTaskError(OutOfMemoryError): ...\ntorch.OutOfMemoryError: CUDA out of memory. Tried"
    assert classify(cuda) == "oom"
    assert classify("Traceback ...\nMemoryError") == "oom"  # the host's: Python's MemoryError
    assert classify("ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.") == "oom"
    nan = "RuntimeError: probability tensor contains either `inf`, `nan` or element < 0"
    assert classify(nan) == "nan_weights"
    assert classify("FileNotFoundError: data.parquet is not an oom") == "error"
    assert classify("", exitcode=-9) == "worker_lost" and exit_description(-9) == "was killed by SIGKILL"
    assert classify("", exitcode=1) == "error"


def test_one_step_factors_are_the_rules_extremes():
    # 160 sequences over a horizon of 40: the rule's step is 0.2 * 4 = 0.8 (the 0.5B GPU run's 0.2x a step)
    low, high = one_step_factors(160, 40.0)
    assert (low, high) == pytest.approx((0.2, 1.8))
    assert proportional_update(1.0, 0.0, 0.1, 160, 40.0) == pytest.approx(low)  # KL far below the target
    assert proportional_update(1.0, 9.9, 0.1, 160, 40.0) == pytest.approx(high)  # far above
    # from n = horizon / 0.2 on, a KL below its target zeroes the coefficient or flips its sign
    assert one_step_factors(200, 40.0)[0] == pytest.approx(0.0)
    assert proportional_update(1.0, 0.0, 0.1, 256, 40.0) == pytest.approx(-0.28)


def test_entropy_warning_only_on_policy():
    assert entropy_warnings(_cfg("entropy=clip_cov")) and entropy_warnings(_cfg("entropy=kl_cov"))
    assert not entropy_warnings(_cfg("entropy=none"))
    assert not entropy_warnings(_cfg("entropy=kl_cov", "actor_rollout_ref.actor.ppo_mini_batch_size=4"))
    assert not entropy_warnings(_cfg("entropy=clip_cov", "actor_rollout_ref.actor.ppo_epochs=2"))


def test_stability_options_select_the_pack_trainer():
    for option in ("off", "auto"):
        cfg = _cfg(f"stability={option}")
        assert cfg.trainer.v1.trainer_mode == "stability" and cfg.stability.mode == option
        assert OmegaConf.select(cfg, "stability.inject.nan_at_step") is None


# the demo's KL per step (README, "Demo": task=tiny, kl=ramp), past its band (<= 0.6) in the last 4 steps
DEMO_KL = [0.0, 0.0171, 0.0305, 0.0401, 0.0456, 0.0685, 0.0894, 0.1266, 0.1564, 0.18, 0.2409, 0.2978, 0.355, 0.4249,
           0.4987, 0.585, 0.6663, 0.9005, 0.8455, 1.021]


def test_the_demos_normal_kl_rise_does_not_roll_back_but_a_gradient_blow_up_does():
    cfg = _cfg("stability=auto")
    rule = RollbackRule(bands_from_config(cfg), cfg.stability.band_violations)
    for step, kl in enumerate(DEMO_KL, start=1):
        metrics = {"actor/kl_loss": kl, "actor/grad_norm": 0.3, "actor/entropy": 6.0}
        assert rule.check(metrics, step) is None, step
    assert [v.band for v in evaluate({"actor/kl_loss": 1.021}, rule.bands)] == ["kl_mean"]  # it still warns
    found = [rule.check({"actor/kl_loss": 0.1, "actor/grad_norm": g, "actor/entropy": 6.0}, s)
             for s, g in zip((21, 22, 23), (5.0, 7.0, 9.0), strict=True)]
    assert found[:2] == [None, None]
    assert found[2] == "3 steps in a row outside a band at step 23: grad_norm 9 above 1"
    assert RollbackRule(rule.bands, 0).check({"actor/grad_norm": float("nan")}, 1) is None  # stability=off


def test_a_horizon_that_can_flip_the_coefficient_is_accepted_with_a_warning(recipe_main, tmp_path):
    """verl 0.9.1 accepts the task's horizon of 40 with 256 sequences a step, and so does the pack (exit 0); stderr
    says that one step can take the in-reward coefficient to 0.2 * 256/40 below 1, and which horizon keeps it
    positive. The task's own batch gets no such line."""
    warned = recipe_main("kl_ppo", "data.train_batch_size=256", "action=validate", cwd=tmp_path, timeout=300)
    assert warned.returncode == 0, warned.stderr[-2000:]
    assert warned.stdout.startswith("config OK: ")
    (line,) = [x for x in warned.stderr.splitlines() if x.startswith("warning: algorithm.kl_ctrl.horizon")]
    assert line.startswith("warning: algorithm.kl_ctrl.horizon: 40 against 256 sequences a step (data.train_batch_size "
                           "256 x actor_rollout_ref.rollout.n 1): one step of the adaptive rule multiplies the "
                           "in-reward KL coefficient by 1 +- 0.2 * 256/40, between -0.28 and 2.28")
    assert line.endswith("a horizon above 1280 keeps it positive")
    quiet = recipe_main("kl_ppo", "action=validate", cwd=tmp_path, timeout=300)
    assert quiet.returncode == 0 and "kl_ctrl.horizon" not in quiet.stderr, quiet.stderr[-2000:]


def test_the_in_reward_coefficient_follows_an_average_and_ignores_a_zero_kl():
    def control(smoothing: float) -> KLControl:
        return KLControl(KLSettings(mode="adaptive", target=0.1, init_reward_coef=0.05, kp=1.0, ki=0.5, max_step=0.6,
                                    lookahead=0.0, reward_smoothing=smoothing))

    averaged, raw = control(0.5), control(1.0)
    for c in (averaged, raw):
        c.update(1, None, 40, reward_kl=0.0)  # the first step's policy is the reference: no measurement
        assert c.state.reward_coef == 0.05 and c.state.reward_kl_average is None
        c.update(2, None, 40, reward_kl=0.08)
    # step 2, both: the average starts at 0.08; e = log(0.8); change = 1.0 * (e - 0) + 0.5 * e
    e2 = math.log(0.8)
    assert averaged.state.reward_coef == pytest.approx(0.05 * math.exp(1.5 * e2))
    assert raw.state.reward_coef == averaged.state.reward_coef
    averaged.update(3, None, 40, reward_kl=0.16)
    raw.update(3, None, 40, reward_kl=0.16)
    # step 3, averaged: 0.5 * 0.16 + 0.5 * 0.08 = 0.12, e = log(1.2): change = (e - e2) + 0.5 * e = 0.497
    e3 = math.log(1.2)
    assert averaged.state.reward_kl_average == pytest.approx(0.12)
    assert averaged.state.reward_coef == pytest.approx(0.05 * math.exp(1.5 * e2) * math.exp((e3 - e2) + 0.5 * e3))
    # raw: e = log(1.6): change = (0.470 + 0.223) + 0.235 = 0.93, bounded to 0.6
    assert raw.state.reward_coef == pytest.approx(0.05 * math.exp(1.5 * e2) * math.exp(0.6))
    # the average is part of the saved state: a resumed run continues it
    restored = control(0.5)
    restored.load_state_dict(json.loads(json.dumps(averaged.state_dict())))
    assert restored.state.reward_kl_average == averaged.state.reward_kl_average
