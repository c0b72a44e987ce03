"""Runs on an existing Ray cluster as Ray Jobs: one run (``launcher=ray``) or every job of a sweep (``-m``).

A run is submitted through the cluster's Ray Jobs API (``ray.job_submission.JobSubmissionClient``, the dashboard
address, http://HEAD:8265) with ``python -m recipes.<recipe> <the same overrides> launcher=local
hydra.run.dir=<run folder>`` as its entrypoint: the job's driver runs the pack's usual flow on the cluster, and verl's
ray.init there joins the cluster. The job's runtime env carries the working folder (uploaded, or the shared launch
folder) and the run's env map (the nccl/ option), and sets RAY_OVERRIDE_JOB_RUNTIME_ENV=1 so that ray.init's own
runtime env (verl's defaults + the same map) merges with the job's instead of being refused.

Sweeps: :func:`run_sweep` submits each job as its own Ray Job and keeps as many running as the cluster's free GPUs
(CPUs for CPU jobs) allow, records each job's status, exit code and run folder, and never stops on a failure.

    python -m recipes.cluster.ray_jobs resources --address http://HEAD:8265   # total and free resources of a cluster
    python -m recipes.cluster.ray_jobs wait --address HEAD:6379 --nodes 4     # until 4 nodes are alive (scripts use it)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shlex
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from recipes import envvars
from recipes.check.schema import Launcher, load_section
from recipes.cluster.nccl_env import pack_env
from recipes.cluster.ray_resources import cpus_needed
from recipes.compose.confdir import entry_command
from recipes.compose.defaults import GPU_INTENT
from recipes.compose.overrides import chosen_keys, override_key
from recipes.errors import ConfigError
from recipes.record.redact import redact_env
from recipes.run.monitor import final_metrics

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
JOB_LOG = "job.log"
JOB_RECORD = "job.json"
SWEEP_RECORD = "sweep_results.json"
# overrides that choose how to launch: the job itself always runs launcher=local on the cluster
_LAUNCH_KEYS = ("launcher", "hydra/launcher")
# env that the job's driver needs whatever the run: unbuffered logs; ray.init's runtime env may repeat the job's keys
BASE_JOB_ENV = {"PYTHONUNBUFFERED": "1", "RAY_OVERRIDE_JOB_RUNTIME_ENV": "1", envvars.RAY_JOB: "1"}


# -- connecting ---------------------------------------------------------------------------------------------------


def dashboard_url(address: str | None) -> str:
    """http://HOST:PORT of a cluster's Ray Jobs API, from launcher.address (a bare HOST:PORT gets http://)."""
    if not address or str(address).strip() in ("", "None", "null"):
        raise ConfigError("launcher.address: not set; give the cluster's dashboard address, e.g. "
                          "launcher.address=http://HEAD:8265 (or export RAY_ADDRESS=http://HEAD:8265)")
    address = str(address).strip()
    if address.startswith("ray://"):
        raise ConfigError(f"launcher.address: {address} is a Ray Client address; Ray Jobs use the dashboard "
                          f"address, http://HEAD:8265")
    if "://" not in address:
        address = f"http://{address}"
    return address.rstrip("/")


def _enable_token_auth_if_available() -> None:
    """Ray >= 2.5x clusters may require the token of ~/.ray/auth_token (or $RAY_AUTH_TOKEN); send it when there."""
    try:
        # lazy: Ray costs seconds and only launcher=ray reaches this; a private module that older Ray lacks
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:
        return
    quiet = logging.getLogger("ray._private.authentication.authentication_token_setup")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    except Exception:  # noqa: BLE001 - no token: the request says so
        pass
    finally:
        quiet.setLevel(level)


def connect(address: str | None):
    """A JobSubmissionClient for the cluster; ConfigError with one line when nothing answers there."""
    url = dashboard_url(address)
    _enable_token_auth_if_available()
    from ray.job_submission import JobSubmissionClient  # lazy: Ray costs seconds; only launcher=ray connects

    try:
        return JobSubmissionClient(url)
    except Exception as error:  # noqa: BLE001 - ConnectionError, AuthenticationError, version errors ...
        reason = " ".join(str(error).split())
        if "refused" in reason.lower() or "Failed to connect" in reason or "Max retries" in reason:
            reason = "connection refused"
        if len(reason) > 200:
            reason = reason[:200] + "..."
        raise ConfigError(f"launcher.address: no Ray cluster answers at {url} ({reason}); start one with "
                          f"scripts/ray_head.sh, or set launcher.address=http://HEAD:8265") from None


