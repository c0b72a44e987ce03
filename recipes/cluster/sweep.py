"""A ``-m`` sweep's jobs, checked before any starts; the end of a local sweep: one table of every job and
``sweep_results.json`` in the sweep folder.

Before Hydra creates or launches anything, the sweep's command line is split into its jobs as Hydra's basic sweeper
splits it (:func:`expand_jobs`), and each job is composed and checked as a single run is (``recipes.launch``
``check_sweep``): one problem in any job refuses the whole sweep, one line per problem naming its job
(:func:`sweep_problems`), exit 2, nothing on disk.

Hydra's basic launcher runs the jobs one after another in this process. Each job reports what became of it as its
return value (``recipes.launch.execute``: a failing job is reported and the next one runs); :class:`SweepSummary`, a
Hydra callback named in conf/_base.yaml, collects those, reads each run's final reward and KL from its
metrics.jsonl, prints the table and writes the record. The sweep exits 1 when any job did not succeed. Sweeps on a
Ray cluster (``launcher=ray``) print and write their own (hydra_plugins/klppo_launcher).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from recipes.cluster.ray_jobs import SWEEP_RECORD, distinguishing
from recipes.compose.overrides import override_key
from recipes.record.rundir import reserve
from recipes.run.monitor import final_metrics


@dataclass
class SweepJobs:
    """A sweep's command line split into its jobs, as Hydra's basic sweeper does it."""

    hydra: list[str]
    """the ``hydra.*`` overrides: every job is composed with them (Hydra's master overrides), not swept"""
    jobs: list[list[str]]
    """each job's task overrides, in Hydra's order (job ``n`` is ``jobs[n]``)"""
    swept: set[str]
    """the keys that take more than one form across the sweep (``kl=fixed,adaptive``: ``kl``)"""

    def label(self, num: int) -> str:
        """``job 2 (kl=adaptive, trainer.total_training_steps=1)``: the job's number and its swept values."""
        values = [arg for arg in self.jobs[num] if override_key(arg) in self.swept]
        return f"job {num} ({', '.join(values)})" if values else f"job {num}"


def expand_jobs(overrides: list[str], params: dict[str, str] | None = None, config_loader: Any = None) -> SweepJobs:
    """The jobs of ``-m <overrides>`` (with ``hydra.sweeper.params``, which Hydra's sweeper puts first), split by
    Hydra's own parser and basic sweeper: ``a=1,2 b=x`` is ``[[a=1, b=x], [a=2, b=x]]``. Hydra's
    OverrideParseException for an override it cannot read."""
    parser = OverridesParser.create(config_loader=config_loader)
    parsed = parser.parse_overrides(list(overrides))
    hydra = [o.input_line for o in parsed if o.is_hydra_override()]
    task = parser.parse_overrides([f"{k}={v}" for k, v in (params or {}).items()])
    task += [o for o in parsed if not o.is_hydra_override()]
    swept = {override_key(o.input_line) for o in task if o.is_sweep_override()}
    (jobs,) = BasicSweeper.split_arguments(task, None)
    return SweepJobs(hydra=hydra, jobs=[list(job) for job in jobs], swept=swept)


def sweep_problems(labels: list[str], problems: list[list[str]]) -> list[str]:
    """One line per problem, prefixed by the label of the job that has it; a problem every job of a sweep of more
    than one has is one line, ``every job: ...``."""
    shared = [p for p in problems[0] if all(p in job for job in problems[1:])] if len(problems) > 1 else []
    lines = [f"every job: {p}" for p in dict.fromkeys(shared)]
    for label, job in zip(labels, problems, strict=True):
        lines += [f"{label}: {p}" for p in dict.fromkeys(job) if p not in shared]
    return lines


@dataclass
class JobOutcome:
    """What one job of a local sweep became."""

    num: int
    overrides: list[str]
    run_dir: str
    status: str
    """ok | invalid (a config error) | failed"""
    exit_code: int
    reward: float | None = None
    """the last step's mean reward (metrics.jsonl), None when the job trained no step"""
    kl: float | None = None
    """the last step's KL to the reference (the KL band's metric)"""
    message: str | None = None


def job_result(status: str, exit_code: int, message: str | None = None) -> dict:
    """The return value of one job (``recipes.launch.execute``), read back by :class:`SweepSummary`."""
    return {"status": status, "exit_code": exit_code, "message": message}


def outcome(num: int, overrides: list[str], run_dir: str, job_return: JobReturn) -> JobOutcome:
    """A job's outcome from its Hydra JobReturn (its return value when it returned one, else its status)."""
    value: Any = job_return._return_value if job_return.status == JobStatus.COMPLETED else None
    if isinstance(value, dict) and "status" in value:
        result = dict(value)
    elif job_return.status == JobStatus.COMPLETED:
        result = job_result("ok", 0)
    else:
        result = job_result("failed", 1, f"{type(job_return._return_value).__name__}: {job_return._return_value}")
    reward, kl = final_metrics(Path(run_dir))
    return JobOutcome(num=num, overrides=overrides, run_dir=run_dir, reward=reward, kl=kl, **result)


def table(outcomes: list[JobOutcome]) -> str:
    """One line per job: status, exit code, final reward and KL, run folder, and the overrides that set it apart."""
    shown = distinguishing([o.overrides for o in outcomes]) if len(outcomes) > 1 else [o.overrides for o in outcomes]
    lines = [f"{'#':>3}  {'status':<8} {'exit':>4} {'reward':>8} {'kl':>8}  run folder  (overrides)"]
    for o, label in zip(outcomes, shown, strict=True):
        reward = "" if o.reward is None else f"{o.reward:+.3f}"
        kl = "" if o.kl is None else f"{o.kl:.4f}"
        lines.append(f"{o.num:>3}  {o.status:<8} {o.exit_code:>4} {reward:>8} {kl:>8}  {o.run_dir}  "
                     f"({' '.join(label)})")
        if o.message and o.status != "ok":
            lines.append(f"{'':>5}{o.message.splitlines()[0][:200]}")
    return "\n".join(lines)


def write_record(sweep_dir: Path, outcomes: list[JobOutcome]) -> Path:
    path = Path(sweep_dir) / SWEEP_RECORD
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"jobs": [asdict(o) for o in outcomes]}, indent=2) + "\n")
    return path


