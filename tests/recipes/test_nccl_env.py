"""The env every Ray worker gets: the nccl/ map over verl 0.9.1's forced values, each conflict reported, the record."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from recipes.check.validate import validate
from recipes.cluster.nccl_env import ray_init_runtime_env, verl_runtime_env, worker_env
from recipes.compose.compose import compose_recipe
from recipes.compose.defaults import embedded_defaults
from recipes.errors import ConfigError
from recipes.record.bundle import write_record
from recipes.run.finalize import finalize

CPU = embedded_defaults([], accelerator=False)  # parallel=cpu cluster=cpu rollout=hf model=tiny task=tiny
BASE = {"PATH": "/usr/bin", "HOME": "/root"}


def test_ray_init_runtime_env_is_what_verl_run_ppo_builds(monkeypatch):
    """Same merge as verl's run_ppo: get_ppo_ray_runtime_env, then ray_kwargs.ray_init.runtime_env over it."""
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    monkeypatch.delenv("NCCL_DEBUG", raising=False)
    # the launch flow hands verl the resolved config (recipes.check.validate)
    cfg = OmegaConf.create(OmegaConf.to_container(compose_recipe("grpo", ["nccl=ib"]), resolve=True))
    expected = OmegaConf.to_container(OmegaConf.merge(get_ppo_ray_runtime_env(cfg),
                                                      cfg.ray_kwargs.ray_init.runtime_env), resolve=True)
    ours = ray_init_runtime_env(cfg)
    assert ours["env_vars"] == {k: str(v) for k, v in expected["env_vars"].items()}
    assert ours["env_vars"]["NCCL_IB_HCA"] == "mlx5_0" and ours["env_vars"]["NCCL_DEBUG"] == "WARN"


def test_ib_preset_reaches_every_worker_without_conflict():
    record = worker_env(compose_recipe("grpo", ["nccl=ib"]), BASE, device_major=9)
    assert record.mode == "local"
    assert record.env["NCCL_IB_HCA"] == "mlx5_0" and record.sources["NCCL_IB_HCA"] == "nccl.env"
    assert record.env["NCCL_DEBUG"] == "WARN" and record.sources["NCCL_DEBUG"] == "verl 0.9.1 default"
    # FSDP2: the Megatron-only connection limit stays out
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in record.env
    assert record.conflicts == [] and record.problems == []


def test_debug_preset_replacing_verls_forced_value_is_reported():
    record = worker_env(compose_recipe("grpo", ["nccl=debug"]), BASE)
    assert record.env["NCCL_DEBUG"] == "INFO"
    (line,) = [c for c in record.conflicts if c.startswith("NCCL_DEBUG:")]
    assert "'INFO'" in line and "forces 'WARN'" in line and "pack's value wins" in line


def test_shell_value_that_the_preset_replaces_is_reported():
    record = worker_env(compose_recipe("grpo", ["nccl=ib"]), {**BASE, "NCCL_IB_HCA": "mlx5_4"})
    (line,) = record.conflicts
    assert line.startswith("NCCL_IB_HCA:") and "'mlx5_4'" in line and "workers get 'mlx5_0'" in line


