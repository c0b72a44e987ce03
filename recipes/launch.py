"""The launch flow shared by the recipes: compose -> validate -> (plan) -> train with verl's own trainer.

`python -m recipes.<name> [overrides]` calls `run_recipe(name)`: on a machine without GPUs and without a layout
choice it adds the embedded CPU defaults, composes once to turn Hydra's errors into one line each, then hands over
to `@hydra.main` (so `-m` multirun, `--cfg job` and tab completion behave as in any Hydra app).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from recipes.confdir import conf_dir
from recipes.defaults import embedded_defaults, has_accelerator
from recipes.errors import ConfigError, exit_with
from recipes.overrides import has_hydra_flags
from recipes.redact import redact_config
from recipes.resolvers import register_resolvers

ACTIONS = ("validate", "plan", "train")


def run_recipe(recipe: str, argv: list[str] | None = None) -> None:
    """Entry point of `python -m recipes.<recipe>`."""
    register_resolvers()
    argv = list(sys.argv[1:] if argv is None else argv)
    added = embedded_defaults(argv, has_accelerator())
    if added:
        print(f"no GPU found: embedded CPU defaults {' '.join(added)} (choose parallel=/cluster= to plan for GPUs)")
    argv = argv + added
    if not has_hydra_flags(argv):
        # compose and validate once before Hydra makes a run folder: a bad input leaves nothing behind
        from recipes.compose import compose_recipe
        from recipes.validate import validate

        try:
            cfg = compose_recipe(recipe, [a for a in argv if not a.startswith("hydra.")])
            if check_action(cfg) != "plan":
                validate(cfg)
            from recipes.ray_jobs import preflight

            preflight(cfg)  # launcher=ray action=train: the cluster answers
        except ConfigError as error:
            exit_with(error)
    sys.argv = [f"recipes.{recipe}"] + argv
    main = hydra.main(config_path=str(conf_dir()), config_name=recipe, version_base=None)(execute)
    main()


def execute(cfg: DictConfig) -> None:
    """One Hydra job: validate, then the chosen action. Config problems exit 2 with one line each."""
    try:
        action = check_action(cfg)
        if action == "plan":
            # a plan is printed even for a layout that does not fit the model: it shows why (and exits 2)
            from recipes.plan import run_plan
            from recipes.validate import inspect

            checked = inspect(cfg)
            if checked.train is None or checked.infer is None or checked.arch is None:
                raise ConfigError(checked.problems)
            _write_bundle(cfg, Path(cfg.run.dir))
            code = run_plan(checked)
            if code:
                sys.exit(code)
            return
        from recipes.validate import validate

        checked = validate(cfg)
        for warning in checked.warnings:
            print(warning if warning.startswith("note:") else f"warning: {warning}")
        run_dir = Path(checked.cfg.run.dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(checked.cfg, run_dir / "resolved_config.yaml")
        _write_bundle(checked.cfg, run_dir)
        if action == "validate":
            print(f"config OK: {describe(checked)}")
            print(f"resolved verl config written to {run_dir / 'resolved_config.yaml'}")
            return
        if OmegaConf.select(checked.cfg, "launcher.name") == "ray":
            # a Ray Job on an existing cluster runs this same flow there (launcher=local); its exit code is ours
            from recipes.ray_jobs import submit_from_hydra

            code = submit_from_hydra(checked.cfg, run_dir)
            if code:
                sys.exit(code)
            return
        from recipes.train import run_training

        run_training(checked)
    except ConfigError as error:
        exit_with(error)


def _write_bundle(cfg: DictConfig, run_dir: Path) -> None:
    """The reproducibility bundle (repro/) and nccl_env.json in the run folder, for every action (recipes/bundle.py)."""
    from recipes.bundle import write_for_job

    for line in write_for_job(cfg, run_dir):
        print(line)


def check_action(cfg: DictConfig) -> str:
    action = OmegaConf.select(cfg, "action")
    if action not in ACTIONS:
        raise ConfigError(f"action: unknown action {action!r}; choose from {', '.join(ACTIONS)}")
    return action


def describe(checked) -> str:
    t, i = checked.train, checked.infer
    cfg = checked.cfg
    return (
        f"{cfg.strategy.name} train dp{t.dp} tp{t.tp} pp{t.pp} cp{t.cp} ep{t.ep} -> {cfg.rollout.name} "
        f"infer tp{i.tp} pp{i.pp} x{i.dp} replicas on {cfg.cluster.nnodes}x{cfg.cluster.gpus_per_node} "
        f"{cfg.cluster.gpu.name}, model {cfg.model.name}"
    )


def save_config(cfg: DictConfig, path: Path) -> None:
    container = redact_config(OmegaConf.to_container(cfg, resolve=True))
    path.write_text(OmegaConf.to_yaml(OmegaConf.create(container)))
    os.chmod(path, 0o644)
