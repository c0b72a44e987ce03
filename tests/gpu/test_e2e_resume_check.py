"""scripts/gpu/e2e_resume_check.py on run folders written here: the step numbering and the KL controller's saved state
read back by the resumed run, the reward margin against the step-to-step spread, and a resume that does not hold."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu" / "e2e_resume_check.py"


def _run_folder(path: Path, steps, rewards, coefs, saves) -> Path:
    path.mkdir(parents=True)
    lines = [
        json.dumps({"step": s, "data": {"critic/score/mean": r, "kl_control/loss_coef": c}})
        for s, r, c in zip(steps, rewards, coefs, strict=True)
    ]
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    for step, coef in saves.items():
        folder = path / "checkpoints" / f"global_step_{step}"
        folder.mkdir(parents=True)
        state = {"step": step, "target": 0.1, "loss_coef": coef, "reward_coef": None, "history": []}
        (folder / "kl_control.json").write_text(json.dumps({"settings": {}, "state": state}))
    return path


def _check(tmp_path, resumed_coefs, resumed_steps=range(5, 9)) -> tuple[int, dict, str]:
    rewards = [0.10, 0.12, 0.11, 0.13, 0.20, 0.22, 0.21, 0.23]
    coefs = [0.05, 0.04, 0.032, 0.0256, 0.02048, 0.016, 0.013, 0.011]
    first = _run_folder(tmp_path / "first", range(1, 9), rewards, coefs, {4: 0.02048, 8: 0.009})
    resumed = _run_folder(tmp_path / "resumed", resumed_steps, rewards[4:], resumed_coefs, {8: 0.009})
    out = tmp_path / "check.json"
    args = [sys.executable, str(SCRIPT), str(first), str(resumed), "--save-step", "4", "--k", "2", "--json", str(out)]
    run = subprocess.run(args, capture_output=True, text=True)
    return run.returncode, json.loads(out.read_text()), run.stdout


def test_a_resume_that_holds_and_the_reward_margin(tmp_path):
    rc, result, stdout = _check(tmp_path, [0.02048, 0.016, 0.013, 0.011])
    assert rc == 0, stdout
    resume, learning = result["resume"], result["learning"]
    assert resume["numbering_ok"] and resume["kl_state_read_back"]
    assert resume["resumed_first_coef"] == resume["saved_coef"] == 0.02048
    assert resume["first_resumed_step_equal"] and all(resume["first_resumed_step_equal"].values())
    assert resume["coef_max_abs_diff"] == 0.0 and resume["coef_steps_compared"] == 4
    assert resume["final_kl_state_equal"] == {"step": True, "loss_coef": True, "reward_coef": True}
    # first 2 steps 0.11, last 2 steps 0.22; consecutive differences .02 -.01 .02 .07 .02 -.01 .02
    assert learning["margin"] == pytest.approx(0.11)
    assert learning["step_to_step_spread"] == pytest.approx(0.026726, abs=1e-6)  # sample stdev: sqrt(0.0042857 / 6)
    assert learning["margin_over_spread"] == pytest.approx(4.116, abs=1e-3)
    assert "margin +0.110" in stdout


def test_a_coefficient_read_back_through_float_rounding_holds(tmp_path):
    """H200, 2026-12-05: the checkpoint held 0.049999999999999996 and the resumed step logged 0.05: the same value
    (the script said False before)."""
    rc, result, stdout = _check(tmp_path, [0.02048 * (1 + 1e-15), 0.016, 0.013, 0.011])
    assert rc == 0, stdout
    assert result["resume"]["kl_state_read_back"] is True
    assert result["resume"]["saved_equals_used"] == {"kl_control/loss_coef": True}


@pytest.mark.parametrize(
    ("coefs", "steps", "broken"),
    [
        pytest.param([0.05, 0.016, 0.013, 0.011], range(5, 9), "kl_state_read_back", id="controller-restarted"),
        pytest.param([0.02048, 0.016, 0.013, 0.011], range(1, 5), "numbering_ok", id="steps-restarted"),
    ],
)
def test_a_resume_that_does_not_hold_exits_1(tmp_path, coefs, steps, broken):
    rc, result, _ = _check(tmp_path, coefs, steps)
    assert rc == 1
    assert result["resume"][broken] is False


def _kl_ppo_folder(path: Path, steps, used, updated, saves) -> Path:
    """KL-PPO's metrics: verl's applied in-reward coefficient and the controller's update from the step's KL."""
    path.mkdir(parents=True)
    lines = [
        json.dumps({"step": s, "data": {"critic/score/mean": 0.1 + 0.01 * s * s, "kl_control/loss_coef": 0.05,
                                        "actor/reward_kl_penalty_coeff": u, "kl_control/reward_coef": n}})
        for s, u, n in zip(steps, used, updated, strict=True)
    ]
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    for step, coef in saves.items():
        folder = path / "checkpoints" / f"global_step_{step}"
        folder.mkdir(parents=True)
        state = {"step": step, "target": 0.1, "loss_coef": 0.05, "reward_coef": coef, "history": []}
        (folder / "kl_control.json").write_text(json.dumps({"settings": {}, "state": state}))
    return path


@pytest.mark.parametrize(("resumed_used", "rc"), [(0.0332, 0), (0.05, 1)], ids=["restored", "restarted"])
def test_kl_ppo_resume_is_judged_by_the_coefficient_its_first_step_applies(tmp_path, resumed_used, rc):
    """H200, 2026-12-01: the resumed step 11 applied the saved 0.03324 as the first run did, and the controller's
    update from step 11's KL then differed (0.03457 against 0.03241: a different sampled batch). That holds."""
    first = _kl_ppo_folder(tmp_path / "first", range(1, 5), [0.05, 0.048, 0.0346, 0.0332],
                           [0.048, 0.0346, 0.0332, 0.0324], {2: 0.0346, 3: 0.0332})
    resumed = _kl_ppo_folder(tmp_path / "resumed", [4], [resumed_used], [0.0346], {})
    out = tmp_path / "check.json"
    args = [sys.executable, str(SCRIPT), str(first), str(resumed), "--save-step", "3", "--k", "1", "--json", str(out)]
    run = subprocess.run(args, capture_output=True, text=True)
    resume = json.loads(out.read_text())["resume"]
    assert run.returncode == rc, run.stdout
    assert resume["saved_coef"] == 0.0332 and resume["resumed_first_coef"] == resumed_used
    assert resume["kl_state_read_back"] is (rc == 0)
    assert resume["coef_max_abs_diff"] == pytest.approx(abs(resumed_used - 0.0332))
