"""On a real Ray cluster (loopback, started by the session fixture): the NCCL map inside a Ray worker, sweeps through
the Ray Jobs launcher (validate + a short CPU training; failures reported while the others complete), and a single
launcher=ray run that streams its log and returns the job's exit code. A sweep with an invalid job is refused before
anything is submitted (tests/recipes/test_sweep_checks.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from recipes.cluster import ray_jobs
from recipes.compose.compose import compose_recipe

pytestmark = pytest.mark.ray

CPU = ["parallel=cpu", "cluster=cpu", "rollout=hf", "model=tiny", "task=tiny"]


def test_cluster_resources(ray_cluster):
    total, free = ray_jobs.cluster_resources(ray_jobs.connect(ray_cluster.address))
    assert total["CPU"] == 20 and total["GPU"] == 2 and free["CPU"] <= 20


def test_nccl_map_reaches_a_ray_worker(ray_cluster, tmp_path):
    """A Ray Job (working folder uploaded) runs verl's own run_ppo with a probe runner: the worker sees the nccl=ib map,
    verl's own defaults, and the job's env, through the same ray.init as training."""
    launch = tmp_path / "launch"
    launch.mkdir()
    (launch / "marker.txt").write_text("uploaded\n")
    cfg = compose_recipe("grpo", CPU + ["nccl=ib", "launcher=ray"])
    runtime_env = ray_jobs.job_runtime_env(cfg, launch)
    assert runtime_env["working_dir"] == str(launch)
    out = tmp_path / "worker_env.json"
    command = f"python -m recipes.cluster.nccl_env --probe {out} grpo {' '.join(CPU)} nccl=ib"
    client = ray_jobs.connect(ray_cluster.address)
    job_id = client.submit_job(entrypoint=command, runtime_env=runtime_env)
    info = ray_jobs.follow(client, job_id, tmp_path / "job.log", echo=False, timeout_s=600)
    log = (tmp_path / "job.log").read_text()
    assert ray_jobs.exit_code_of(info) == 0, log[-3000:]
    seen = json.loads(out.read_text())
    env = seen["env"]
    for key, value in cfg.nccl.env.items():
        assert env[key] == str(value), key
    assert env["NCCL_DEBUG"] == "WARN"  # verl 0.9.1's forced default, through the same merge
    assert env["PYTHONUNBUFFERED"] == "1" and env["RAY_OVERRIDE_JOB_RUNTIME_ENV"] == "1"  # the job's own env
    assert (Path(seen["cwd"]) / "marker.txt").read_text() == "uploaded\n"  # the worker runs in the uploaded folder
    assert f"in a Ray worker (pid {seen['pid']})" in log and "(mode: job)" in log


@pytest.mark.e2e
def test_sweep_of_validate_and_cpu_training(ray_cluster, tmp_path, recipe_cli):
    """The issue's 2-job sweep: action=validate and a 2-step CPU training, each its own Ray Job; both finish, results
    are collected in the sweep folder."""
    proc = recipe_cli("grpo", "-m", "launcher=ray", f"launcher.address={ray_cluster.address}", "launcher.upload=false",
                      *CPU, "action=validate,train", "trainer.total_training_steps=2", cwd=tmp_path, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "Launching 2 jobs as Ray Jobs" in out
    (sweep,) = (tmp_path / "runs" / "grpo").glob("multirun-*")
    results = json.loads((sweep / "sweep_results.json").read_text())
    assert results["address"] == ray_cluster.address
    jobs = {job["num"]: job for job in results["jobs"]}
    assert [jobs[n]["status"] for n in (0, 1)] == ["SUCCEEDED", "SUCCEEDED"]
    assert [jobs[n]["exit_code"] for n in (0, 1)] == [0, 0]
    validate, train = sweep / "0", sweep / "1"
    assert Path(jobs[0]["run_dir"]).resolve() == validate.resolve()
    assert OmegaConf.load(validate / "resolved_config.yaml").action == "validate"
    assert "config OK" in (validate / "job.log").read_text()
    # the training job ran verl's trainer for 2 steps on the cluster, in the shared run folder
    steps = [json.loads(line) for line in (train / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [s["step"] for s in steps] == [1, 2]
    assert all(0.0 <= s["data"]["critic/score/mean"] <= 1.0 and s["data"]["actor/entropy"] > 0 for s in steps)
    record = json.loads((train / "nccl_env.json").read_text())
    assert record["mode"] == "job" and record["env"]["RAY_OVERRIDE_JOB_RUNTIME_ENV"] == "1"
    for folder in (validate, train):
        bundle = json.loads((folder / "repro" / "bundle.json").read_text())
        assert bundle["env"]["KLPPO_RAY_JOB"] == "1" and bundle["versions"]["ray"]
        assert json.loads((folder / "job.json").read_text())["status"] == "SUCCEEDED"


def test_sweep_reports_failures_and_completes_the_others(ray_cluster, tmp_path, recipe_cli):
    """2 jobs: one succeeds, one fails on the cluster (exit 127); the sweep reports it after both ran."""
    proc = recipe_cli("grpo", "-m", "launcher=ray", f"launcher.address={ray_cluster.address}", "launcher.upload=false",
                      *CPU, "action=validate", "launcher.python=python,no_such_python", cwd=tmp_path, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    assert "sweep: 1 of 2 jobs did not succeed" in out and "Traceback" not in out
    (sweep,) = (tmp_path / "runs" / "grpo").glob("multirun-*")
    jobs = {job["num"]: job for job in json.loads((sweep / "sweep_results.json").read_text())["jobs"]}
    assert jobs[0]["status"] == "SUCCEEDED" and (sweep / "0" / "resolved_config.yaml").is_file()
    assert jobs[1]["status"] == "FAILED" and jobs[1]["exit_code"] == 127
    assert "no_such_python" in jobs[1]["message"]


def test_single_run_streams_its_log_and_returns_the_exit_code(ray_cluster, tmp_path, recipe_cli):
    proc = recipe_cli("grpo", "launcher=ray", f"launcher.address={ray_cluster.address}", "launcher.upload=false", *CPU,
                      "action=train", "launcher.python=no_such_python", cwd=tmp_path, timeout=900)
    assert proc.returncode == 127, (proc.stdout + proc.stderr)[-3000:]
    assert "submitted Ray Job klppo_grpo_" in proc.stdout
    assert "no_such_python" in proc.stdout and "FAILED (exit code 127)" in proc.stdout
    (run,) = (tmp_path / "runs" / "grpo").iterdir()
    record = json.loads((run / "job.json").read_text())
    assert record["status"] == "FAILED" and record["exit_code"] == 127
    assert record["entrypoint"].startswith(f"cd {tmp_path} && no_such_python -m recipes.grpo")
    assert "launcher=local" in record["entrypoint"] and f"hydra.run.dir={run.relative_to(tmp_path)}" in \
        record["entrypoint"]
    assert "no_such_python" in (run / "job.log").read_text()
    assert (run / "repro" / "bundle.json").is_file()  # the driver's own bundle, written before submitting
