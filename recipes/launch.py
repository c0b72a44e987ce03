"""The launch flow of ``python -m recipes.<name>``, each step once:

    compose (Hydra, once) -> validate (a pure check: ValidatedRun) -> finalize (FinalRun: the config verl gets)
    -> record (resolved_config.yaml, repro/, nccl_env.json) -> the action: validate | plan | train

and the modules each step calls:

    compose   run_recipe: recipes.cli.help (--help); the command line split once (recipes.compose.overrides
              CommandLine), read by recipes.compose.compose (adopt_* / refuse_*: a pasted verl script's keys) and
              recipes.compose.defaults (the embedded CPU default); recipes.compose.resolvers; run_single composes
              with Hydra (recipes.compose.confdir: conf/)
    validate  checked_run: recipes.check.validate (schema, memory fit, lookups, verl's validator),
              recipes.check.needs (what this machine needs for action=train), recipes.cluster.ray_jobs.preflight;
              before it the run folder is reserved (recipes.record.rundir; run.resume=: recipes.run.resume)
    finalize  perform: recipes.run.finalize (loggers, every worker's env from recipes.cluster.nccl_env)
    record    perform: recipes.record.bundle (resolved_config.yaml, repro/, nccl_env.json)
    action    validate: a line; plan: recipes.check.plan; train: recipes.run.train, or with launcher=ray
              recipes.cluster.ray_jobs (a Ray Job running this same flow); a -m sweep: check_sweep with
              recipes.cluster.sweep, then each job through :func:`execute`

A single run composes with Hydra's own machinery, is validated before anything exists on disk (a bad input leaves
no run folder), then runs as a Hydra job (``run_job``: run folder, ``.hydra/``, logging) exactly as ``@hydra.main``
would run it. A command line with Hydra flags (``-m``, ``--cfg job``, ``--help``, ``-sc ...``) goes to
``@hydra.main`` unchanged; each of its jobs goes through the same steps in :func:`execute`. A ``-m`` sweep is checked
first (:func:`check_sweep`): every job composed and checked as a single run is, before Hydra creates anything; a
problem in any job refuses the whole sweep (exit 2, one line per problem naming its job).
"""

from __future__ import annotations

import io
import os
import sys
from contextlib import redirect_stderr
from dataclasses import replace
from pathlib import Path

import hydra
from hydra import initialize_config_dir
from hydra._internal.callbacks import Callbacks
from hydra._internal.utils import get_args_parser, run_and_report
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import run_job
from hydra.errors import HydraException
from hydra.types import HydraContext, RunMode
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from recipes.check.needs import column_problems, engine_notes, machine_notes, train_problems
from recipes.check.validate import ValidatedRun, check, validate
from recipes.cli.help import SCRIPTS, help_topic, print_help
from recipes.cluster.ray_jobs import preflight, submit_from_hydra
from recipes.cluster.sweep import expand_jobs, job_result, sweep_problems
from recipes.compose import hydra_cache
from recipes.compose.compose import (
    adopt_batching,
    adopt_engine_switch,
    adopt_verl_primary,
    explain_hydra_error,
    refuse_mixed_engines,
    refuse_shared_parts,
)
from recipes.compose.confdir import conf_dir, entry_command, group_options, recipe_defaults
from recipes.compose.defaults import (
    EMBEDDED_DEFAULTS,
    chooses_layout,
    embedded_defaults,
    gpu_found,
    gpu_only_rollout,
    gpu_only_strategy,
    has_accelerator,
    host_memory_found,
    machine_cluster,
    machine_host_memory,
)
from recipes.compose.overrides import CommandLine, with_overrides
from recipes.compose.resolvers import register_resolvers
from recipes.envvars import RAY_JOB, getenv
from recipes.errors import ConfigError, exit_with, report
from recipes.record.bundle import write_record
from recipes.record.rundir import Reservation, claim, lock, refuse_location, release, reserve, unlock
from recipes.run import gc_threshold
from recipes.run.finalize import finalize
from recipes.run.interrupt import Interrupted, exits_on_ctrl_c
from recipes.run.resume import plan_resume
from recipes.verl_ext.verl_tree import changed_defaults_lines, fallback_lines, is_verl_script

ACTIONS = ("validate", "plan", "train")
BEFORE_RUN = "interrupted before the run started: nothing was written and nothing is left running"


