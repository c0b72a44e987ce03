"""recipes.cluster.ray_jobs without a cluster: addresses, what a job runs, resources per job, and the sweep scheduler
against a fake Ray Jobs client (as many at once as the free resources allow, failures reported, the others run)."""

from __future__ import annotations

import json
import socket
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from recipes.cluster.ray_jobs import (
    JobSpec,
    connect,
    dashboard_url,
    distinguishing,
    entrypoint,
    exit_code_of,
    job_demand,
    job_overrides,
    job_runtime_env,
    run_sweep,
    summary_table,
)
from recipes.compose.compose import compose_recipe
from recipes.compose.defaults import embedded_defaults
from recipes.errors import ConfigError

CPU = embedded_defaults([], accelerator=False)  # parallel=cpu cluster=cpu rollout=hf model=tiny task=tiny


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dashboard_url():
    assert dashboard_url("127.0.0.1:8265") == "http://127.0.0.1:8265"
    assert dashboard_url("https://ray.example.com/") == "https://ray.example.com"
    with pytest.raises(ConfigError, match="Ray Client address"):
        dashboard_url("ray://head:10001")
    with pytest.raises(ConfigError, match="launcher.address: not set"):
        dashboard_url(None)


def test_connect_to_nothing_is_one_line():
    port = _closed_port()
    with pytest.raises(ConfigError) as info:
        connect(f"127.0.0.1:{port}")
    (line,) = info.value.problems
    assert line.startswith(f"launcher.address: no Ray cluster answers at http://127.0.0.1:{port}")
    assert "scripts/ray_head.sh" in line and "\n" not in line


def test_job_overrides_and_entrypoint(tmp_path):
    args = job_overrides(["launcher=ray", "launcher.address=http://h:8265", "kl=adaptive", "hydra.run.dir=x",
                          "+launcher.env_vars.A=1"], tmp_path / "runs" / "0", cluster_choice="h100_80g")
    assert args == ["kl=adaptive", "cluster=h100_80g", "launcher=local", f"hydra.run.dir={tmp_path}/runs/0"]
    # a run that chose its layout keeps it as it is
    assert "cluster=h100_80g" not in job_overrides(["parallel=tp4"], "r", cluster_choice="h100_80g")
    assert job_overrides([], "runs/a b", None)[-1] == "hydra.run.dir='runs/a b'"
    cfg = compose_recipe("grpo", CPU + ["launcher=ray", "launcher.upload=false"])
    shared = entrypoint("grpo", ["kl=fixed", "hydra.run.dir='runs/a b'"], cfg.launcher, tmp_path)
    assert shared == f"cd {tmp_path} && python -m recipes.grpo kl=fixed 'hydra.run.dir='\"'\"'runs/a b'\"'\"''"
    cfg = compose_recipe("grpo", CPU + ["launcher=ray", "launcher.python=/opt/py/bin/python"])
    assert entrypoint("grpo", ["kl=fixed"], cfg.launcher, tmp_path) == "/opt/py/bin/python -m recipes.grpo kl=fixed"


def test_job_runtime_env(tmp_path):
    cfg = compose_recipe("grpo", CPU + ["launcher=ray", "nccl=ib", "+launcher.env_vars.HF_HOME=/data/hf"])
    env = job_runtime_env(cfg, tmp_path)
    assert env["working_dir"] == str(tmp_path) and ".git" in env["excludes"] and "runs" in env["excludes"]
    assert env["env_vars"]["NCCL_IB_HCA"] == "mlx5_0" and env["env_vars"]["HF_HOME"] == "/data/hf"
    # ray.init inside the job repeats the map: Ray merges the two only with this set
    assert env["env_vars"]["RAY_OVERRIDE_JOB_RUNTIME_ENV"] == "1"
    shared = job_runtime_env(compose_recipe("grpo", CPU + ["launcher=ray", "launcher.upload=false"]), tmp_path)
    assert "working_dir" not in shared


