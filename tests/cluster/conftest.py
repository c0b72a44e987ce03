"""A real Ray cluster for the tests marked `ray`: one head on 127.0.0.1, started with scripts/ray_head.sh, stopped at
the end of the session (its processes found by a marker in their environment and ended by pid)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import ROOT, checkout_env

MARKER = "KLPPO_TEST_RAY_CLUSTER"
# logical resources: a CPU training job (1 rank) holds 1 GPU and 16 CPUs, validate jobs 1 CPU each
NUM_CPUS, NUM_GPUS = 20, 2


def _free_ports(count: int) -> list[int]:
    sockets, ports = [], []
    for _ in range(count):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        sockets.append(s)
        ports.append(s.getsockname()[1])
    for s in sockets:
        s.close()
    return ports


def _marked_pids(marker: str) -> list[int]:
    """Processes whose environment carries this cluster's marker (Ray renames its workers, so names do not help)."""
    pids = []
    needle = f"{MARKER}={marker}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _stop(proc: subprocess.Popen, marker: str) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # `ray start --block` stops the processes it started
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    deadline = time.monotonic() + 20
    while _marked_pids(marker) and time.monotonic() < deadline:
        time.sleep(1)
    for pid in _marked_pids(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="session")
def ray_cluster():
    from recipes.cluster.ray_jobs import cluster_resources, connect
    from recipes.errors import ConfigError

    gcs, dashboard, client, agent, agent_grpc, runtime_env, metrics, node_manager, object_manager = _free_ports(9)
    # Ray's socket paths must stay short: a short folder under /tmp
    temp = Path(tempfile.mkdtemp(prefix="kr", dir="/tmp"))
    marker = uuid.uuid4().hex
    # the jobs it runs (python -m recipes....) get the head's environment: the same one as a recipe run in a test
    env = checkout_env({
        MARKER: marker,
        # loopback only: Ray maps 127.0.0.1 to this host's outside address unless told it runs single-host
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "NODE_IP": "127.0.0.1", "DASHBOARD_HOST": "127.0.0.1", "RAY_PORT": str(gcs), "DASHBOARD_PORT": str(dashboard),
        "NUM_CPUS": str(NUM_CPUS), "NUM_GPUS": str(NUM_GPUS), "RAY_TEMP_DIR": str(temp),
    })
    # a block of 100 worker ports that holds none of the ports above (Ray refuses a port used twice)
    taken = {gcs, dashboard, client, agent, agent_grpc, runtime_env, metrics, node_manager, object_manager}
    worker_low = _free_ports(1)[0] // 100 * 100
    while any(max(worker_low, 20000) <= port <= max(worker_low, 20000) + 99 for port in taken):
        worker_low = _free_ports(1)[0] // 100 * 100
    args = [f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={agent}",
            f"--dashboard-agent-grpc-port={agent_grpc}", f"--runtime-env-agent-port={runtime_env}",
            f"--metrics-export-port={metrics}", f"--node-manager-port={node_manager}",
            f"--object-manager-port={object_manager}", f"--min-worker-port={max(worker_low, 20000)}",
            f"--max-worker-port={max(worker_low, 20000) + 99}"]
    log = open(temp / "head.log", "w")  # noqa: SIM115 - closed at the end of the session
    proc = subprocess.Popen([str(ROOT / "scripts" / "ray_head.sh"), "--block", *args], env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    address = f"http://127.0.0.1:{dashboard}"
    deadline = time.monotonic() + 180
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"ray head exited {proc.returncode}:\n{(temp / 'head.log').read_text()[-3000:]}")
            try:
                cluster_resources(connect(address), wait_s=0)  # the dashboard answers and the node has registered
                break
            except ConfigError:
                if time.monotonic() > deadline:
                    pytest.fail(f"ray head did not answer at {address}:\n{(temp / 'head.log').read_text()[-3000:]}")
                time.sleep(2)
        yield SimpleNamespace(address=address, gcs=f"127.0.0.1:{gcs}", temp=temp, env=env)
    finally:
        _stop(proc, marker)
        log.close()
        shutil.rmtree(temp, ignore_errors=True)
