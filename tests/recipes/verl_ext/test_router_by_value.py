"""verl's request load balancer reaches its Ray worker by value: the worker builds it without importing verl or torch
(recipes/verl_ext/plugin/patches.py, ``_router_by_value``), and it routes as verl's class does."""

from __future__ import annotations

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
