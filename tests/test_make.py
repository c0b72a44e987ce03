"""The README's quickstart says what each make target runs (``make test  # = <command>: ...``): that is the command
``make -n`` prints, so the README, the Makefile and CI (``.ci/run`` runs ``make install`` and ``make test``) stay in
step."""

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


@pytest.mark.parametrize("target", ["demo", "test"])
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