def interrupted_line() -> str:
    """The line of a Ctrl-C that no step of the launch put into words: before any run (a Hydra job) was set up,
    nothing was written."""
    return BEFORE_RUN if not HydraConfig.initialized() else "interrupted"


@exits_on_ctrl_c(interrupted_line)
def run_recipe(recipe: str, argv: list[str] | None = None) -> None:
    """Entry point of ``python -m recipes.<recipe>``."""
    # the imports ahead (torch, verl) under the pack's default; the run's run.gc_threshold is set before verl's
    # trainer starts (recipes/verl_ext/api.py); registered first, the freeze runs after every other atexit handler
    gc_threshold.apply(gc_threshold.DEFAULT)
    gc_threshold.freeze_at_exit()
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = invoked_as(recipe)
    if help_topic(argv)[0]:  # before torch (has_accelerator) and Hydra: help answers at once
        sys.exit(print_help(recipe, prog, argv, EMBEDDED_DEFAULTS))
    register_resolvers()
    hydra_argv0 = prog if prog in SCRIPTS.values() else f"recipes.{recipe}"  # shell completion is installed for it
    if "--hydra-help" in argv or any(arg == "-sc" or arg.startswith("--shell-completion") for arg in argv):
        # Hydra's own answers, no GPU probe (torch) and no notice: completion reads COMP_LINE (nothing in the user's
        # prompt at each <tab>); Hydra's help composes without the recipe, where any group override is an error
        sys.argv = [hydra_argv0] + (["--hydra-help"] if "--hydra-help" in argv else argv)
        hydra.main(config_path=str(conf_dir()), config_name=recipe, version_base=None)(execute)()
        return
    try:  # the command line, split once (CommandLine); each rule reads it
        command, notices = adopt_verl_primary(CommandLine.parse(argv))
        command, engine_notes = adopt_engine_switch(command, recipe)
        refuse_mixed_engines(command, recipe)
        command, batching_notes = adopt_batching(command)
    except ConfigError as error:
        exit_with(error)
    notices += engine_notes + batching_notes
    accelerator = has_accelerator()
    # the recipe's own strategy matters only without a GPU (a copy made with strategy=megatron plans for GPUs)
    recipe_strategy = None if accelerator else recipe_defaults(recipe).get("strategy")
    embedded = embedded_defaults(command, accelerator, recipe_strategy)
    added = list(embedded)  # and, on a GPU machine, its card's preset and its memory
    if accelerator:
        try:
            machine_added, machine_notes = machine_cluster(command, gpu_found())
        except ConfigError as error:
            exit_with(error)
        host_added, host_notes = machine_host_memory(command, host_memory_found())
        added += machine_added + host_added
        notices += machine_notes + host_notes
    gpu_only = gpu_only_strategy(command, recipe_strategy)
    if embedded:
        notices.append(f"no GPU found: embedded CPU defaults {' '.join(embedded)} "
                       "(choose parallel=/cluster= to plan for GPUs)")
    elif not accelerator and not chooses_layout(command) and gpu_only:
        notices.append(f"no GPU found: strategy={gpu_only} plans for the recipe's GPU cluster (verl's Megatron "
                       "engine needs GPUs; strategy=fsdp2 runs the embedded CPU default)")
    elif not accelerator and not chooses_layout(command) and gpu_only_rollout(command):
        notices.append(f"no GPU found: rollout={gpu_only_rollout(command)} plans for the recipe's GPU cluster (it "
                       "generates on GPUs; rollout=hf runs the embedded CPU default)")
    if command.has_hydra_flags:
        hydra_argv = with_overrides(command, added)
        try:
            check_sweep(recipe, hydra_argv)
        except ConfigError as error:
            exit_with(error)
        for line in notices:
            print(line, file=sys.stderr)
        sys.argv = [hydra_argv0] + hydra_argv
        hydra.main(config_path=str(conf_dir()), config_name=recipe, version_base=None)(execute)()
        return
    try:
        run_single(recipe, command.plus(added), notices)
    except ConfigError as error:
        exit_with(error)


def invoked_as(recipe: str) -> str:
    """How the user started this recipe: a console script (``klppo-grpo``) by its name, else its entry command."""
    name = os.path.basename(sys.argv[0]) if sys.argv else ""
    return name if name in SCRIPTS.values() else " ".join(entry_command(recipe))


