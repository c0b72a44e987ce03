"""A -m sweep gets the single run's handling: every job is composed and checked before the first one starts; a
problem in any job refuses the whole sweep with exit 2, one line per problem naming its job, no traceback, and
nothing on disk (no multirun-* folder, no runs/)."""

from __future__ import annotations

import hydra
import pytest

from recipes import launch
from recipes.cluster.sweep import expand_jobs, sweep_problems

ISSUE_GROUP = "config error: job 0 (kl=fixd): kl=fixd: no such option; choose from adaptive, fixed, ramp"
ISSUE_KEY = ("config error: every job: actor_rollout_ref.actor.optim.lrr: no such key (did you mean "
             "actor_rollout_ref.actor.optim.lr?); to add a new key write +actor_rollout_ref.actor.optim.lrr=VALUE")


def _refused(proc, tmp_path) -> list[str]:
    """The error lines of a refused sweep, after checking what every refusal promises."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "Traceback" not in out and "HYDRA_FULL_ERROR" not in out
    assert "Launching" not in out  # Hydra's launcher never started
    assert list(tmp_path.iterdir()) == [], "a refused sweep must leave nothing behind"
    return proc.stderr.strip().splitlines()


def test_issue_sweep_with_a_misspelt_group_option(tmp_path, recipe_cli):
    """The issue's first command (a real training sweep when valid): Hydra's 14 lines and exit 1 before."""
    proc = recipe_cli("grpo", "-m", "kl=fixd,adaptive", "trainer.total_training_steps=1", cwd=tmp_path, timeout=300)
    assert _refused(proc, tmp_path) == [ISSUE_GROUP]
    assert proc.stdout == ""


def test_issue_sweep_with_a_misspelt_key(tmp_path, recipe_cli):
    """The issue's second command: Hydra's "Key 'lrr' is not in struct" before; both jobs share the problem."""
    proc = recipe_cli("grpo", "-m", "actor_rollout_ref.actor.optim.lrr=1e-6,2e-6", "trainer.total_training_steps=1",
                      cwd=tmp_path, timeout=300)
    assert _refused(proc, tmp_path) == [ISSUE_KEY]


@pytest.fixture
def watched(monkeypatch):
    """Calls of Hydra's main and of the job's perform step: a refused sweep makes neither."""
    calls: list[str] = []
    real_main = hydra.main

    def main(*args, **kwargs):
        calls.append("hydra.main")
        return real_main(*args, **kwargs)

    def perform(run):
        calls.append("perform")

    monkeypatch.setattr(hydra, "main", main)
    monkeypatch.setattr(launch, "perform", perform)
    return calls


def test_one_bad_job_of_three_refuses_the_sweep_and_names_only_that_job(tmp_path, recipe_main, watched):
    proc = recipe_main("grpo", "-m", "actor_rollout_ref.rollout.n=2,0,4", "action=validate", cwd=tmp_path)
    assert _refused(proc, tmp_path) == [
        "config error: job 1 (actor_rollout_ref.rollout.n=0): actor_rollout_ref.rollout.n: must be a positive "
        "integer, got 0"]
    assert watched == []
    assert proc.stderr.count("no GPU found") == 0  # a refused command gets its error lines only, as a single run


def test_each_jobs_problems_are_its_own_lines(tmp_path, recipe_main, watched):
    proc = recipe_main("grpo", "-m", "kl=fixd,adaptive", "actor_rollout_ref.rollout.n=0,2", "action=validate",
                       cwd=tmp_path)
    assert _refused(proc, tmp_path) == [
        "3 config errors:",
        "  - job 0 (kl=fixd, actor_rollout_ref.rollout.n=0): kl=fixd: no such option; choose from adaptive, fixed, "
        "ramp",
        "  - job 1 (kl=fixd, actor_rollout_ref.rollout.n=2): kl=fixd: no such option; choose from adaptive, fixed, "
        "ramp",
        "  - job 2 (kl=adaptive, actor_rollout_ref.rollout.n=0): actor_rollout_ref.rollout.n: must be a positive "
        "integer, got 0",
    ]
    assert watched == []


def test_a_problem_every_job_has_is_one_line(tmp_path, recipe_main, watched):
    proc = recipe_main("grpo", "-m", "kl=fixed,adaptive", "actor_rollout_ref.rollout.n=0", "action=validate",
                       cwd=tmp_path)
    assert _refused(proc, tmp_path) == [
        "config error: every job: actor_rollout_ref.rollout.n: must be a positive integer, got 0"]
    assert watched == []


def test_an_override_hydra_cannot_read_is_one_line(tmp_path, recipe_main, watched):
    proc = recipe_main("grpo", "-m", "kl=[fixed", "action=validate", cwd=tmp_path)
    assert _refused(proc, tmp_path) == [
        "config error: command line: cannot parse override: no viable alternative at input '[fixed'"]
    assert watched == []


def test_a_ray_sweep_with_an_invalid_job_submits_nothing(tmp_path, recipe_main, watched):
    """launcher=ray: the klppo_ray launcher reported the bad jobs and submitted the others; the sweep is refused here
    first, as a single run is (no cluster answers at the address: none is needed to refuse it)."""
    proc = recipe_main("grpo", "-m", "launcher=ray", "launcher.address=127.0.0.1:1", "launcher.upload=false",
                       "action=validate", "actor_rollout_ref.actor.ppo_mini_batch_size=8", "data.train_batch_size=8,7",
                       "launcher.python=python,no_such_python", cwd=tmp_path)
    lines = _refused(proc, tmp_path)
    assert lines[0] == "2 config errors:" and len(lines) == 3, lines
    for line, num, python in zip(lines[1:], (2, 3), ("python", "no_such_python"), strict=True):
        assert line == (f"  - job {num} (data.train_batch_size=7, launcher.python={python}): "
                        "actor_rollout_ref.actor.ppo_mini_batch_size: data.train_batch_size(7) must be a multiple of "
                        "ppo_mini_batch_size(8): 7 % 8 = 7")
    assert watched == []


@pytest.mark.slow  # ~5 s on 2 cores: a multirun of validations in-process
def test_a_valid_sweep_is_checked_then_run_by_hydra(tmp_path, recipe_main, monkeypatch):
    checked: list[str] = []
    real = launch.job_problems

    def job_problems(app, config_name, num, overrides):
        checked.append(" ".join(o for o in overrides if o.startswith("actor_rollout_ref.rollout.n=")))
        return real(app, config_name, num, overrides)

    monkeypatch.setattr(launch, "job_problems", job_problems)
    proc = recipe_main("grpo", "-m", "actor_rollout_ref.rollout.n=1,2", "action=validate", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert checked == ["actor_rollout_ref.rollout.n=1", "actor_rollout_ref.rollout.n=2"]
    assert len(list((tmp_path / "runs" / "grpo").glob("multirun-*/*/resolved_config.yaml"))) == 2


def test_jobs_are_split_as_hydras_basic_sweeper_splits_them():
    sweep = expand_jobs(["kl=fixed,adaptive", "hydra.sweep.dir=x", "trainer.total_training_steps=1,2",
                         "action=validate"])
    assert sweep.hydra == ["hydra.sweep.dir=x"]
    assert sweep.jobs == [
        ["kl=fixed", "trainer.total_training_steps=1", "action=validate"],
        ["kl=fixed", "trainer.total_training_steps=2", "action=validate"],
        ["kl=adaptive", "trainer.total_training_steps=1", "action=validate"],
        ["kl=adaptive", "trainer.total_training_steps=2", "action=validate"],
    ]
    assert sweep.label(2) == "job 2 (kl=adaptive, trainer.total_training_steps=1)"
    # hydra.sweeper.params come first, as Hydra's sweeper puts them
    assert expand_jobs(["a=1"], {"b": "x,y"}).jobs == [["b=x", "a=1"], ["b=y", "a=1"]]
    assert expand_jobs(["a=1"]).label(0) == "job 0"


def test_problem_lines_name_their_job_and_a_shared_problem_once():
    labels = ["job 0 (a=1)", "job 1 (a=2)", "job 2 (a=3)"]
    assert sweep_problems(labels, [["p", "q"], ["p"], ["p", "r", "r"]]) == [
        "every job: p", "job 0 (a=1): q", "job 2 (a=3): r"]
    assert sweep_problems(labels[:1], [["p"]]) == ["job 0 (a=1): p"]  # one job: named, not "every job"
    assert sweep_problems(labels[:2], [[], ["p"]]) == ["job 1 (a=2): p"]
