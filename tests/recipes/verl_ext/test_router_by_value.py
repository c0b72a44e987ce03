"""verl's request load balancer reaches its Ray worker by value: the worker builds it without importing verl or torch
(recipes/verl_ext/plugin/patches.py, ``_router_by_value``), and it routes as verl's class does."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

from tests.conftest import checkout_env

PICKLE = """
import sys
import ray.cloudpickle
from verl.workers.rollout import router  # verl imports the pack's plugin, whose hook registers the module
sys.stdout.buffer.write(ray.cloudpickle.dumps(router.GlobalRequestLoadBalancer))
"""

# a fresh interpreter, as the load balancer's Ray worker is: unpickle, route, list what got imported
BUILD = """
import pickle, sys
cls = pickle.loads(sys.stdin.buffer.read())
balancer = cls(servers={"a": "handle-a", "b": "handle-b"}, max_cache_size=10)
first = balancer.acquire_server("req-1")
again = balancer.acquire_server("req-1")  # sticky: the same server for the same request
other = balancer.acquire_server("req-2")  # least in flight: the other one
balancer.release_server(first[0])
print(first[0] == again[0], other[0] != first[0], balancer.get_inflight_count(first[0]), balancer.get_total_inflight())
print(sorted(name for name in ("verl", "torch", "transformers") if name in sys.modules))
"""


@pytest.mark.slow  # two child interpreters, one of them importing verl
def test_the_load_balancer_is_built_without_verl_and_routes_as_verls():
    env = checkout_env()
    pickled = subprocess.run([sys.executable, "-c", PICKLE], env=env, capture_output=True, timeout=300)
    assert pickled.returncode == 0, pickled.stderr.decode()[-3000:]
    built = subprocess.run([sys.executable, "-c", BUILD], input=pickled.stdout, env=env, capture_output=True,
                           timeout=300)
    assert built.returncode == 0, built.stderr.decode()[-3000:]
    routed, imported = built.stdout.decode().splitlines()
    assert routed == "True True 1 2"
    assert imported == "[]"


# a fresh interpreter, as a Ray worker that unpickles a server's handle is: Ray loads the actor class it stored
LOAD_SERVER_CLASS = """
import pickle, sys
cls = pickle.loads(sys.stdin.buffer.read())
print(cls.__name__, sorted(m for m in dir(cls) if not m.startswith("_") and callable(getattr(cls, m))))
print(sorted(name for name in ("verl", "torch", "transformers") if name in sys.modules))
"""


def test_a_holder_of_an_hf_server_handle_loads_neither_torch_nor_verl():
    """What Ray 2.60 stores for the hf server's actor class and loads in every process that unpickles a handle to
    it (verl's load balancer): the shell of ``hf_server_actor``, with every public method of the plugin's server."""
    from ray._common.serialization import pickle_dumps
    from ray.actor import _modify_class

    from recipes.verl_ext import hf_server_actor
    from recipes.verl_ext.plugin.hf_server import HFServer

    stored = pickle_dumps(_modify_class(hf_server_actor.HFServer), "the hf server's actor class")
    loaded = subprocess.run([sys.executable, "-c", LOAD_SERVER_CLASS], input=stored, env=checkout_env(),
                            capture_output=True, timeout=120)
    assert loaded.returncode == 0, loaded.stderr.decode()[-3000:]
    described, imported = loaded.stdout.decode().splitlines()
    server_methods = sorted(m for m in vars(HFServer) if not m.startswith("_") and inspect.iscoroutinefunction(
        vars(HFServer)[m]))
    assert described == f"HFServer {server_methods}"
    assert imported == "[]"