def main_grpo() -> None:
    """Console script ``klppo-grpo``: ``python -m recipes.grpo``."""
    run_recipe("grpo")


def main_kl_ppo() -> None:
    """Console script ``klppo-kl-ppo``: ``python -m recipes.kl_ppo``."""
    run_recipe("kl_ppo")


def run_single(recipe: str, argv: list[str] | CommandLine, notices: list[str] | None = None) -> None:
    """One run, as Hydra's ``run`` does it, with validation between composing and the job: compose, pin the run
    folder, check (ConfigError: nothing was created), then run the job. ``notices`` are shown once the config is
    valid (a bad input gets its error line only)."""
    command = CommandLine.parse(argv)
    refuse_shared_parts(command)
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None, job_name=recipe):
        app = GlobalHydra.instance().hydra
        try:
            cfg = app.compose_config(recipe, list(command.args), run_mode=RunMode.RUN, with_log_configuration=True)
        except HydraException as error:
            failed = error
        else:
            failed = None
            run_composed(app, recipe, cfg, notices or [])
    if failed is not None:  # explained outside Hydra's context: the explanation composes again to suggest a key
        raise ConfigError(explain_hydra_error(failed, command, recipe))


def run_composed(app, recipe: str, cfg: DictConfig, notices: list[str]) -> None:
    """Validate the composed config, then run it as a Hydra job (run folder, .hydra/, logging), as Hydra's ``run``."""
    with read_write(cfg.hydra):
        cfg.hydra.mode = RunMode.RUN
    reservation = None
    try:
        reservation = pin_run_dir(cfg)
        run = checked_run(task_config(cfg))
        resumed = OmegaConf.select(cfg, "run.resume")
        held = lock(cfg.hydra.run.dir, f"run.resume={resumed}" if resumed else f"hydra.run.dir={cfg.hydra.run.dir}")
    except BaseException as error:
        if reservation is not None:
            release(reservation)  # a refused (or interrupted) run leaves no folder behind
        if isinstance(error, KeyboardInterrupt):
            raise Interrupted(BEFORE_RUN) from None
        raise
    for line in notices:
        print(line, file=sys.stderr)
    callbacks = Callbacks(cfg)
    callbacks.on_run_start(config=cfg, config_name=recipe)

    def job() -> None:
        ret = run_job(hydra_context=HydraContext(config_loader=app.config_loader, callbacks=callbacks),
                      task_function=lambda _cfg: perform(run), config=cfg, job_dir_key="hydra.run.dir",
                      job_subdir_key=None, configure_logging=True)
        callbacks.on_run_end(config=cfg, config_name=recipe, job_return=ret)
        _ = ret.return_value  # re-raises what the job raised

    try:
        run_and_report(job)
    except KeyboardInterrupt as stop:  # training says what it kept (recipes/run/train.py); before it, the folder stays
        if isinstance(stop, Interrupted):
            raise
        raise Interrupted(f"interrupted (action={OmegaConf.select(cfg, 'action')}); the run folder stays: "
                          f"{cfg.hydra.run.dir}") from None
    finally:
        unlock(held)


def pin_run_dir(cfg: DictConfig) -> Reservation:
    """Fix this run's folder now (``hydra.run.dir`` holds ``${now:...}``), so ``run.dir`` resolves to it during
    validation and the job writes exactly there. The recipe's own folder name is reserved (created exclusively, a
    suffix when another run took it in the same second). A ``hydra.run.dir=`` typed on the command line must be new
    or empty (recipes.record.rundir.claim: an earlier run's record is not overwritten; a file or a place that cannot
    hold a folder is refused), except in the Ray Job the pack submitted (the launcher points each job at the folder it
    reserved and recorded). A folder outside run.root, a name too long or an unwritable run.root is a ConfigError
    before anything is created; ``run.resume=`` continues that folder."""
    if OmegaConf.select(cfg, "run.resume"):
        return pin_resumed(cfg)
    run_dir = os.path.abspath(str(OmegaConf.select(cfg, "hydra.run.dir")))
    typed = any(str(o).lstrip("+").startswith("hydra.run.dir=") for o in cfg.hydra.overrides.hydra)
    if typed:
        reservation = claim(run_dir, f"hydra.run.dir={OmegaConf.select(cfg, 'hydra.run.dir')}",
                            reuse=getenv(RAY_JOB) == "1")
    else:
        root = str(OmegaConf.select(cfg, "run.root"))
        refuse_location(root, run_dir, str(OmegaConf.select(cfg, "run.name")))
        try:
            reservation = reserve(run_dir)
        except OSError as error:
            raise ConfigError(f"run.root={root}: cannot create the run folder {run_dir}: {error.strerror}") from None
        run_dir = str(reservation.path)
    set_run_dir(cfg, run_dir)
    return reservation


