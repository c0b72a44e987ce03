"""Run ``python -m verl.trainer.main_ppo`` in a subprocess and measure it: wall time, memory, CPU, per-step metrics.

Used by ``scripts/bench_demo.py`` and ``tests/e2e/test_verl_cpu.py``. The run logs its metrics through verl's own
``file`` logger (``trainer.logger=[console,file]``, path from ``VERL_FILE_LOGGER_PATH``), one JSON line per step, and
this module reads them back. While the run lasts, the whole process tree (driver, Ray's GCS and raylet, every Ray
worker) is sampled with psutil: the peak of the summed resident memory and each process's CPU time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

__all__ = ["RunResult", "demo_overrides", "loud_plugin_env", "run_main_ppo"]

PLUGIN_MODULE = "recipes.verl_ext.plugin"

_SAMPLE_EVERY_S = 0.25


@dataclass(kw_only=True, slots=True)
class RunResult:
    """What one ``main_ppo`` run did."""

    returncode: int
    wall_s: float
    """Seconds from spawning the driver to its exit: Python start, Hydra, Ray start, workers, training, shutdown."""
    first_step_s: float | None
    """Seconds from spawning the driver to the first step's metrics appearing (start-up plus one step)."""
    metrics: list[dict] = field(default_factory=list)
    """verl's metrics, one dict per training step, in step order."""
    peak_rss_bytes: int = 0
    """Peak over time of the summed RSS of the process tree (shared pages count once per process: an upper bound)."""
    peak_used_delta_bytes: int = 0
    """Peak over time of the machine's used memory minus its value at launch (other tenants add noise)."""
    cpu_s: float = 0.0
    """CPU seconds (user + system) of all processes of the tree."""
    max_processes: int = 0
    cpu_s_by_process: dict[str, float] = field(default_factory=dict)
    """CPU seconds per process name (``ray::WorkerDict``, ``raylet``, ...), summed over processes of that name."""
    log_path: Path | None = None

    def series(self, key: str) -> list[float]:
        """One metric over the steps (steps that lack it are skipped)."""
        return [float(step[key]) for step in self.metrics if key in step]

    def log_tail(self, lines: int = 60) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def demo_overrides(assets, *, algo: str = "grpo", world_size: int = 1, steps: int = 20, extra=()) -> list[str]:
    """The ``key=value`` overrides of a demo run: :data:`CPU_VERL_OVERRIDES` + the algorithm + world size + steps."""
    # importing the plugin package installs it into verl (verl and torch load) and the overrides compose the recipe:
    # lazy: seconds, paid only when a demo run is asked for
    from recipes.verl_ext.plugin import cpu_overrides

    algos = {"grpo": cpu_overrides.GRPO_DEMO, "kl_ppo": cpu_overrides.KL_PPO_DEMO}
    if algo not in algos:
        raise ValueError(f"algo={algo!r}: choose from {sorted(algos)}")
    return cpu_overrides.cli_overrides(
        assets, algos[algo], cpu_overrides.world_size(world_size), {"trainer.total_training_steps": steps}
    ) + list(extra)