def _node_totals(client) -> dict[str, float]:
    total: dict[str, float] = {}
    response = client._do_request("GET", "/api/v0/nodes?limit=10000")
    for node in response.json()["data"]["result"]["result"]:
        if node.get("state") != "ALIVE":
            continue
        for name, value in (node.get("resources_total") or {}).items():
            total[name] = total.get(name, 0.0) + float(value)
    return total


def cluster_resources(client, wait_s: float = 60.0) -> tuple[dict[str, float], dict[str, float]]:
    """(total, free) resources of the cluster's alive nodes: CPU, GPU, ... (free = total less the autoscaler's usage
    report, when the dashboard has one yet). Waits up to ``wait_s`` for a node with CPUs: a head that just started
    answers before its node has registered."""
    deadline = time.monotonic() + wait_s
    while not (total := _node_totals(client)).get("CPU"):
        if time.monotonic() > deadline:
            raise ConfigError(f"launcher.address: the Ray cluster at {getattr(client, '_address', '?')} has no alive "
                              f"node with CPUs after {wait_s:g} s")
        time.sleep(1.0)
    free = dict(total)
    try:
        response = client._do_request("GET", "/api/cluster_status")
        usage = response.json()["data"]["clusterStatus"]["loadMetricsReport"]["usage"]
        for name, (used, _whole) in usage.items():
            if name in free:
                free[name] = max(0.0, total[name] - float(used))
    except Exception:  # noqa: BLE001 - no usage report (yet): everything counts as free
        pass
    return total, free


# -- what a job runs ------------------------------------------------------------------------------------------------


def _is_launch_override(arg: str) -> bool:
    key = override_key(arg) or ""
    return any(key == k or key.startswith(k + ".") for k in _LAUNCH_KEYS) or key.startswith("hydra.launcher")


def job_overrides(overrides: Sequence[str], run_dir: str | os.PathLike, cluster_choice: str | None = None) -> list[str]:
    """The job's command-line overrides: the run's own, less the launcher choice, plus launcher=local and its folder.

    ``cluster_choice`` (the cluster/ option the driver composed) is pinned when the run does not choose a layout, so
    the job composes what the driver validated even on a node whose GPUs differ from the driver's.
    """
    out = [a for a in overrides if not _is_launch_override(a) and not a.startswith("hydra.run.dir=")]
    chosen = chosen_keys(out)
    if cluster_choice and not chosen & set(GPU_INTENT):
        out.append(f"cluster={cluster_choice}")
    out.append("launcher=local")
    out.append(f"hydra.run.dir={_hydra_quote(str(job_run_dir(run_dir)))}")
    return out


def job_run_dir(run_dir: str | os.PathLike, launch_dir: Path | None = None) -> Path:
    """The run folder as the job sees it: relative to the launch folder when inside it (so an uploaded job writes
    inside its own copy, and a job on a shared folder writes right here)."""
    run_dir = Path(run_dir)
    launch_dir = (launch_dir or Path.cwd()).resolve()
    if run_dir.is_absolute():
        try:
            return run_dir.resolve().relative_to(launch_dir)
        except ValueError:
            return run_dir
    return run_dir


