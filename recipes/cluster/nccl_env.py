"""The environment every Ray worker gets: the nccl/ preset over verl's own defaults, its conflicts, and the record.

verl 0.9.1's ``run_ppo`` calls ``ray.init(runtime_env=...)`` with ``get_ppo_ray_runtime_env(config)``
(NCCL_DEBUG=WARN, TOKENIZERS_PARALLELISM=true, ... each only when the launching shell does not already set it;
CUDA_DEVICE_MAX_CONNECTIONS=1 for Megatron on Ampere/Hopper) merged under ``ray_kwargs.ray_init.runtime_env`` (where
the pack puts the nccl/ map). Ray sets those variables in every worker process on every node. This module computes
the same merge in the driver (with verl's own function), says where each value comes from, reports what conflicts,
and writes it to the run folder:

    python -m recipes.cluster.nccl_env grpo nccl=ib strategy=megatron parallel=tp8   # what the workers will get
    python -m recipes.cluster.nccl_env --probe out.json grpo nccl=ib                 # ... and what a Ray worker sees

Conflicts it reports: a preset value that replaces one verl forces; a launching-shell value that the workers do not
get (the runtime env wins, or, on an existing cluster, the shell is not forwarded at all while verl skips its default
because the shell has it); CUDA_DEVICE_MAX_CONNECTIONS outside Megatron or on Blackwell; and, inside a Ray Job, env
keys that both the job and ``ray.init`` set (Ray refuses that merge unless RAY_OVERRIDE_JOB_RUNTIME_ENV=1).
"""

from __future__ import annotations

import gc
import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from unittest import mock

from omegaconf import DictConfig, OmegaConf, open_dict

from recipes.check.schema import NCCL, load_section
from recipes.compose.compose import compose_recipe
from recipes.errors import ConfigError, exit_with
from recipes.record.redact import redact_env
from recipes.verl_ext import api as verl

VERL_VERSION = "0.9.1"  # the run_ppo logic mirrored here (ray init, determinism, transfer queue) is verl 0.9.1's
ENV_KEY = "ray_kwargs.ray_init.runtime_env.env_vars"
JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set by Ray in a Ray Job's driver
OVERRIDE_JOB_ENV = "RAY_OVERRIDE_JOB_RUNTIME_ENV"
RECORD_FILE = "nccl_env.json"
# variables of the collective stack that a worker may also inherit from the process that started Ray
_COLLECTIVE = re.compile(r"^(NCCL_|TORCH_NCCL_|TORCH_DISTRIBUTED_|GLOO_|UCX_|NVSHMEM_|CUDA_DEVICE_MAX_CONNECTIONS$)")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class WorkerEnv:
    """What every Ray worker of a run gets, and why."""

    mode: str
    """local (ray.init starts Ray in this process), cluster (RAY_ADDRESS: join an existing one) or job (a Ray Job)"""
    env: dict[str, str]
    """set in every worker by the runtime env: verl's defaults, then the pack's map (and the Ray Job's env_vars)"""
    sources: dict[str, str]
    """env key -> where its value comes from"""
    inherited: dict[str, str]
    """collective-stack variables the workers inherit from this process (local mode only; else unknown here)"""
    conflicts: list[str] = field(default_factory=list)
    """one line each: what conflicts and which value wins"""
    problems: list[str] = field(default_factory=list)
    """conflicts that stop the run (ray.init would fail)"""
    nccl_version: str | None = None
    verl_version: str | None = None


def _plain(node) -> dict[str, str]:
    if node is None:
        return {}
    if isinstance(node, DictConfig):
        node = OmegaConf.to_container(node, resolve=True)
    return {str(k): str(v) for k, v in dict(node).items() if v is not None}


def pack_env(cfg: DictConfig) -> dict[str, str]:
    """The pack's map for every worker: ``ray_kwargs.ray_init.runtime_env.env_vars`` (the nccl/ option), resolved."""
    return _plain(OmegaConf.select(cfg, ENV_KEY, default=None))