def test_job_demand():
    assert job_demand(compose_recipe("grpo", CPU + ["action=validate"])) == {"CPU": 1.0}
    # the CPU path: logical GPUs per rank, and the CPUs it declares for its own Ray
    assert job_demand(compose_recipe("grpo", CPU)) == {"GPU": 1.0, "CPU": 16.0}
    gpu = compose_recipe("grpo", ["parallel=tp8pp4", "strategy=megatron", "cluster.nnodes=2"])
    assert job_demand(gpu) == {"GPU": 16.0, "CPU": 52.0}
    assert job_demand(gpu, {"GPU": 8, "CPU": 10}) == {"GPU": 8.0, "CPU": 10.0}


class FakeClient:
    """Ray Jobs client stand-in: a job runs for `polls` status calls; entrypoints with 'fail' exit 3."""

    def __init__(self, polls: int = 2, refuse: str | None = None):
        self.polls = polls
        self.refuse = refuse
        self.jobs: dict[str, dict] = {}
        self.max_running = 0
        self.order: list[str] = []

    def _running(self) -> int:
        return sum(1 for j in self.jobs.values() if j["left"] > 0)

    def submit_job(self, *, entrypoint, runtime_env, submission_id, metadata):
        if self.refuse and self.refuse in entrypoint:
            raise RuntimeError("runtime env too large")
        self.jobs[submission_id] = {"entrypoint": entrypoint, "left": self.polls}
        self.order.append(metadata["job_num"])
        self.max_running = max(self.max_running, self._running())
        return submission_id

    def get_job_status(self, job_id):
        job = self.jobs[job_id]
        if job["left"] > 0:
            job["left"] -= 1
            return "RUNNING"
        return "FAILED" if "fail" in job["entrypoint"] else "SUCCEEDED"

    def get_job_info(self, job_id):
        status = self.get_job_status(job_id)
        code = 3 if status == "FAILED" else 0
        return SimpleNamespace(status=status, driver_exit_code=code,
                               message="Job entrypoint command failed with exit code 3" if code else "ok")

    def get_job_logs(self, job_id):
        return f"log of {self.jobs[job_id]['entrypoint']}\n"

    def stop_job(self, job_id):
        self.jobs[job_id]["left"] = 0


def _spec(tmp_path, num, demand, entry="python -m recipes.grpo", error=None):
    return JobSpec(num=num, overrides=[f"seed={num}"], run_dir=tmp_path / str(num), entrypoint=f"{entry} #{num}",
                   demand=demand, error=error)


def test_sweep_runs_as_many_as_the_free_gpus_allow(tmp_path):
    client = FakeClient()
    specs = [_spec(tmp_path, n, {"GPU": 4.0, "CPU": 1.0}) for n in range(4)]
    results = run_sweep(client, specs, total={"GPU": 8, "CPU": 64}, free={"GPU": 8, "CPU": 64}, poll_s=0,
                        echo=lambda _: None)
    assert [r.status for r in results] == ["SUCCEEDED"] * 4
    assert client.max_running == 2
    assert all((tmp_path / str(n) / "job.log").read_text().startswith("log of") for n in range(4))
    record = json.loads((tmp_path / "0" / "job.json").read_text())
    assert record["status"] == "SUCCEEDED" and record["exit_code"] == 0 and record["demand"]["GPU"] == 4.0


def test_sweep_cpu_jobs_limited_by_free_cpus_and_max_concurrent(tmp_path):
    client = FakeClient()
    specs = [_spec(tmp_path, n, {"CPU": 1.0}) for n in range(5)]
    run_sweep(client, specs, total={"CPU": 8}, free={"CPU": 3}, poll_s=0, echo=lambda _: None)
    assert client.max_running == 3
    client = FakeClient()
    run_sweep(client, [_spec(tmp_path, n, {"CPU": 1.0}) for n in range(5)], total={"CPU": 8}, free={"CPU": 8},
              max_concurrent=2, poll_s=0, echo=lambda _: None)
    assert client.max_running == 2


