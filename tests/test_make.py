"""The README's install block says what each make target runs (``make test  # = <command>: ...``): that is the
command ``make -n`` prints, so the README, the Makefile and CI (``.ci/run`` runs ``make install`` and ``make test``,
the whole suite) stay in step. ``make test-fast`` is the README's everyday command; CI still runs the whole suite."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from tests.conftest import ROOT


def quickstart() -> dict[str, str]:
    """``{target: command}`` from the README's quickstart lines ``make <target>  # = <command>: <comment>``."""
    text = (ROOT / "README.md").read_text()
    return {m.group(1): m.group(2) for m in re.finditer(r"^make (\w[\w-]*) +# = (.+?)(?::|$)", text, re.M)}


@pytest.mark.parametrize("target", ["demo", "test-fast", "test"])
def test_the_readme_names_the_command_make_runs(target):
    said = quickstart()
    assert target in said, f"the README's quickstart has no 'make {target}  # = ...' line"
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}  # under make test
    ran = subprocess.run(["make", "-n", "--no-print-directory", target, "PYTHON=python"], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True).stdout.strip()
    assert ran == said[target]


def test_ci_runs_the_readmes_commands():
    script = (ROOT / ".ci" / "run").read_text().splitlines()
    assert "make install" in script and script[-1] == "make test"


def test_ci_runs_the_whole_suite_the_everyday_command_a_part_of_it():
    said = quickstart()
    assert "what CI runs" in (ROOT / "README.md").read_text().split(f"make test           # = {said['test']}", 1)[1]
    pytest_args = said["test"].split(" pytest ", 1)[1].split()
    assert "-m" not in pytest_args and "-k" not in pytest_args, f"make test must not leave tests out: {said['test']}"
    assert '-m "not slow"' in said["test-fast"]
