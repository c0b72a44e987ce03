"""The cluster scripts: bash syntax, and the commands each would run (their dry mode), without a cluster."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
SHELL = [SCRIPTS / "ray_head.sh", SCRIPTS / "ray_worker.sh", SCRIPTS / "slurm" / "ray_recipe.sbatch",
         SCRIPTS / "skypilot" / "run.sh"]


def _dry(script: Path, *args: str, **env: str) -> list[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SKYPILOT_", "RAY_"))}
    full.update(DRY_RUN="1", **env)
    proc = subprocess.run(["bash", str(script), *args], env=full, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


@pytest.mark.parametrize("script", SHELL, ids=lambda p: p.name)
def test_bash_syntax(script):
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    assert os.access(script, os.X_OK)


def test_ray_head_dry_run():
    assert _dry(SCRIPTS / "ray_head.sh", "--block", NODE_IP="10.0.0.1", NUM_GPUS="8") == [
        "+ ray start --head --node-ip-address=10.0.0.1 --port=6379 --include-dashboard=true --dashboard-host=0.0.0.0 "
        "--dashboard-port=8265 --disable-usage-stats --num-gpus=8 --block"
    ]


def test_ray_worker_dry_run():
    assert _dry(SCRIPTS / "ray_worker.sh", "10.0.0.1:6379", "--block", NODE_IP="10.0.0.2", NUM_CPUS="64") == [
        "+ ray health-check --address=10.0.0.1:6379  # until it answers, at most 120s",
        "+ ray start --address=10.0.0.1:6379 --node-ip-address=10.0.0.2 --disable-usage-stats --num-cpus=64 --block",
    ]


def test_slurm_dry_run_boots_ray_on_every_node_and_runs_the_recipe():
    lines = _dry(SCRIPTS / "slurm" / "ray_recipe.sbatch", "grpo", "nccl=ib", SLURM_JOB_NODELIST="gpu[07-09]",
                 SLURM_GPUS_ON_NODE="h100:8", PATH="/usr/bin:/bin")
    head, *workers, wait, recipe = lines
    assert head == (f"+ srun --nodes=1 --ntasks=1 --overlap -w gpu07 env NODE_IP=gpu07 RAY_PORT=6379 "
                    f"DASHBOARD_PORT=8265 NUM_GPUS=8 {SCRIPTS}/ray_head.sh --block &")
    assert workers == [f"+ srun --nodes=1 --ntasks=1 --overlap -w gpu0{n} env NUM_GPUS=8 {SCRIPTS}/ray_worker.sh "
                       f"gpu07:6379 --block &" for n in (8, 9)]
    assert wait == "+ python -m recipes.cluster.ray_jobs wait --address gpu07:6379 --nodes 3 --timeout 300"
    assert recipe == ("+ env RAY_ADDRESS=gpu07:6379 python -m recipes.grpo nccl=ib cluster.nnodes=3 "
                      "cluster.gpus_per_node=8")


def test_slurm_dry_run_sweep_through_ray_jobs():
    lines = _dry(SCRIPTS / "slurm" / "ray_recipe.sbatch", "kl_ppo", "-m", "launcher=ray", "kl=fixed,adaptive",
                 "cluster.nnodes=1", SLURM_JOB_NODELIST="n1", PATH="/usr/bin:/bin")
    assert lines[-1] == ("+ env RAY_ADDRESS=n1:6379 python -m recipes.kl_ppo -m launcher=ray kl=fixed\\,adaptive "
                         "cluster.nnodes=1 cluster.gpus_per_node=8 launcher.address=http://n1:8265 "
                         "launcher.upload=false")


def test_skypilot_task_yaml():
    task = yaml.safe_load((SCRIPTS / "skypilot" / "klppo.yaml").read_text())
    assert "--shm-size=128g" in task["config"]["docker"]["run_options"]
    assert task["resources"]["image_id"].startswith("docker:") and task["num_nodes"] >= 2
    assert set(task["secrets"]) == {"WANDB_API_KEY", "HF_TOKEN"} and task["workdir"] == "."
    assert "scripts/skypilot/run.sh" in task["run"] and "pip install -e" in task["setup"]


def test_skypilot_dry_run_head_and_worker():
    ips = "10.0.0.1\n10.0.0.2"
    head = _dry(SCRIPTS / "skypilot" / "run.sh", "grpo", "nccl=ib", SKYPILOT_NODE_RANK="0", SKYPILOT_NODE_IPS=ips,
                SKYPILOT_NUM_NODES="2", SKYPILOT_NUM_GPUS_PER_NODE="8")
    here = SCRIPTS / "skypilot"
    assert head == [
        f"+ env NODE_IP=10.0.0.1 RAY_PORT=6379 DASHBOARD_PORT=8265 NUM_GPUS=8 bash {here}/../ray_head.sh",
        "+ python -m recipes.cluster.ray_jobs wait --address 10.0.0.1:6379 --nodes 2",
        "+ env RAY_ADDRESS=10.0.0.1:6379 python -m recipes.grpo nccl=ib cluster.nnodes=2 cluster.gpus_per_node=8",
    ]
    worker = _dry(SCRIPTS / "skypilot" / "run.sh", "grpo", SKYPILOT_NODE_RANK="1", SKYPILOT_NODE_IPS=ips,
                  SKYPILOT_NUM_NODES="2", SKYPILOT_NUM_GPUS_PER_NODE="8")
    assert worker == [f"+ env NODE_IP=10.0.0.2 NUM_GPUS=8 bash {here}/../ray_worker.sh 10.0.0.1:6379"]