def _mode(environ: Mapping[str, str]) -> str:
    if environ.get(JOB_CONFIG_ENV):
        return "job"
    if environ.get("RAY_ADDRESS"):
        return "cluster"
    return "local"


def _job_runtime_env(environ: Mapping[str, str]) -> dict:
    raw = environ.get(JOB_CONFIG_ENV)
    if not raw:
        return {}
    try:
        return dict(json.loads(raw).get("runtime_env") or {})
    except (ValueError, AttributeError):
        return {}


def verl_runtime_env(cfg: DictConfig, environ: Mapping[str, str] | None = None) -> dict:
    """verl 0.9.1's own defaults for ray.init's runtime env, as ``run_ppo`` builds them in a process with ``environ``.

    Calls verl's ``get_ppo_ray_runtime_env`` (which reads os.environ) with ``environ`` in place, and adds what run_ppo
    adds around it: the determinism variables and TRANSFER_QUEUE_ENABLE.
    """
    environ = dict(os.environ if environ is None else environ)
    rollout = OmegaConf.select(cfg, "actor_rollout_ref.rollout", default=None)
    if rollout is not None and OmegaConf.select(rollout, "full_determinism", default=False):
        environ.update(VERL_FULL_DETERMINISM="1", VLLM_BATCH_INVARIANT="1", PYTHONHASHSEED=str(rollout.seed))
    loggers = OmegaConf.select(cfg, "trainer.logger", default=[]) or []
    if "rl_insight" in ([loggers] if isinstance(loggers, str) else list(loggers)):
        environ["VERL_RL_INSIGHT_ENABLE"] = "1"
    with mock.patch.dict(os.environ, environ, clear=True):
        runtime_env = verl.ppo_ray_runtime_env(cfg)
    runtime_env["env_vars"] = {str(k): str(v) for k, v in dict(runtime_env.get("env_vars") or {}).items()}
    if OmegaConf.select(cfg, "transfer_queue.enable", default=False):
        runtime_env["env_vars"]["TRANSFER_QUEUE_ENABLE"] = "1"
    return runtime_env


def ray_init_runtime_env(cfg: DictConfig, environ: Mapping[str, str] | None = None) -> dict:
    """The runtime_env verl 0.9.1's run_ppo passes to ray.init: its defaults merged under ray_kwargs.ray_init's."""
    merged = verl_runtime_env(cfg, environ)
    user = OmegaConf.select(cfg, "ray_kwargs.ray_init.runtime_env", default=None)
    user = OmegaConf.to_container(user, resolve=True) if isinstance(user, DictConfig) else dict(user or {})
    for key, value in user.items():
        if key == "env_vars":
            merged["env_vars"] = {**merged["env_vars"], **{str(k): str(v) for k, v in (value or {}).items()}}
        else:
            merged[key] = value
    return merged


def _source_of(key: str, value: str, cfg: DictConfig) -> str:
    strategy = OmegaConf.select(cfg, "strategy.name", default=None)
    nccl = load_section(NCCL, cfg.get("nccl"), "nccl")
    if strategy == "megatron" and key in _plain(nccl.megatron_env):
        return "nccl.megatron_env"
    if key in _plain(nccl.env):
        return "nccl.env"
    return ENV_KEY


def _uses_megatron(cfg: DictConfig) -> bool:
    return any(OmegaConf.select(cfg, k, default=None) == "megatron"
               for k in ("actor_rollout_ref.actor.strategy", "critic.strategy", "strategy.name"))


def _device_major() -> int | None:
    try:
        import torch  # lazy: seconds to import; the CLI loads this module at start, only the CUDA probe needs it

        if torch.cuda.is_available():
            return torch.cuda.get_device_capability()[0]
    except Exception:  # noqa: BLE001 - no CUDA runtime: unknown
        return None
    return None