def loud_plugin_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the plugin in ``VERL_USE_EXTERNAL_MODULES``: verl then imports it in every process *without*
    swallowing errors (its entry-point loader logs them at debug level), and it is loaded even where the pack's entry
    point is not installed. Importing it twice is a no-op."""
    modules = [name for name in env.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if name]
    if PLUGIN_MODULE not in modules:
        modules.append(PLUGIN_MODULE)
    return {**env, "VERL_USE_EXTERNAL_MODULES": ",".join(modules)}


def _tree(root: psutil.Process) -> list[psutil.Process]:
    try:
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def run_main_ppo(
    overrides: list[str],
    *,
    workdir: str | os.PathLike,
    env: dict[str, str] | None = None,
    timeout_s: float = 900.0,
) -> RunResult:
    """Run verl's entry point with ``overrides`` in ``workdir``; return what it did (never raises on a failed run)."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    metrics_path = workdir / "metrics.jsonl"
    log_path = workdir / "main_ppo.log"
    metrics_path.unlink(missing_ok=True)
    run_env = dict(os.environ)
    run_env.update(
        VERL_FILE_LOGGER_PATH=str(metrics_path),
        PYTHONUNBUFFERED="1",
        RAY_USAGE_STATS_ENABLED="0",  # no network here; do not try to report
        HYDRA_FULL_ERROR="1",
    )
    run_env.update(env or {})
    run_env = loud_plugin_env(run_env)
    command = [sys.executable, "-m", "verl.trainer.main_ppo", *overrides]
    baseline_used = psutil.virtual_memory().used
    seen: dict[int, psutil.Process] = {}
    cpu_by_pid: dict[int, float] = {}
    name_by_pid: dict[int, str] = {}
    peak_rss = peak_delta = max_processes = 0
    first_step_s = None
    start = time.monotonic()
    with open(log_path, "w") as log:
        log.write(" ".join(command) + "\n\n")
        log.flush()
        proc = subprocess.Popen(command, cwd=workdir, env=run_env, stdout=log, stderr=subprocess.STDOUT)
        root = psutil.Process(proc.pid)
        while proc.poll() is None:
            if time.monotonic() - start > timeout_s:
                _terminate(list(seen.values()) + _tree(root))
                break
            rss = 0
            processes = _tree(root)
            for process in processes:
                try:
                    with process.oneshot():
                        rss += process.memory_info().rss
                        times = process.cpu_times()
                    cpu_by_pid[process.pid] = times.user + times.system
                    name = _process_name(process)
                    if name != "?" or process.pid not in name_by_pid:
                        name_by_pid[process.pid] = name
                    seen.setdefault(process.pid, process)
                except psutil.Error:
                    continue
            peak_rss = max(peak_rss, rss)
            peak_delta = max(peak_delta, psutil.virtual_memory().used - baseline_used)
            max_processes = max(max_processes, len(processes))
            if first_step_s is None and metrics_path.exists() and metrics_path.stat().st_size > 0:
                first_step_s = time.monotonic() - start
            time.sleep(_SAMPLE_EVERY_S)
        returncode = proc.wait()
    wall_s = time.monotonic() - start
    _terminate([process for process in seen.values() if process.pid != proc.pid])  # stray Ray processes, if any
    by_name: dict[str, float] = {}
    for pid, cpu in cpu_by_pid.items():
        by_name[name_by_pid[pid]] = by_name.get(name_by_pid[pid], 0.0) + cpu
    metrics = []
    if metrics_path.exists():
        for line in metrics_path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                metrics.append({"step": record["step"], **record["data"]})
    return RunResult(
        returncode=returncode,
        wall_s=wall_s,
        first_step_s=first_step_s,
        metrics=sorted(metrics, key=lambda m: m["step"]),
        peak_rss_bytes=peak_rss,
        peak_used_delta_bytes=peak_delta,
        cpu_s=sum(cpu_by_pid.values()),
        max_processes=max_processes,
        cpu_s_by_process=dict(sorted(by_name.items(), key=lambda item: -item[1])),
        log_path=log_path,
    )


def _process_name(process: psutil.Process) -> str:
    """``ray::WorkerDict`` for a Ray actor, the program name otherwise (``raylet``, ``gcs_server``, ``python``)."""
    try:
        cmdline = process.cmdline()
    except psutil.Error:
        return "?"
    if cmdline and cmdline[0].startswith("ray::"):
        return cmdline[0].split()[0].split(".")[0]  # ray::Actor.method -> ray::Actor
    if len(cmdline) >= 3 and cmdline[1] == "-m":
        return f"python -m {cmdline[2]}"
    for part in cmdline[1:3]:
        if part.endswith(".py"):
            return Path(part).name
    return Path(cmdline[0]).name if cmdline else process.name()


def _terminate(processes: list[psutil.Process], grace_s: float = 5.0) -> None:
    alive = []
    for process in processes:
        try:
            if process.is_running():
                process.terminate()
                alive.append(process)
        except psutil.Error:
            continue
    _, still = psutil.wait_procs(alive, timeout=grace_s)
    for process in still:
        try:
            process.kill()
        except psutil.Error:
            continue