def _hydra_quote(value: str) -> str:
    if all(c.isalnum() or c in "/._-:" for c in value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def entrypoint(recipe: str, overrides: Sequence[str], launcher: DictConfig, launch_dir: Path) -> str:
    """The shell command the Ray Job runs (from the launch folder itself when the cluster shares it)."""
    settings = load_section(Launcher, launcher, "launcher")
    entry = entry_command(recipe, python=settings.python or "python")
    command = shlex.join([*entry, *overrides])
    if not settings.upload:
        command = f"cd {shlex.quote(str(launch_dir))} && {command}"
    return command


def job_runtime_env(cfg: DictConfig, launch_dir: Path) -> dict:
    """The Ray Job's runtime env: working folder (uploaded), pip, and the env map for the job's driver."""
    launcher = load_section(Launcher, cfg.launcher, "launcher")
    env = {**BASE_JOB_ENV, **pack_env(cfg)}
    env.update({str(k): str(v) for k, v in launcher.env_vars.items()})
    runtime_env: dict = {"env_vars": env}
    if launcher.upload:
        runtime_env["working_dir"] = str(launch_dir)
        if launcher.excludes:
            runtime_env["excludes"] = [str(e) for e in launcher.excludes]
    if launcher.pip:
        runtime_env["pip"] = launcher.pip
    return runtime_env


def job_demand(cfg: DictConfig, per_job: dict | None = None) -> dict[str, float]:
    """Resources one job holds while it runs: 1 CPU to validate or plan; to train, a GPU per rank (logical GPUs for
    the CPU path) and verl's CPUs (3 per rank and 2 beside, + 2 for the job, or ray_kwargs.ray_init.num_cpus when the
    run declares it)."""
    if per_job:
        return {str(k): float(v) for k, v in per_job.items()}
    if OmegaConf.select(cfg, "action") != "train":
        return {"CPU": 1.0}
    world = int(OmegaConf.select(cfg, "cluster.nnodes", default=1)) * int(
        OmegaConf.select(cfg, "cluster.gpus_per_node", default=1))
    declared = OmegaConf.select(cfg, "ray_kwargs.ray_init.num_cpus", default=None)
    # verl's own CPUs for the ranks (recipes.cluster.ray_resources), and 2 more for the job's driver and its start-up
    cpus = float(declared) if declared else float(cpus_needed(world) + 2)
    return {"GPU": float(world), "CPU": cpus}


# -- one run -----------------------------------------------------------------------------------------------------


def _submission_id(recipe: str, num: int | None = None) -> str:
    stamp = time.strftime("%Y%m%d_%H%M%S")
    suffix = f"_{num}" if num is not None else ""
    return f"klppo_{recipe}_{stamp}_{uuid.uuid4().hex[:6]}{suffix}"


def exit_code_of(info) -> int:
    """The job's exit code: its driver's, 0 when it succeeded, 130 when stopped, 1 when failed without one."""
    status = str(getattr(info.status, "value", info.status))
    code = getattr(info, "driver_exit_code", None)
    if status == "SUCCEEDED":
        return 0
    if status == "STOPPED":
        return 130
    return int(code) if code not in (None, 0) else 1


def _status(client, job_id: str) -> str:
    status = client.get_job_status(job_id)
    return str(getattr(status, "value", status))


def follow(client, job_id: str, log_path: Path | None, echo: bool = True, timeout_s: float | None = None,
           poll_s: float = 1.0):
    """Stream the job's log (to the terminal and ``log_path``) until it ends; the final JobDetails.

    Stops the job on Ctrl-C or when ``timeout_s`` passes.
    """
    start = time.monotonic()
    sink = open(log_path, "a") if log_path else None  # noqa: SIM115 - closed below

    def write(chunk: str) -> None:
        if sink:
            sink.write(chunk)
            sink.flush()
        if echo:
            sys.stdout.write(chunk)
            sys.stdout.flush()

    async def tail() -> None:
        async for chunk in client.tail_job_logs(job_id):
            write(chunk)

    try:
        try:
            asyncio.run(asyncio.wait_for(tail(), timeout_s) if timeout_s else tail())
        except asyncio.TimeoutError:
            client.stop_job(job_id)
            write(f"\n[klppo] job {job_id} stopped: timeout_s={timeout_s} passed\n")
        except KeyboardInterrupt:
            raise
        except Exception:  # noqa: BLE001 - no websocket (proxies): poll the log instead
            seen = 0
            while _status(client, job_id) not in TERMINAL:
                if timeout_s and time.monotonic() - start > timeout_s:
                    client.stop_job(job_id)
                    break
                text = client.get_job_logs(job_id)
                write(text[seen:])
                seen = len(text)
                time.sleep(poll_s)
            text = client.get_job_logs(job_id)
            write(text[seen:])
        while _status(client, job_id) not in TERMINAL:
            time.sleep(poll_s)
    except KeyboardInterrupt:
        client.stop_job(job_id)
        write(f"\n[klppo] interrupted: stopped Ray Job {job_id}\n")
        raise
    finally:
        if sink:
            sink.close()
    return client.get_job_info(job_id)


def submit_run(cfg: DictConfig, recipe: str, overrides: Sequence[str], run_dir: Path,
               cluster_choice: str | None = None) -> int:
    """``launcher=ray``: submit this run as a Ray Job, stream its log, write job.json; the job's exit code."""
    launcher = cfg.launcher
    settings = load_section(Launcher, launcher, "launcher")
    client = connect(settings.address)
    launch_dir = Path.cwd()
    job_args = job_overrides(overrides, run_dir, cluster_choice)
    command = entrypoint(recipe, job_args, launcher, launch_dir)
    runtime_env = job_runtime_env(cfg, launch_dir)
    job_id = _submission_id(recipe)
    run_dir.mkdir(parents=True, exist_ok=True)
    record = {"submission_id": job_id, "address": dashboard_url(settings.address), "entrypoint": command,
              "runtime_env": _redacted_env(runtime_env), "run_dir": str(run_dir)}
    try:
        client.submit_job(entrypoint=command, runtime_env=runtime_env, submission_id=job_id,
                          metadata={"recipe": recipe, "run_dir": str(run_dir)})
    except Exception as error:  # noqa: BLE001 - the cluster refused the job (runtime env, size of the upload ...)
        raise ConfigError(f"launcher: the cluster at {record['address']} refused the job: "
                          f"{' '.join(str(error).split())[:300]}") from None
    print(f"submitted Ray Job {job_id} to {record['address']} (run folder {run_dir}); its log follows")
    (run_dir / JOB_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    info = follow(client, job_id, run_dir / JOB_LOG, echo=settings.follow, timeout_s=settings.timeout_s)
    code = exit_code_of(info)
    record.update(status=str(getattr(info.status, "value", info.status)), exit_code=code, message=info.message)
    (run_dir / JOB_RECORD).write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(f"Ray Job {job_id}: {record['status']} (exit code {code})")
    return code


def _redacted_env(runtime_env: dict) -> dict:
    out = dict(runtime_env)
    out["env_vars"] = redact_env(runtime_env.get("env_vars", {}))
    return out


# -- sweeps ------------------------------------------------------------------------------------------------------


@dataclass
class JobSpec:
    """One job of a sweep, ready to submit (or already failed in the driver: ``error``)."""

    num: int
    overrides: list[str]
    run_dir: Path
    entrypoint: str | None = None
    runtime_env: dict = field(default_factory=dict)
    demand: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    shown: list[str] | None = None
    """the overrides that tell this job apart from the sweep's others (default: all of them)"""

    @property
    def label(self) -> str:
        return " ".join(self.overrides if self.shown is None else self.shown) or "(no overrides)"


def distinguishing(overrides: Sequence[Sequence[str]]) -> list[list[str]]:
    """Per job, the overrides that not every job of the sweep shares (the swept values)."""
    common = set.intersection(*(set(o) for o in overrides)) if overrides else set()
    return [[a for a in o if a not in common] for o in overrides]


@dataclass
class JobResult:
    """What became of one job of a sweep."""

    num: int
    overrides: list[str]
    run_dir: str
    status: str
    exit_code: int | None
    submission_id: str | None = None
    seconds: float | None = None
    message: str | None = None
    reward: float | None = None
    """the last step's mean reward, read from the job's metrics.jsonl when its run folder is visible here"""
    kl: float | None = None
    """the last step's KL to the reference, likewise"""

    @property
    def ok(self) -> bool:
        return self.status == "SUCCEEDED"


def _fits(demand: dict[str, float], budget: dict[str, float], in_use: Counter) -> bool:
    return all(in_use[name] + amount <= budget.get(name, 0.0) + 1e-9 for name, amount in demand.items())


def _short(resources: dict[str, float]) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in sorted(resources.items()))


def run_sweep(client, specs: Sequence[JobSpec], *, total: dict[str, float], free: dict[str, float],
              max_concurrent: int | None = None, poll_s: float = 1.0, timeout_s: float | None = None,
              recipe: str = "run", echo: Callable[[str], None] = print) -> list[JobResult]:
    """Run every job as its own Ray Job, as many at once as ``free`` allows; never stop on a failure.

    A job that needs more than the whole cluster fails at once; one that needs more than is free runs alone (it waits
    in Ray's queue for the others' resources). Each job's log lands in its run folder as job.log.
    """
    results: dict[int, JobResult] = {}
    pending: list[JobSpec] = []
    for spec in specs:
        spec.run_dir = Path(spec.run_dir).absolute()  # this machine's copy: job.json, job.log (and all on shared disks)
        too_big = {k: v for k, v in spec.demand.items() if v > total.get(k, 0.0) + 1e-9}
        if spec.error is None and too_big:
            spec.error = (f"needs {_short(spec.demand)} but the whole cluster has "
                          f"{_short({k: total.get(k, 0.0) for k in spec.demand})}")
        if spec.error is not None:
            results[spec.num] = JobResult(spec.num, spec.overrides, str(spec.run_dir), "NOT_SUBMITTED", None,
                                          message=spec.error)
            _write_job_record(spec.run_dir, {"status": "NOT_SUBMITTED", "message": spec.error,
                                             "overrides": spec.overrides})
            echo(f"#{spec.num} {spec.label}: not submitted: {spec.error}")
        else:
            pending.append(spec)
    running: dict[str, tuple[JobSpec, float]] = {}
    in_use: Counter = Counter()
    while pending or running:
        for spec in list(pending):
            if max_concurrent and len(running) >= max_concurrent:
                break
            if not (_fits(spec.demand, free, in_use) or not running):
                continue
            job_id = _submission_id(recipe, spec.num)
            spec.run_dir.mkdir(parents=True, exist_ok=True)
            try:
                client.submit_job(entrypoint=spec.entrypoint, runtime_env=spec.runtime_env, submission_id=job_id,
                                  metadata={"recipe": recipe, "run_dir": str(spec.run_dir), "job_num": str(spec.num)})
            except Exception as error:  # noqa: BLE001 - one refused job does not stop the sweep
                message = " ".join(str(error).split())[:300]
                results[spec.num] = JobResult(spec.num, spec.overrides, str(spec.run_dir), "NOT_SUBMITTED", None,
                                              message=f"the cluster refused the job: {message}")
                _write_job_record(spec.run_dir, {"status": "NOT_SUBMITTED", "message": results[spec.num].message,
                                                 "overrides": spec.overrides})
                echo(f"#{spec.num} {spec.label}: refused by the cluster: {message}")
                pending.remove(spec)
                continue
            (spec.run_dir / JOB_RECORD).write_text(json.dumps(
                {"submission_id": job_id, "entrypoint": spec.entrypoint, "runtime_env": _redacted_env(spec.runtime_env),
                 "demand": spec.demand, "run_dir": str(spec.run_dir)}, indent=2) + "\n")
            running[job_id] = (spec, time.monotonic())
            in_use.update(spec.demand)
            pending.remove(spec)
            echo(f"#{spec.num} {spec.label}: submitted as {job_id} ({_short(spec.demand)})")
        time.sleep(poll_s)
        for job_id, (spec, started) in list(running.items()):
            status = _status(client, job_id)
            if status not in TERMINAL:
                if timeout_s and time.monotonic() - started > timeout_s:
                    client.stop_job(job_id)
                continue
            info = client.get_job_info(job_id)
            try:
                log_text = client.get_job_logs(job_id)
                (spec.run_dir / JOB_LOG).write_text(log_text)
            except Exception:  # noqa: BLE001 - the log is a convenience
                log_text = ""
            seconds = round(time.monotonic() - started, 1)
            message = info.message
            if status != "SUCCEEDED":
                # the job's own last words say more than Ray's "entrypoint command failed ..."
                last = [line for line in log_text.splitlines() if line.strip()]
                message = last[-1].strip()[:300] if last else message
            reward, kl = final_metrics(spec.run_dir)  # a shared file system: the sweep folder is the job's
            result = JobResult(spec.num, spec.overrides, str(spec.run_dir), status, exit_code_of(info), job_id,
                               seconds, message, reward, kl)
            results[spec.num] = result
            record = json.loads((spec.run_dir / JOB_RECORD).read_text())
            record.update(status=status, exit_code=result.exit_code, seconds=seconds, message=message)
            (spec.run_dir / JOB_RECORD).write_text(json.dumps(record, indent=2, default=str) + "\n")
            in_use.subtract(spec.demand)
            del running[job_id]
            echo(f"#{spec.num} {spec.label}: {status} in {seconds:g} s, exit code {result.exit_code} "
                 f"(run folder {spec.run_dir})")
    return [results[spec.num] for spec in specs]


def _write_job_record(run_dir: Path, record: dict) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / JOB_RECORD).write_text(json.dumps(record, indent=2, default=str) + "\n")