def nccl_version() -> str | None:
    """The NCCL torch was built with (CUDA builds only)."""
    try:
        import torch  # lazy: seconds to import; the CLI loads this module at start, only the CUDA probe needs it

        if torch.cuda.is_available():
            version = torch.cuda.nccl.version()
            return ".".join(str(v) for v in version) if isinstance(version, tuple) else str(version)
    except Exception:  # noqa: BLE001
        return None
    return None


def worker_env(cfg: DictConfig, environ: Mapping[str, str] | None = None, *,
               device_major: int | None = None) -> WorkerEnv:
    """The variables every Ray worker of this run gets, where each comes from, and every conflict.

    ``environ`` is the environment of the process that calls ray.init (default: this one); ``device_major`` the GPU's
    compute capability major (default: read from CUDA when present).
    """
    environ = dict(os.environ if environ is None else environ)
    mode = _mode(environ)
    if device_major is None:
        device_major = _device_major()
    conflicts: list[str] = []
    problems: list[str] = []
    pack = pack_env(cfg)
    for key in pack:
        if not _ENV_NAME.match(key):
            problems.append(f"{ENV_KEY}.{key}: not a valid environment variable name")
    verl_defaults = verl_runtime_env(cfg, environ)["env_vars"]
    # what verl would force if this shell set none of the collective variables (it skips those the shell sets)
    verl_unfiltered = verl_runtime_env(cfg, {k: v for k, v in environ.items() if not _COLLECTIVE.match(k)})["env_vars"]

    env: dict[str, str] = {}
    sources: dict[str, str] = {}
    job_env = {str(k): str(v) for k, v in (_job_runtime_env(environ).get("env_vars") or {}).items()}
    for key, value in job_env.items():
        env[key], sources[key] = value, "the Ray Job's runtime env"
    for key, value in verl_defaults.items():
        env[key], sources[key] = value, f"verl {VERL_VERSION} default"
    if "CUDA_DEVICE_MAX_CONNECTIONS" in verl_defaults and "CUDA_DEVICE_MAX_CONNECTIONS" not in job_env:
        sources["CUDA_DEVICE_MAX_CONNECTIONS"] = f"verl {VERL_VERSION} (Megatron on Ampere/Hopper)"
    for key, value in pack.items():
        source = _source_of(key, value, cfg)
        forced = verl_defaults.get(key)
        if forced is not None and forced != value:
            conflicts.append(f"{key}: {source} sets {value!r}, verl {VERL_VERSION} forces {forced!r}: the pack's "
                             f"value wins in every worker (ray_kwargs.ray_init.runtime_env is merged over verl's)")
        shell = environ.get(key)
        if shell is not None and shell != value:
            conflicts.append(f"{key}: the launching shell exports {shell!r}, {source} sets {value!r}: Ray workers get "
                             f"{value!r}, this driver process keeps {shell!r}")
        env[key], sources[key] = value, source

    inherited: dict[str, str] = {}
    shell_collective = {k: v for k, v in environ.items() if _COLLECTIVE.match(k)}
    if mode == "local":
        inherited = {k: v for k, v in shell_collective.items() if k not in env}
        for key in inherited:
            sources.setdefault(key, "inherited from the launching shell")
    else:
        for key, value in sorted(shell_collective.items()):
            if key in env:
                continue
            skipped = key in verl_unfiltered
            why = (f"verl {VERL_VERSION} skips its own {key}={verl_unfiltered[key]!r} because this shell sets it"
                   if skipped else "Ray workers on an existing cluster do not inherit the launching shell")
            conflicts.append(f"{key}: this shell exports {value!r} but workers of an existing cluster do not get it "
                             f"({why}); put it in the run's map to reach every worker: +nccl.env.{key}={value}")

    # CUDA_DEVICE_MAX_CONNECTIONS: verl sets 1 only for Megatron on Ampere/Hopper; FSDP must not serialise launches
    connections = env.get("CUDA_DEVICE_MAX_CONNECTIONS", inherited.get("CUDA_DEVICE_MAX_CONNECTIONS"))
    if connections is not None:
        where = sources.get("CUDA_DEVICE_MAX_CONNECTIONS", "the launching shell")
        if not _uses_megatron(cfg):
            conflicts.append(f"CUDA_DEVICE_MAX_CONNECTIONS={connections} ({where}) with strategy "
                             f"{OmegaConf.select(cfg, 'strategy.name', default='?')}: verl {VERL_VERSION} sets it only "
                             f"for Megatron; FSDP/FSDP2 must not serialise kernel launches (remove it)")
        elif device_major is not None and device_major >= 10 and not where.startswith("verl"):
            conflicts.append(f"CUDA_DEVICE_MAX_CONNECTIONS={connections} ({where}) on compute capability "
                             f"{device_major}.x: verl {VERL_VERSION} leaves it unset on Blackwell, which does not need "
                             f"it for TP/CP overlap")

    if mode == "job":
        job_keys = set(job_env)
        init_keys = set(ray_init_runtime_env(cfg, environ).get("env_vars", {}))
        both = sorted(job_keys & init_keys)
        if both and environ.get(OVERRIDE_JOB_ENV) != "1":
            problems.append(
                f"{ENV_KEY}: this Ray Job's runtime env already sets {', '.join(both)}, which ray.init sets too: Ray "
                f"refuses to merge them; submit with launcher=ray (it sets {OVERRIDE_JOB_ENV}=1) or add "
                f"{OVERRIDE_JOB_ENV}=1 to the job's env_vars"
            )
        elif both:
            for key in both:
                if job_env[key] != env[key]:
                    conflicts.append(f"{key}: the Ray Job sets {job_env[key]!r}, ray.init sets {env[key]!r}: "
                                     f"{env[key]!r} wins ({OVERRIDE_JOB_ENV}=1)")

    try:
        verl_version = verl.installed_version()
    except Exception:  # noqa: BLE001
        verl_version = None
    if verl_version and verl_version != VERL_VERSION:
        conflicts.append(f"verl {verl_version} is installed; this record mirrors verl {VERL_VERSION}'s run_ppo")
    return WorkerEnv(mode=mode, env=dict(sorted(env.items())), sources=dict(sorted(sources.items())),
                     inherited=dict(sorted(inherited.items())), conflicts=conflicts, problems=problems,
                     nccl_version=nccl_version(), verl_version=verl_version)


