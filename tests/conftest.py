"""Shared fixtures: GPU tests skip without CUDA; ``recipe_cli`` runs a recipe in a child process, as a user types it;
``recipe_main`` runs the same command line in this process (the recipe's ``main``, stdout and stderr captured).

Every test that starts ``python -m recipes.<name>`` goes through :func:`run_recipe_cli` (the ``recipe_cli`` fixture),
so that each such run sees the same environment (:func:`checkout_env`). One real child process per promise (each
action of each recipe, training, Ctrl-C) keeps the command itself tested; further checks of what the same command
prints go through :func:`run_recipe_main`, which skips the ~5 s of imports a child pays.
"""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
from collections.abc import Mapping
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from recipes.run import gc_threshold

ROOT = Path(__file__).resolve().parents[1]
"""The checkout these tests belong to."""

# the suite's own processes collect garbage as a recipe's do (run.gc_threshold's default; recipes/run/gc_threshold.py):
# an in-process recipe run sets it anyway, and a worker that imports torch and verl pays Python's default many times
gc_threshold.apply(gc_threshold.DEFAULT)

MEGATRON_SITE = ROOT / "build" / "megatron-site"
"""Where ``make install`` puts the ``[megatron]`` extra's packages for the tests (requirements/megatron-site.txt)."""

NOT_INHERITED = ("RAY_ADDRESS", "RAY_JOB_CONFIG_JSON_ENV_VAR")
"""Left out of a child's environment, with the copied recipe's conf/ folder variable
(``recipes.compose.confdir.CONF_DIR_ENV``): set in the shell that started pytest, each would change what a recipe run
does. RAY_ADDRESS (and a Ray Job's own config) make the run join that cluster instead of starting its own Ray; the conf/
folder variable makes it compose a copied recipe's conf/ instead of the checkout's."""


def megatron_path() -> str | None:
    """Where a child process finds megatron-core and mbridge: ``""`` where this process imports them already, the
    folder ``make install`` fills (:data:`MEGATRON_SITE`) where it holds both, else None (the megatron tests skip)."""
    import importlib.util

    if importlib.util.find_spec("megatron") is not None and importlib.util.find_spec("mbridge") is not None:
        return ""
    if (MEGATRON_SITE / "megatron" / "core").is_dir() and (MEGATRON_SITE / "mbridge").is_dir():
        return str(MEGATRON_SITE)
    return None


def megatron_child_env() -> dict[str, str]:
    """This process's environment for a child that runs megatron-core: the checkout, :func:`megatron_path`, then
    this process's own ``sys.path`` on PYTHONPATH; a free MASTER_PORT for its one-process group (two such children
    run at once under xdist)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    path = [str(ROOT), *filter(None, [megatron_path()]), *sys.path]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), "MASTER_PORT": str(port)}


def checkout_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a child that must run this checkout's code: without :data:`NOT_INHERITED`,
    the checkout first on PYTHONPATH (an installed copy of the pack may be older; what PYTHONPATH held stays behind
    it), then ``extra`` on top. Everything else passes through unchanged: the folder the tiny assets are cached in,
    CUDA_VISIBLE_DEVICES, the shell's NCCL variables."""
    from recipes.compose.confdir import CONF_DIR_ENV  # lazy: loading this conftest needs no product module

    env = {k: v for k, v in os.environ.items() if k not in (*NOT_INHERITED, CONF_DIR_ENV)}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env.update(extra or {})
    return env