def write_sweep_record(sweep_dir: Path, results: Sequence[JobResult], address: str) -> Path:
    path = Path(sweep_dir) / SWEEP_RECORD
    path.write_text(json.dumps({"address": address, "jobs": [asdict(r) for r in results]}, indent=2, default=str)
                    + "\n")
    return path


def summary_table(results: Sequence[JobResult]) -> str:
    """One line per job: status, exit code, seconds, final reward and KL, run folder and the overrides that set it
    apart."""
    shown = distinguishing([r.overrides for r in results]) if len(results) > 1 else [r.overrides for r in results]
    lines = [f"{'#':>3}  {'status':<13} {'exit':>4} {'seconds':>8} {'reward':>8} {'kl':>8}  run folder  (overrides)"]
    for r, label in zip(results, shown, strict=True):
        seconds = "" if r.seconds is None else f"{r.seconds:g}"
        code = "" if r.exit_code is None else str(r.exit_code)
        reward = "" if r.reward is None else f"{r.reward:+.3f}"
        kl = "" if r.kl is None else f"{r.kl:.4f}"
        lines.append(f"{r.num:>3}  {r.status:<13} {code:>4} {seconds:>8} {reward:>8} {kl:>8}  {r.run_dir}  "
                     f"({' '.join(label)})")
        if not r.ok and r.message:
            lines.append(f"{'':>5}{r.message.splitlines()[0][:200]}")
    return "\n".join(lines)