class SweepSummary(Callback):
    """Hydra callback: gives the sweep a folder of its own; collects each job's outcome; at the end of a local sweep
    prints the table, writes ``sweep_results.json`` and exits 1 if a job did not succeed."""

    def __init__(self) -> None:
        self.outcomes: list[JobOutcome] = []

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Reserve the sweep folder (``multirun-<time>``, a -N suffix when another sweep took it in the same
        second; recipes.record.rundir) unless ``hydra.sweep.dir`` was typed; every job's config is composed again from
        the master's Hydra overrides, so the reserved folder goes there too."""
        hydra_overrides = [str(o) for o in config.hydra.overrides.hydra]
        if any(o.lstrip("+").startswith("hydra.sweep.dir=") for o in hydra_overrides):
            return
        folder = str(reserve(Path(str(config.hydra.sweep.dir)).absolute()).path)
        with read_write(config.hydra), open_dict(config.hydra):
            config.hydra.sweep.dir = folder
            config.hydra.overrides.hydra.append(f"hydra.sweep.dir={folder}")

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if not _local_sweep(config):
            return
        run_dir = str(OmegaConf.select(config, "hydra.runtime.output_dir"))
        num = int(OmegaConf.select(config, "hydra.job.num", default=len(self.outcomes)))
        self.outcomes.append(outcome(num, list(job_return.overrides or []), run_dir, job_return))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if not _local_sweep(config) or not self.outcomes:
            return
        path = write_record(Path(self.outcomes[0].run_dir).parent, self.outcomes)  # the sweep folder
        print(f"sweep: {sum(o.status == 'ok' for o in self.outcomes)} of {len(self.outcomes)} jobs ok "
              f"({path})\n{table(self.outcomes)}", flush=True)
        if any(o.status != "ok" for o in self.outcomes):
            sys.exit(1)


def _local_sweep(config: DictConfig) -> bool:
    target = str(OmegaConf.select(config, "hydra.launcher._target_", default=""))
    return target.endswith("BasicLauncher")
