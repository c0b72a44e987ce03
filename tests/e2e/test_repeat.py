"""KL-PPO repeats step for step: ``python -m recipes.kl_ppo`` run twice on one machine prints the same steps.

The GRPO demo's repeat is tested with the demo (tests/e2e/test_demo.py). KL-PPO adds a critic, whose new value head
verl draws from whatever state the worker's generator is in; the plugin draws it from a fixed seed
(``VALUE_HEAD_SEED``, recipes/verl_ext/plugin/patches.py). Four steps are enough: a head drawn otherwise changes the
values, so the advantages and the printed value loss, from step 1.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.checks import step_lines

pytestmark = [pytest.mark.e2e, pytest.mark.ray, pytest.mark.slow]

STEPS = 4


def _critic(workdir) -> list[tuple[float, float]]:
    """Each step's value loss and mean value, from the run folder's metrics."""
    (metrics,) = (workdir / "runs" / "kl_ppo").glob("*/metrics.jsonl")
    rows = [json.loads(line)["data"] for line in metrics.read_text().splitlines()]
    return [(row["critic/vf_loss"], row["critic/values/mean"]) for row in rows]


def test_kl_ppo_run_twice_prints_the_same_steps(recipe_cli, tmp_path):
    printed, critic = [], []
    for name in ("first", "second"):
        workdir = tmp_path / name
        workdir.mkdir()
        proc = recipe_cli("kl_ppo", f"trainer.total_training_steps={STEPS}", cwd=workdir, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        printed.append(step_lines(proc.stdout))
        critic.append(_critic(workdir))
    assert len(printed[0]) == STEPS, printed[0]
    assert printed[1] == printed[0]
    # the critic too, to the last bits that sums taken in another order may move
    for (loss, value), (loss_again, value_again) in zip(*critic, strict=True):
        assert loss_again == pytest.approx(loss, rel=1e-5) and value_again == pytest.approx(value, rel=1e-5, abs=1e-7)