# -- helpers for the scripts -----------------------------------------------------------------------------------------


def wait_for_nodes(address: str, nodes: int, timeout_s: float = 300.0, poll_s: float = 2.0) -> int:
    """Block until ``nodes`` Ray nodes are alive in the cluster at ``address`` (GCS HOST:PORT); their count."""
    import ray  # lazy: seconds to import; the CLI loads this module at start, only the `wait` command needs Ray

    deadline = time.monotonic() + timeout_s
    alive = 0
    ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
    try:
        while True:
            alive = sum(1 for node in ray.nodes() if node.get("Alive"))
            if alive >= nodes or time.monotonic() > deadline:
                return alive
            time.sleep(poll_s)
    finally:
        ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recipes.cluster.ray_jobs")
    sub = parser.add_subparsers(dest="command", required=True)
    res = sub.add_parser("resources", help="total and free CPUs/GPUs of a cluster (Ray Jobs API address)")
    res.add_argument("--address", default=os.environ.get("RAY_ADDRESS"))
    wait = sub.add_parser("wait", help="wait until N nodes are alive (GCS address HOST:PORT)")
    wait.add_argument("--address", required=True)
    wait.add_argument("--nodes", type=int, required=True)
    wait.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    if args.command == "resources":
        try:
            total, free = cluster_resources(connect(args.address))
        except ConfigError as error:
            print(error.problems[0], file=sys.stderr)
            return 2
        keys = [k for k in ("CPU", "GPU", "memory") if k in total]
        for key in keys:
            print(f"{key}: {free[key]:g} free of {total[key]:g}")
        return 0
    alive = wait_for_nodes(args.address, args.nodes, args.timeout)
    print(f"{alive} of {args.nodes} Ray nodes alive at {args.address}")
    return 0 if alive >= args.nodes else 1


def preflight(cfg: DictConfig) -> None:
    """Before Hydra makes a run folder: with launcher=ray and action=train the cluster must answer (one line if not)."""
    if OmegaConf.select(cfg, "launcher.name") == "ray" and OmegaConf.select(cfg, "action") == "train":
        connect(OmegaConf.select(cfg, "launcher.address"))


def submit_from_hydra(cfg: DictConfig, run_dir: str | os.PathLike) -> int:
    """The launch flow's call for ``launcher=ray action=train``: submit this Hydra job's run; its exit code."""
    hydra_cfg = HydraConfig.get()
    return submit_run(cfg, hydra_cfg.job.config_name, list(hydra_cfg.overrides.task), Path(run_dir),
                      hydra_cfg.runtime.choices.get("cluster"))


if __name__ == "__main__":
    sys.exit(main())