def write_record(run_dir: str | os.PathLike, record: WorkerEnv) -> Path:
    """Write the values in effect to ``run_dir/nccl_env.json`` (secret-looking values redacted)."""
    path = Path(run_dir) / RECORD_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    data = asdict(record)
    data["env"] = redact_env(data["env"])
    data["inherited"] = redact_env(data["inherited"])
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def summary(record: WorkerEnv) -> str:
    """One line: the collective-stack variables every worker gets."""
    shown = {k: v for k, v in record.env.items() if _COLLECTIVE.match(k)}
    if not shown:
        return "nccl env for every worker: NCCL and torch defaults"
    return "nccl env for every worker: " + " ".join(f"{k}={v}" for k, v in shown.items())


# -- a probe: what a real Ray worker sees, through verl's own run_ppo --------------------------------------------------


def _probe_runner_class():
    import ray  # lazy: seconds to import, and only --probe starts a Ray worker

    @ray.remote(num_cpus=0)
    class ProbeRunner:
        """Stands in for verl's TaskRunner: records the environment of a Ray worker process."""

        def run(self, config):
            out = OmegaConf.select(config, "probe_out")
            # secret values as *** (recipes/record/redact.py): the file shows that a token arrived, not the token
            data = {"pid": os.getpid(), "cwd": os.getcwd(), "env": redact_env(dict(os.environ)),
                    "gc_threshold": list(gc.get_threshold())}  # run.gc_threshold, set by the setup hook
            Path(out).write_text(json.dumps(data, indent=2))
            return data

    return ProbeRunner