def pin_resumed(cfg: DictConfig) -> Reservation:
    """``run.resume=<folder>``: the run folder is that one, verl resumes from its last complete checkpoint
    (recipes.run.resume), and this launch's record folder (``resume_<n>/``) is reserved."""
    typed_path = any(str(o).lstrip("+").startswith("trainer.resume_from_path=") for o in cfg.hydra.overrides.task)
    resume = plan_resume(str(OmegaConf.select(cfg, "run.resume")),
                         stability_auto=OmegaConf.select(cfg, "stability.mode") == "auto",
                         chosen=str(OmegaConf.select(cfg, "trainer.resume_from_path")) if typed_path else None)
    for line in resume.notices:
        print(line, file=sys.stderr)
    with read_write(cfg), open_dict(cfg):
        OmegaConf.update(cfg, "run.record_dir", str(resume.record_dir))
        OmegaConf.update(cfg, "trainer.resume_mode", "resume_path")
        OmegaConf.update(cfg, "trainer.resume_from_path", str(resume.checkpoint))
    set_run_dir(cfg, str(resume.folder))
    return Reservation(resume.record_dir, (resume.record_dir,))


def set_run_dir(cfg: DictConfig, run_dir: str) -> None:
    with read_write(cfg.hydra), open_dict(cfg.hydra):
        cfg.hydra.run.dir = run_dir
        cfg.hydra.runtime.output_dir = run_dir
    HydraConfig.instance().set_config(cfg)


def check_sweep(recipe: str, argv: list[str]) -> None:
    """A ``-m`` sweep, before Hydra reserves its folder or starts a job: each job, as Hydra's sweeper splits the
    command line (recipes.cluster.sweep.expand_jobs), composed and checked as a single run is (:func:`checked_run`). Any
    problem refuses the whole sweep: ConfigError with one line per problem, each naming its job by its swept values
    (a problem of every job once). Hydra's other flags (``--cfg``, ``--info``, a config folder of its own, another
    sweeper) are left to Hydra."""
    args = hydra_args(argv)
    if args is None or not args.multirun or any((args.cfg, args.info, args.help, args.hydra_help, args.shell_completion,
                                                 args.config_path, args.config_dir, args.experimental_rerun)):
        return
    config_name = args.config_name or recipe
    results: list[list[str] | HydraException] = []
    hydra_config = HydraConfig.instance().cfg  # each job's check sets it; Hydra's run starts from what it was
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=None, job_name=recipe):
            app = GlobalHydra.instance().hydra
            try:  # the master config, as Hydra's multirun composes it: the sweeper it names, and that one's params
                master = app.compose_config(config_name, args.overrides, run_mode=RunMode.MULTIRUN,
                                            with_log_configuration=False)
            except HydraException:
                params: dict = {}  # a problem every job has: each job's own composition below names it
            else:
                if not str(OmegaConf.select(master, "hydra.sweeper._target_", default="")).endswith("BasicSweeper"):
                    return  # another sweeper (a Hydra plugin) makes its jobs as it goes
                typed = OmegaConf.select(master, "hydra.sweeper.params")
                params = OmegaConf.to_container(typed, resolve=False) if isinstance(typed, DictConfig) else {}
            hydra_cache.install()  # each job is composed again, here and by Hydra: the files parsed once
            try:
                sweep = expand_jobs(args.overrides, params, app.config_loader)
            except HydraException as error:
                failed: HydraException | None = error
            else:
                failed = None
                for num, job in enumerate(sweep.jobs):
                    results.append(job_problems(app, config_name, num, [*sweep.hydra, "hydra.mode=MULTIRUN", *job]))
    finally:
        HydraConfig.instance().cfg = hydra_config
    # explained outside Hydra's context: the explanation composes again to suggest a key
    if failed is not None:
        raise ConfigError(explain_hydra_error(failed, args.overrides, recipe))
    problems = [explain_job(result, [*sweep.hydra, *job], recipe)
                for result, job in zip(results, sweep.jobs, strict=True)]
    if any(problems):
        raise ConfigError(sweep_problems([sweep.label(num) for num in range(len(sweep.jobs))], problems))


