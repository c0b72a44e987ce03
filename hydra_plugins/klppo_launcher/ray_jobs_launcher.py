"""The ``klppo_ray`` Hydra launcher: submit each job of a sweep as a Ray Job, as many at once as the cluster allows.

    python -m recipes.grpo -m launcher=ray launcher.address=http://HEAD:8265 kl=fixed,adaptive action=train

``python -m recipes.<recipe> -m`` has checked every job before Hydra started (``recipes.launch.check_sweep``): a
sweep with an invalid job exits 2 before this launcher is reached, nothing submitted. Each job is composed here again
(and validated unless ``hydra.launcher.validate_first=false``): a job that fails here all the same (the sweep started
some other way) is reported and not submitted, the others run. Each job runs
``python -m recipes.<recipe> <its overrides> launcher=local hydra.run.dir=<sweep dir>/<n>`` on the cluster. Every
job's status, exit code and run folder are printed at the end and written to ``<sweep dir>/sweep_results.json``; the
sweep exits 1 when any job failed, after all of them ran. Kept light: Hydra imports this module while scanning for
plugins.
"""

import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

log = logging.getLogger(__name__)


@dataclass
class RayJobsLauncherConf:
    _target_: str = "hydra_plugins.klppo_launcher.ray_jobs_launcher.RayJobsLauncher"
    # the cluster's dashboard address; null: the recipe's launcher.address
    address: str | None = None
    # at most this many jobs at once; null: as many as the cluster's free GPUs (CPUs for CPU jobs) allow
    max_concurrent: int | None = None
    # compose and validate each job here before submitting it (a bad job is reported, the others run); the recipes'
    # own command line has refused a sweep with a bad job before the launcher starts (recipes.launch.check_sweep)
    validate_first: bool = True
    # resources one job holds, e.g. {GPU: 8, CPU: 32}; null: derived from each job
    # (see recipes.cluster.ray_jobs.job_demand)
    resources_per_job: Any | None = None
    # seconds between status polls
    poll_s: float = 2.0
    # seconds a job may run before it is stopped; null: the recipe's launcher.timeout_s
    timeout_s: float | None = None


ConfigStore.instance().store(group="hydra/launcher", name="klppo_ray", node=RayJobsLauncherConf,
                             provider="klppo-recipes")


class RayJobsLauncher(Launcher):
    def __init__(self, address: str | None = None, max_concurrent: int | None = None,
                 validate_first: bool = True, resources_per_job: Any = None, poll_s: float = 2.0,
                 timeout_s: float | None = None) -> None:
        self.address = address
        self.max_concurrent = max_concurrent
        self.validate_first = validate_first
        self.resources_per_job = resources_per_job
        self.poll_s = poll_s
        self.timeout_s = timeout_s
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from recipes.cluster import ray_jobs
        from recipes.errors import ConfigError, exit_with

        setup_globals()
        assert self.config is not None and self.hydra_context is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        recipe = str(self.config.hydra.job.config_name)
        address = self.address or OmegaConf.select(self.config, "launcher.address", default=None)
        try:
            client = ray_jobs.connect(address)
            total, free = ray_jobs.cluster_resources(client)
        except ConfigError as error:
            exit_with(error)  # one line, exit 2: nothing was submitted
        log.info(f"Launching {len(job_overrides)} jobs as Ray Jobs on {ray_jobs.dashboard_url(address)} "
                 f"(free: {ray_jobs._short({k: v for k, v in free.items() if k in ('CPU', 'GPU')})})")
        specs, configs = [], {}
        shown = ray_jobs.distinguishing([list(o) for o in job_overrides])
        for idx, overrides in enumerate(job_overrides):
            num = initial_job_idx + idx
            log.info(f"\t#{num} : {' '.join(filter_overrides(shown[idx])) or '(no overrides)'}")
            spec, job_cfg = self._prepare(num, list(overrides), sweep_dir, recipe)
            spec.shown = shown[idx]
            specs.append(spec)
            configs[num] = job_cfg
        timeout = self.timeout_s or OmegaConf.select(self.config, "launcher.timeout_s", default=None)
        results = ray_jobs.run_sweep(client, specs, total=total, free=free, max_concurrent=self.max_concurrent,
                                     poll_s=self.poll_s, timeout_s=timeout, recipe=recipe, echo=log.info)
        record = ray_jobs.write_sweep_record(sweep_dir, results, ray_jobs.dashboard_url(address))
        failed = sum(not r.ok for r in results)
        log.info(f"{len(results) - failed} of {len(results)} jobs succeeded; results in {record}\n"
                 + ray_jobs.summary_table(results))
        if failed:
            # every job has run; Hydra's sweeper would stop here too, with a traceback of its own frames
            print(f"sweep: {failed} of {len(results)} jobs did not succeed (see {record})", file=sys.stderr)
            sys.exit(1)
        returns = []
        for result in results:
            ret = JobReturn(overrides=result.overrides, cfg=configs.get(result.num), working_dir=result.run_dir,
                            task_name=recipe)
            ret.status = JobStatus.COMPLETED
            ret.return_value = result
            returns.append(ret)
        return returns

    def _prepare(self, num: int, overrides: list[str], sweep_dir: Path, recipe: str):
        """Compose (and validate) one job here; its JobSpec (with `error` set when it cannot run)."""
        from recipes.cluster import ray_jobs
        from recipes.compose.compose import explain_hydra_error
        from recipes.errors import ConfigError

        spec = ray_jobs.JobSpec(num=num, overrides=overrides, run_dir=sweep_dir / str(num))
        try:
            job_cfg = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
            with open_dict(job_cfg):
                job_cfg.hydra.job.id = num
                job_cfg.hydra.job.num = num
            spec.run_dir = sweep_dir / str(job_cfg.hydra.sweep.subdir)
        except Exception as error:  # noqa: BLE001 - Hydra's composition errors, one line each
            spec.error = f"config error: {explain_hydra_error(error, overrides, recipe)}"
            return spec, None
        run_cfg = OmegaConf.masked_copy(job_cfg, [k for k in job_cfg.keys() if k != "hydra"])
        try:
            if self.validate_first and OmegaConf.select(run_cfg, "action") != "plan":
                from recipes.check.validate import validate

                validate(run_cfg)
            choice = OmegaConf.select(job_cfg, "hydra.runtime.choices.cluster", default=None)
            launch_dir = Path.cwd()
            args = ray_jobs.job_overrides(overrides, spec.run_dir, choice)
            spec.entrypoint = ray_jobs.entrypoint(recipe, args, run_cfg.launcher, launch_dir)
            spec.runtime_env = ray_jobs.job_runtime_env(run_cfg, launch_dir)
            per_job = self.resources_per_job
            if per_job is not None and not isinstance(per_job, dict):
                per_job = OmegaConf.to_container(per_job, resolve=True)
            spec.demand = ray_jobs.job_demand(run_cfg, per_job)
        except ConfigError as error:
            spec.error = "config error: " + "; ".join(error.problems)
        except Exception as error:  # noqa: BLE001 - anything else about this job: report it, run the others
            spec.error = f"{type(error).__name__}: {' '.join(str(error).split())[:300]}"
        return spec, job_cfg