def run_recipe_cli(
    recipe: str | os.PathLike,
    *args: str,
    cwd: str | os.PathLike,
    env: Mapping[str, str] | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m recipes.<recipe> *args`` in ``cwd`` (where its runs/ folder goes) with :func:`checkout_env`
    plus ``env``; return the finished process, stdout and stderr apart, as text. A path instead of a name runs that
    script (a copied recipe's entry point, ``python DEST/kl_ppo.py``). A failed run is returned, not raised; a run
    past ``timeout`` seconds raises ``subprocess.TimeoutExpired``."""
    target = [str(recipe)] if isinstance(recipe, os.PathLike) else ["-m", f"recipes.{recipe}"]
    return subprocess.run([sys.executable, *target, *args], cwd=cwd, env=checkout_env(env), capture_output=True,
                          text=True, timeout=timeout)


def run_recipe_main(
    recipe: str,
    *args: str,
    cwd: str | os.PathLike,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """:func:`run_recipe_cli` in this process: ``recipes.launch.run_recipe(recipe, args)`` in ``cwd`` with
    :func:`checkout_env` plus ``env`` as the environment, stdout and stderr captured apart; the exit code is what
    ``sys.exit`` was given (0 when the recipe returns). The working directory, the environment, ``sys.argv`` and the
    root logger's handlers (Hydra's job logging configures them) are put back afterwards. ``timeout`` is accepted for
    the same call shape and not enforced. An exception the recipe does not turn into an exit propagates (a child
    process would print its traceback and exit 1)."""
    from recipes.launch import run_recipe  # lazy: loading this conftest needs no product module

    del timeout
    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_cwd, saved_argv = dict(os.environ), os.getcwd(), sys.argv
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    code: int = 0
    try:
        child_env = checkout_env(env)
        os.environ.clear()
        os.environ.update(child_env)
        os.chdir(cwd)
        sys.argv = [str(ROOT / "recipes" / f"{recipe}.py"), *args]
        with redirect_stdout(out), redirect_stderr(err):
            try:
                run_recipe(recipe, list(args))
            except SystemExit as done:
                if isinstance(done.code, str):  # sys.exit("text"): Python prints it to stderr, exit 1
                    print(done.code, file=sys.stderr)
                code = 1 if isinstance(done.code, str) else int(done.code or 0)
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)
        sys.argv = saved_argv
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
    return subprocess.CompletedProcess(["recipes." + recipe, *args], code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="session")
def recipe_main():
    """:func:`run_recipe_main`: ``recipe_main(recipe, *args, cwd=..., env=None) -> CompletedProcess``, in-process."""
    return run_recipe_main


@pytest.fixture(scope="session")
def recipe_cli():
    """:func:`run_recipe_cli`: ``recipe_cli(recipe, *args, cwd=..., env=None, timeout=600) -> CompletedProcess``.
    Session-scoped, so module-scoped fixtures (the end-to-end training runs) can use it too."""
    return run_recipe_cli


SLOW_S = 5.0
"""What ``slow`` means: more than this many seconds (setup and call) on a 2-core machine. A test that starts a recipe
in a child process (``recipe_cli``), trains end to end (``e2e``) or starts Ray (``ray``) is marked slow here; any other
test over the mark is listed at the end of the run, to be marked or made faster. ``make test-fast`` leaves them out."""

_over: dict[str, float] = {}


def pytest_runtest_logreport(report):
    if report.when in ("setup", "call") and "slow" not in report.keywords:
        _over[report.nodeid] = _over.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    over = sorted(((s, nodeid) for nodeid, s in _over.items() if s > SLOW_S), reverse=True)
    if over:
        terminalreporter.write_sep("-", f"{len(over)} tests over {SLOW_S:g} s not marked slow (mark or speed them up)")
        for seconds, nodeid in over:
            terminalreporter.write_line(f"{seconds:6.1f}s {nodeid}")


TRAINING_GROUP = "training"
"""The pytest-xdist group (``--dist loadgroup``, ``make test``) of every test that trains or starts Ray, unless its
module names :data:`SECOND_TRAINING_GROUP`: the tests of one group run one after another on one worker, so a
module's (or a session's) shared run is made once. Two groups let both workers train at once: one training leaves a
core idle for about a third of its time (Ray's start, verl's sequential phases), the other run fills it. Each
group's modules together take about half of the training time; the other tests fill in around them."""

SECOND_TRAINING_GROUP = "training-2"
"""The other training group: a module joins it with ``pytest.mark.xdist_group(SECOND_TRAINING_GROUP)`` in its
``pytestmark`` (modules that share a session-scoped run join the same group)."""


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the group marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        trains = any(item.get_closest_marker(name) for name in ("e2e", "ray"))
        if trains or "recipe_cli" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
        if trains and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(TRAINING_GROUP))
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)