def hydra_args(argv: list[str]):
    """Hydra's reading of a command line (its own argument parser); None where Hydra would refuse it (Hydra says
    why when it runs)."""
    with redirect_stderr(io.StringIO()):
        try:
            return get_args_parser().parse_args(argv)
        except SystemExit:
            return None


def job_problems(app, config_name: str, num: int, overrides: list[str]) -> list[str] | HydraException:
    """One job of a sweep composed as Hydra composes it (``hydra.job.num`` set) and checked as a single run is:
    its problems (none: []), or Hydra's composition error (explained by :func:`explain_job`)."""
    try:
        refuse_shared_parts(overrides)
        cfg = app.compose_config(config_name, overrides, run_mode=RunMode.RUN, with_log_configuration=False)
    except HydraException as error:
        return error
    except ConfigError as error:
        return error.problems
    with read_write(cfg.hydra), open_dict(cfg.hydra):
        cfg.hydra.job.id = num
        cfg.hydra.job.num = num
    HydraConfig.instance().set_config(cfg)  # the checks read the job's typed overrides, as in the job itself
    try:
        checked_run(task_config(cfg))
    except ConfigError as error:
        return error.problems
    return []


def explain_job(result: list[str] | HydraException, overrides: list[str], recipe: str) -> list[str]:
    """A job's problems, Hydra's composition error as the single run explains it (one line, did-you-mean)."""
    return [explain_hydra_error(result, overrides, recipe)] if isinstance(result, HydraException) else result


def task_config(cfg: DictConfig) -> DictConfig:
    """The run's config without Hydra's own node, as a Hydra job's task function receives it."""
    return OmegaConf.masked_copy(cfg, [key for key in cfg.keys() if key != "hydra"])


def execute(cfg: DictConfig) -> dict | None:
    """One job under ``@hydra.main``: validate, then perform. Config problems exit 2. In a ``-m`` sweep a failing
    job is reported and the next one runs: the job's outcome is its return value (recipes.cluster.sweep sums them
    up)."""
    if not (HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN):
        try:
            perform(checked_run(cfg))
        except ConfigError as error:
            exit_with(error)
        return None
    try:
        perform(checked_run(cfg))
    except ConfigError as error:
        report(error)
        return job_result("invalid", 2, "; ".join(error.problems))
    except SystemExit as stop:  # action=plan's exit code, or a failed Ray Job submission
        code = stop.code if isinstance(stop.code, int) else 1
        return job_result("ok" if code == 0 else "failed", code)
    except Exception as error:  # noqa: BLE001 - recorded; the sweep goes on and exits 1 at its end
        print(f"job failed: {type(error).__name__}: {error}", file=sys.stderr)
        return job_result("failed", 1, f"{type(error).__name__}: {error}")
    return job_result("ok", 0)


def checked_run(cfg: DictConfig) -> ValidatedRun:
    """Validate for the chosen action; ConfigError with every problem. A plan is made even for a layout that does
    not fit the model (it shows why, and exits 2); every other action needs a valid config."""
    action = check_action(cfg)
    if OmegaConf.select(cfg, "run.resume") and not OmegaConf.select(cfg, "run.record_dir"):
        # only a single run pins its folder to the resumed one (pin_run_dir); a -m job would silently start afresh
        raise ConfigError(f"run.resume={OmegaConf.select(cfg, 'run.resume')}: not in a -m sweep or with Hydra's "
                          "flags; resume each run with its own command")
    if action == "plan":
        run = check(cfg)
        solving = OmegaConf.select(cfg, "plan.solve", default=False) is True  # the search replaces the layout
        if run.arch is None or (not solving and (run.train is None or run.infer is None)):
            raise ConfigError(list(run.problems))
    else:
        run = validate(cfg)
    preflight(run.cfg)  # launcher=ray action=train: the cluster answers
    return machine_needs(run, action)