def test_sweep_reports_failures_and_runs_the_others(tmp_path):
    client = FakeClient(refuse="refuse")
    specs = [
        _spec(tmp_path, 0, {"CPU": 1.0}),
        _spec(tmp_path, 1, {"CPU": 1.0}, entry="python -m recipes.grpo fail"),
        _spec(tmp_path, 2, {"GPU": 16.0}),  # more than the whole cluster: fails at once
        _spec(tmp_path, 3, {"CPU": 1.0}, error="config error: kl=nosuch: no such option; choose from fixed"),
        _spec(tmp_path, 4, {"CPU": 1.0}, entry="python refuse"),
        _spec(tmp_path, 5, {"GPU": 8.0}),  # more than is free, not more than the cluster: runs alone
    ]
    # job 0 trained (on a shared file system its run folder is visible here): its last step's reward and KL
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "metrics.jsonl").write_text(
        json.dumps({"step": 1, "data": {"critic/score/mean": 0.5, "actor/kl_loss": 0.5}}) + "\n"
        + json.dumps({"step": 2, "data": {"critic/score/mean": 0.25, "actor/kl_loss": 0.125}}) + "\n")
    lines = []
    results = run_sweep(client, specs, total={"CPU": 8, "GPU": 8}, free={"CPU": 8, "GPU": 2}, poll_s=0,
                        echo=lines.append)
    by = {r.num: r for r in results}
    assert by[0].ok and by[5].ok
    # a failed job reports the last line of its own log
    assert by[1].status == "FAILED" and by[1].exit_code == 3
    assert by[1].message == "log of python -m recipes.grpo fail #1"
    assert by[2].status == "NOT_SUBMITTED" and "needs 16 GPU but the whole cluster has 8 GPU" in by[2].message
    assert by[3].status == "NOT_SUBMITTED" and "kl=nosuch" in by[3].message
    assert by[4].status == "NOT_SUBMITTED" and "refused" in by[4].message
    assert "5" in client.order and len(client.jobs) == 3
    table = summary_table(results)
    assert "FAILED" in table and "NOT_SUBMITTED" in table and "kl=nosuch" in table
    assert by[0].reward == pytest.approx(0.25) and by[0].kl == pytest.approx(0.125)  # job 0's metrics.jsonl
    assert "  +0.250   0.1250  " in table.splitlines()[1]
    assert "(seed=1)" in table  # only the overrides that tell the jobs apart
    assert json.loads((tmp_path / "3" / "job.json").read_text())["status"] == "NOT_SUBMITTED"


def test_distinguishing_overrides():
    assert distinguishing([["a=1", "b=1", "c=0"], ["a=1", "b=2", "c=0"]]) == [["b=1"], ["b=2"]]


def test_exit_codes():
    assert exit_code_of(SimpleNamespace(status="SUCCEEDED", driver_exit_code=None)) == 0
    assert exit_code_of(SimpleNamespace(status="FAILED", driver_exit_code=2)) == 2
    assert exit_code_of(SimpleNamespace(status="FAILED", driver_exit_code=None)) == 1
    assert exit_code_of(SimpleNamespace(status="STOPPED", driver_exit_code=None)) == 130


def test_launcher_ray_options_validate_but_train_needs_a_cluster(tmp_path, recipe_main):
    """action=validate needs no cluster; action=train with nothing at the address fails with one line, exit 2,
    before a run folder exists."""
    port = _closed_port()
    base = ["launcher=ray", f"launcher.address=127.0.0.1:{port}", *CPU]
    proc = recipe_main("grpo", *base, "action=train", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if "config error" in line]
    assert errors == [f"config error: launcher.address: no Ray cluster answers at http://127.0.0.1:{port} "
                      f"(connection refused); start one with scripts/ray_head.sh, or set "
                      f"launcher.address=http://HEAD:8265"]
    assert not (tmp_path / "runs").exists()
    proc = recipe_main("grpo", *base, "action=validate", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "config OK" in proc.stdout
    (resolved,) = (tmp_path / "runs" / "grpo").glob("*/resolved_config.yaml")
    assert OmegaConf.load(resolved).launcher.name == "ray"
    cfg = OmegaConf.to_container(compose_recipe("grpo", CPU + ["launcher=ray"]).launcher, resolve=True)
    assert cfg["name"] == "ray" and cfg["upload"] is True