def test_shell_value_lost_on_an_existing_cluster_is_reported():
    """verl skips its NCCL_DEBUG=WARN because the shell sets it, but remote workers never see the shell's."""
    environ = {**BASE, "RAY_ADDRESS": "10.0.0.1:6379", "NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "eth0"}
    record = worker_env(compose_recipe("grpo", ["nccl=off"]), environ)
    assert record.mode == "cluster" and "NCCL_DEBUG" not in record.env
    debug = next(c for c in record.conflicts if c.startswith("NCCL_DEBUG:"))
    assert "skips its own NCCL_DEBUG='WARN'" in debug and "+nccl.env.NCCL_DEBUG=INFO" in debug
    assert any(c.startswith("NCCL_SOCKET_IFNAME:") for c in record.conflicts)
    # on a local Ray the same shell values are inherited by the workers: no conflict
    local = worker_env(compose_recipe("grpo", ["nccl=off"]), {**BASE, "NCCL_DEBUG": "INFO"})
    assert local.conflicts == [] and local.inherited == {"NCCL_DEBUG": "INFO"}
    assert "NCCL_DEBUG" not in local.env


def test_device_max_connections_outside_megatron_and_on_blackwell():
    fsdp = worker_env(compose_recipe("grpo", ["nccl=ib", "+nccl.env.CUDA_DEVICE_MAX_CONNECTIONS=1"]), BASE)
    assert any("CUDA_DEVICE_MAX_CONNECTIONS=1" in c and "FSDP/FSDP2 must not" in c for c in fsdp.conflicts)
    megatron = ["nccl=ib", "strategy=megatron", "parallel=tp8"]
    hopper = worker_env(compose_recipe("grpo", megatron), BASE, device_major=9)
    assert hopper.env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1" and hopper.sources["CUDA_DEVICE_MAX_CONNECTIONS"] == \
        "nccl.megatron_env"
    assert not [c for c in hopper.conflicts if "CUDA_DEVICE_MAX_CONNECTIONS" in c]
    blackwell = worker_env(compose_recipe("grpo", megatron), BASE, device_major=10)
    assert any("Blackwell" in c for c in blackwell.conflicts)


def test_ray_job_env_overlap_is_a_problem_unless_overridden():
    cfg = compose_recipe("grpo", ["nccl=ib"])
    job = json.dumps({"runtime_env": {"env_vars": {"NCCL_IB_HCA": "mlx5_1"}}})
    environ = {**BASE, "RAY_JOB_CONFIG_JSON_ENV_VAR": job, "RAY_ADDRESS": "127.0.0.1:6379"}
    refused = worker_env(cfg, environ)
    assert refused.mode == "job"
    (problem,) = refused.problems
    assert "NCCL_IB_HCA" in problem and "RAY_OVERRIDE_JOB_RUNTIME_ENV=1" in problem and "launcher=ray" in problem
    merged = worker_env(cfg, {**environ, "RAY_OVERRIDE_JOB_RUNTIME_ENV": "1"})
    assert merged.problems == [] and merged.env["NCCL_IB_HCA"] == "mlx5_0"
    assert any("the Ray Job sets 'mlx5_1'" in c for c in merged.conflicts)


def test_invalid_env_name_is_a_problem():
    record = worker_env(compose_recipe("grpo", ["+nccl.env.BAD-NAME=1"]), BASE)
    assert any("BAD-NAME: not a valid environment variable name" in p for p in record.problems)


def test_finalize_joining_a_cluster_drops_cluster_start_kwargs(tmp_path, monkeypatch):
    """On an existing cluster the CPU preset's ray_init.num_cpus/num_gpus are dropped (Ray refuses them there), in the
    config verl receives and in the record; the validated run itself is left as it was."""
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    run = validate(compose_recipe("grpo", CPU), run_verl=False)
    assert run.cfg.ray_kwargs.ray_init.num_cpus == 16
    final = finalize(run, tmp_path)
    assert "num_cpus" not in final.cfg.ray_kwargs.ray_init and "num_gpus" not in final.cfg.ray_kwargs.ray_init
    assert run.cfg.ray_kwargs.ray_init.num_cpus == 16
    assert any("num_cpus=16" in line and "dropped" in line for line in final.notes)
    write_record(tmp_path, final.cfg, final.workers, "grpo", [])
    record = json.loads((tmp_path / "nccl_env.json").read_text())
    assert record["mode"] == "cluster" and record["env"]["NCCL_DEBUG"] == "WARN"
    monkeypatch.delenv("RAY_ADDRESS")
    again = finalize(run, tmp_path)
    assert again.notes == () and again.cfg.ray_kwargs.ray_init.num_cpus == 16


def test_finalize_refuses_a_conflicting_job(tmp_path, monkeypatch):
    run = validate(compose_recipe("grpo", ["nccl=ib"]), run_verl=False)
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": {"env_vars": {"NCCL_PROTO": "LL"}}}))
    monkeypatch.delenv("RAY_OVERRIDE_JOB_RUNTIME_ENV", raising=False)
    with pytest.raises(ConfigError, match="NCCL_PROTO"):
        finalize(run, tmp_path)


def test_determinism_and_transfer_queue_follow_run_ppo():
    cfg = compose_recipe("grpo", ["actor_rollout_ref.rollout.full_determinism=true", "transfer_queue.enable=true"])
    env = verl_runtime_env(cfg, BASE)["env_vars"]
    assert env["VERL_FULL_DETERMINISM"] == "1" and env["VLLM_BATCH_INVARIANT"] == "1"
    assert env["TRANSFER_QUEUE_ENABLE"] == "1" and env["PYTHONHASHSEED"]
