"""verl's request router started early (recipes/verl_ext/early_router.py): verl's own ``get_router_handle`` returns
it with the servers added, and a request gets a server through it; for other routing, or a second router, verl
builds its own and the early one is ended. Real Ray and verl's router in a child process (Ray's lifetime is the
script's); the engine is the pack's ``hf`` here (vLLM is not on this machine), whose module the router imports
ahead."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from omegaconf import OmegaConf

from recipes.compose.compose import compose_recipe
from recipes.verl_ext import early_actors, early_router

SCRIPT = textwrap.dedent(
    """
    import ray
    from verl.workers.rollout import router as verl_router  # the plugin loads with verl and wraps get_router_handle

    from recipes.verl_ext import early_router

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)

    @ray.remote
    class Server:
        def ping(self):
            return "pong"

    server = Server.remote()
    early = early_router.launch("hf", full_determinism=False)
    adopted = verl_router.get_router_handle(servers={"10.0.0.1:8000": server})
    assert adopted._actor_id == early._actor_id, "verl built its own router"
    server_id, handle = ray.get(adopted.acquire_server.remote(request_id="r1"))
    assert server_id == "10.0.0.1:8000" and ray.get(handle.ping.remote()) == "pong"
    assert ray.get(adopted.get_all_servers.remote()) == ["10.0.0.1:8000"]
    second = verl_router.get_router_handle(servers={"10.0.0.1:8000": server})  # a teacher's: verl's own
    assert second._actor_id != early._actor_id

    # another routing (a subclass of verl's, as verl-omni passes): verl's own, the early one ended
    early_router._adopted.clear()
    ray.kill(early)
    other = early_router.launch("hf", full_determinism=False)
    custom = type("Custom", (verl_router.GlobalRequestLoadBalancer,), {})
    built = verl_router.get_router_handle(servers={"10.0.0.1:8000": server}, load_balancer_cls=custom)
    assert built._actor_id != other._actor_id
    assert early_router.NAME not in ray.util.list_named_actors()
    print("OK")
    """
)


@pytest.mark.ray
@pytest.mark.slow  # a child process with a local Ray cluster
def test_verls_get_router_handle_takes_the_early_router_and_a_request_gets_a_server(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=300)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]
    said = [line for line in proc.stdout.splitlines() if line.startswith("request router:")]
    assert len(said) == 1, proc.stdout[-2000:]
    # the hf replica's module, imported in the router's process before the servers came
    assert said[0].startswith("request router: verl's server manager takes the router started early "
                              "(klppo_early_router; recipes.verl_ext.plugin.hf_rollout imported ahead in ")


def _config(rollout: str, **keys):
    cfg = compose_recipe("grpo", ["cluster=cpu", "parallel=cpu", "model=tiny", "task=tiny", "rollout=hf"])
    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    OmegaConf.update(cfg, "actor_rollout_ref.rollout.name", rollout)
    for key, value in keys.items():
        OmegaConf.update(cfg, f"actor_rollout_ref.rollout.{key}", value, force_add=True)
    return cfg


def test_an_early_router_for_the_heavy_engines_and_verls_default_routing_only():
    assert early_router.wanted(_config("vllm")) and early_router.wanted(_config("sglang"))
    assert not early_router.wanted(_config("hf"))  # the pack's server class: nothing heavy to load
    assert not early_router.wanted(_config("vllm", router_config_path="my_router.yaml"))
    assert early_router.start(_config("hf")) == []


def test_the_warm_import_says_what_it_imported_or_why_not():
    assert early_actors.WarmImport("hf").wait().startswith("recipes.verl_ext.plugin.hf_rollout imported ahead in ")
    said = early_actors.WarmImport("no_such_engine").wait()
    assert said.startswith("no_such_engine's server module not imported ahead: ")