def probe(cfg: DictConfig, out: str | os.PathLike) -> dict:
    """Run verl's ``run_ppo`` with a runner that writes a Ray worker's environment to ``out``; return it.

    ray.init happens exactly as in training (verl's code, this run's ray_kwargs), so the file shows the values in
    effect in a worker. Inside a Ray Job it joins the job's cluster; else it starts Ray (pass ray_kwargs.ray_init.*).
    """
    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    out = Path(out).resolve()
    with _open(cfg):
        cfg.probe_out = str(out)
    if _mode(os.environ) != "local":
        _drop_cluster_start_kwargs(cfg)
    verl.run_ppo(cfg, task_runner_class=_probe_runner_class())
    return json.loads(out.read_text())


def _open(cfg):
    return open_dict(cfg)


# ray.init arguments that describe a cluster to start: refused by Ray when joining an existing one
CLUSTER_START_KWARGS = ("num_cpus", "num_gpus", "resources", "object_store_memory", "include_dashboard",
                        "dashboard_host", "dashboard_port", "_temp_dir", "_node_ip_address")


def _drop_cluster_start_kwargs(cfg: DictConfig) -> list[str]:
    node = OmegaConf.select(cfg, "ray_kwargs.ray_init", default=None)
    dropped = []
    if node is None:
        return dropped
    with _open(cfg):
        for key in CLUSTER_START_KWARGS:
            if key in node and node[key] is not None:
                dropped.append(f"{key}={node[key]}")
                del node[key]
    return dropped


def joining_existing_cluster(environ: Mapping[str, str] | None = None) -> bool:
    """True when ray.init will join a running cluster (a Ray Job's driver, or RAY_ADDRESS set)."""
    return _mode(dict(os.environ if environ is None else environ)) != "local"


def adapt_ray_init(cfg: DictConfig, environ: Mapping[str, str] | None = None) -> list[str]:
    """When joining an existing cluster, drop ray_init keys that only describe a cluster to start; the notes."""
    if not joining_existing_cluster(environ):
        return []
    dropped = _drop_cluster_start_kwargs(cfg)
    return [f"note: joining an existing Ray cluster: ray_kwargs.ray_init {', '.join(dropped)} dropped (the cluster's "
            f"own resources apply)"] if dropped else []


def main(argv: list[str] | None = None) -> int:
    """``python -m recipes.cluster.nccl_env [--probe OUT.json] RECIPE [overrides]``: print the worker env and
    conflicts."""
    argv = list(sys.argv[1:] if argv is None else argv)
    out = None
    if argv[:1] == ["--probe"]:
        out, argv = argv[1], argv[2:]
    if not argv:
        print("usage: python -m recipes.cluster.nccl_env [--probe OUT.json] RECIPE [overrides]", file=sys.stderr)
        return 2
    try:
        cfg = compose_recipe(argv[0], argv[1:])
    except ConfigError as error:
        exit_with(error)
    record = worker_env(cfg)
    print(summary(record) + f" (mode: {record.mode})")
    shown = redact_env(record.env)  # the terminal gets what nccl_env.json gets: secret values as ***
    for key in record.env:
        print(f"  {key}={shown[key]}    # {record.sources.get(key, '')}")
    for line in record.conflicts:
        print(f"conflict: {line}")
    for line in record.problems:
        print(f"error: {line}", file=sys.stderr)
    if record.problems:
        return 2
    if out:
        seen = probe(cfg, out)
        keys = sorted(pack_env(cfg))
        print(f"in a Ray worker (pid {seen['pid']}): " + " ".join(f"{k}={seen['env'].get(k)}" for k in keys))
    return 0


def record_lines(record: WorkerEnv, path: Path) -> list[str]:
    """What the terminal shows of the workers' env: each conflict as a warning, then the summary line."""
    return [f"warning: nccl env: {line}" for line in record.conflicts] + [f"{summary(record)} (written to {path})"]


if __name__ == "__main__":
    sys.exit(main())