def machine_needs(run: ValidatedRun, action: str) -> ValidatedRun:
    """``action=train`` here (launcher=local) stops on an engine package that is not importable or a GPU layout
    this machine cannot hold, a missing data file or a checkpoint folder it cannot write (recipes/check/needs.py);
    validate and plan note them (a run can be checked here for a cluster)."""
    columns = column_problems(run.cfg)  # a file that is here and lacks a column is wrong everywhere
    if columns:
        raise ConfigError(columns)
    if OmegaConf.select(run.cfg, "launcher.name") == "ray":
        return run  # the cluster runs this same flow with launcher=local, and checks there
    if action == "train":
        problems = train_problems(run.cfg)
        if problems:
            raise ConfigError(problems)
        lines = engine_notes(run.cfg)
    else:
        lines = engine_notes(run.cfg) + machine_notes(run.cfg)
    notes = tuple(f"note: {line}" for line in lines)
    return replace(run, warnings=run.warnings + notes) if notes else run


def perform(run: ValidatedRun) -> None:
    """Inside the Hydra job: finalize, write the record once, then the action."""
    action = check_action(run.cfg)
    run_dir = Path(str(run.cfg.run.dir))
    final = finalize(run, run_dir)
    for warning in run.warnings:
        print(warning if warning.startswith("note:") else f"warning: {warning}", file=sys.stderr)
    for note in final.notes:
        print(note, file=sys.stderr)
    typed = hydra_overrides() or []
    if is_verl_script(typed):  # a pasted verl script: what its unset keys get here that verl would not give them
        for line in changed_defaults_lines(final.cfg, typed, () if run.use_critic else ("critic",)):
            print(line, file=sys.stderr)
        for line in fallback_lines(final.cfg):
            print(line, file=sys.stderr)
    run_dir.mkdir(parents=True, exist_ok=True)
    record_dir = Path(str(run.cfg.run.record_dir)) if run.cfg.run.get("record_dir") else run_dir
    for line in write_record(record_dir, final.cfg, final.workers, recipe_name(), hydra_overrides()):
        print(line, file=sys.stderr)
    if action == "plan":
        from recipes.check.plan import run_plan  # lazy: matplotlib and the planner load only for a plan

        code = run_plan(run)
        if code:
            sys.exit(code)
        return
    if action == "validate":
        print(f"config OK: {describe(run)}")
        print(f"resolved verl config written to {record_dir / 'resolved_config.yaml'}")
        return
    if OmegaConf.select(final.cfg, "launcher.name") == "ray":
        # a Ray Job on an existing cluster runs this same flow there (launcher=local); its exit code is ours
        code = submit_from_hydra(final.cfg, run_dir)
        if code:
            sys.exit(code)
        return
    from recipes.run.train import run_training  # lazy: imports verl's trainer and the pack's plugin

    run_training(final)


def recipe_name() -> str | None:
    return HydraConfig.get().job.config_name if HydraConfig.initialized() else None


def hydra_overrides() -> list[str] | None:
    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else None


def check_action(cfg: DictConfig) -> str:
    action = OmegaConf.select(cfg, "action")
    if action not in ACTIONS:
        raise ConfigError(f"action: unknown action {action!r}; choose from {', '.join(ACTIONS)}")
    return action


def describe(run: ValidatedRun) -> str:
    """The ``config OK:`` line: both layouts, the cluster, and the model checked with where its numbers came from."""
    t, i = run.train, run.infer
    cfg = run.cfg
    if run.arch is not None:
        model = f"model {run.arch.name}" + (f" ({run.arch.source})" if run.arch.source else "")
    else:
        model = f"model not checked ({OmegaConf.select(cfg, 'actor_rollout_ref.model.path')}: no config.json here)"
    return (
        f"{cfg.strategy.name} train dp{t.dp} tp{t.tp} pp{t.pp} cp{t.cp} ep{t.ep} -> {cfg.rollout.name} "
        f"infer tp{i.tp} pp{i.pp} x{i.dp} replicas on {cfg.cluster.nnodes}x{cfg.cluster.gpus_per_node} "
        f"{gpu_phrase(str(cfg.cluster.gpu.name), hydra_overrides() or [])}, {model}"
    )


def gpu_phrase(gpu: str, typed: list[str]) -> str:
    """The GPU type of the ``config OK`` line; where the command line did not choose it (``cluster=``), that it was
    assumed and how to choose another (the memory checks and the plan read its numbers)."""
    chosen = any(arg.lstrip("+~").startswith(("cluster=", "cluster.gpu")) for arg in typed)
    if chosen or gpu == "cpu":
        return gpu
    others = "|".join(option for option in group_options("cluster") if option not in (gpu, "cpu"))
    return f"{gpu} (assumed; cluster={others} for another)"
