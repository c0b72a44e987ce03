"""A token given as ``ray_kwargs.ray_init.runtime_env.env_vars.HF_TOKEN`` reaches every Ray worker, and no log holds
it: not verl's ``ray init kwargs`` line, not Ray's session logs (runtime_env_agent.log logged it once per worker),
not the pack's records (recipes/verl_ext/worker_secrets.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from recipes.verl_ext.worker_secrets import ENV_KEY, setup_hook, take_secrets
from tests.conftest import checkout_env

PLANTED = "hf_plantedPLANTEDplanted0123"


def _cfg(env: dict) -> OmegaConf:
    return OmegaConf.create({"ray_kwargs": {"ray_init": {"runtime_env": {"env_vars": env}}}, "trainer": {"x": 1}})


def test_secret_names_and_key_shaped_values_leave_the_runtime_env():
    cfg = _cfg({"NCCL_DEBUG": "WARN", "HF_TOKEN": "plain", "MIRROR": f"{PLANTED}", "WANDB_API_KEY": "",
                "TOKENIZERS_PARALLELISM": "true"})
    kept, secrets = take_secrets(cfg)
    assert secrets == {"HF_TOKEN": "plain", "MIRROR": PLANTED}
    assert dict(OmegaConf.select(kept, ENV_KEY)) == {"NCCL_DEBUG": "WARN", "WANDB_API_KEY": "",
                                                      "TOKENIZERS_PARALLELISM": "true"}
    assert OmegaConf.select(cfg, f"{ENV_KEY}.HF_TOKEN") == "plain"  # the caller's config is not changed


def test_without_secrets_the_config_is_passed_as_it_is():
    cfg = _cfg({"NCCL_DEBUG": "WARN"})
    assert take_secrets(cfg) == (cfg, {})
    assert take_secrets(OmegaConf.create({"trainer": {}})) == (OmegaConf.create({"trainer": {}}), {})


def test_the_hook_sets_the_secrets_then_runs_the_hook_given_before(monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    seen = []
    setup_hook({"HF_TOKEN": PLANTED}, then=lambda: seen.append(__import__("os").environ["HF_TOKEN"]))()
    assert seen == [PLANTED]


# Ray's own scan: without the pack's path, runtime_env_agent.log holds the value (so the scan below can see it)
CONTROL = """
import os, ray
ray.init(num_cpus=1, include_dashboard=False, runtime_env={"env_vars": {"HF_TOKEN": os.environ.pop("PLANTED")}})
ray.get(ray.remote(lambda: os.environ["HF_TOKEN"]).remote())
ray.shutdown()
"""


def _files_holding(root: Path, text: str) -> list[str]:
    return [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


@pytest.mark.ray
def test_the_token_reaches_a_worker_through_verls_run_ppo_and_no_log_holds_it(tmp_path):
    # a short Ray temp dir: Ray's socket paths must stay under the AF_UNIX length limit
    with tempfile.TemporaryDirectory(prefix="rs", dir="/tmp") as ray_tmp:
        out = tmp_path / "worker_env.json"
        proc = subprocess.run(
            [sys.executable, "-m", "recipes.cluster.nccl_env", "--probe", str(out), "grpo",
             f"+{ENV_KEY}.HF_TOKEN={PLANTED}", "run.gc_threshold=[12345,6,7]"],
            cwd=tmp_path, env=checkout_env({"RAY_TMPDIR": ray_tmp}), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        seen = json.loads(out.read_text())
        assert seen["env"]["HF_TOKEN"] == "***"  # it arrived (the probe redacts its record)
        assert seen["gc_threshold"] == [12345, 6, 7]  # run.gc_threshold, by the same setup hook
        assert "  HF_TOKEN=***    # ray_kwargs.ray_init.runtime_env.env_vars" in proc.stdout
        assert "ray init kwargs" in proc.stdout and PLANTED not in proc.stdout + proc.stderr
        assert _files_holding(Path(ray_tmp), PLANTED) == [] and _files_holding(tmp_path, PLANTED) == []

        control = subprocess.run([sys.executable, "-c", CONTROL], cwd=tmp_path, capture_output=True, text=True,
                                 env=checkout_env({"RAY_TMPDIR": ray_tmp, "PLANTED": PLANTED}), timeout=300)
        assert control.returncode == 0, control.stderr[-3000:]
        assert any(name.endswith("runtime_env_agent.log") for name in _files_holding(Path(ray_tmp), PLANTED))


# ray.init replaces the driver's SIGTERM handler with one that ends the process at once (Ray 2.60)
SIGTERM_AFTER_INIT = """
import os, signal, sys, time, ray
from recipes.verl_ext.ray_init import pack_ray_init
def stop(signum, frame):
    raise KeyboardInterrupt
signal.signal(signal.SIGTERM, stop)
with pack_ray_init({}) if sys.argv[1] == "pack" else open(os.devnull):
    ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR")
try:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
    print("no interrupt")
except KeyboardInterrupt:
    print("the pack's handler ran")
ray.shutdown()
"""


@pytest.mark.ray
def test_the_drivers_sigterm_handler_survives_ray_init(tmp_path):
    with tempfile.TemporaryDirectory(prefix="rs", dir="/tmp") as ray_tmp:
        ran = {mode: subprocess.run([sys.executable, "-c", SIGTERM_AFTER_INIT, mode], cwd=tmp_path,
                                    env=checkout_env({"RAY_TMPDIR": ray_tmp}), capture_output=True, text=True,
                                    timeout=120) for mode in ("pack", "plain")}
    assert ran["pack"].stdout.strip() == "the pack's handler ran", ran["pack"].stderr[-2000:]
    assert "the pack's handler ran" not in ran["plain"].stdout  # without it, Ray's handler ends the process
    assert "SIGTERM received" in ran["plain"].stderr
