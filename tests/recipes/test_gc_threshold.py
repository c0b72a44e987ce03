"""``run.gc_threshold`` and the freeze at exit (recipes/run/gc_threshold.py). That a real Ray worker of a run gets the
configured thresholds is checked through verl's ``run_ppo`` in tests/recipes/verl_ext/test_worker_secrets.py."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

from recipes.run import gc_threshold
from tests.conftest import checkout_env


@pytest.fixture
def restored():
    saved = gc.get_threshold()
    yield
    gc.set_threshold(*saved)


def test_null_means_pythons_own_thresholds_and_a_list_is_taken_as_given(restored):
    assert gc_threshold.threshold_of(None) == gc_threshold.PYTHON_THRESHOLD == (700, 10, 10)
    gc_threshold.apply([1234, 5, 6])
    assert gc.get_threshold() == (1234, 5, 6)
    gc_threshold.apply(None)
    assert gc.get_threshold() == (700, 10, 10)


def test_the_worker_hook_sets_the_thresholds_then_runs_the_hook_given_before(restored):
    seen = []
    gc_threshold.setup_hook([4321, 7, 8], then=lambda: seen.append(gc.get_threshold()))()
    assert seen == [(4321, 7, 8)]
    assert gc_threshold.setup_hook(None).__name__ == "set_worker_gc_threshold"  # Ray exports the hook by its name


FREEZE = """
import atexit, gc
from recipes.run import gc_threshold
before = atexit._ncallbacks()
gc_threshold.freeze_at_exit()
gc_threshold.freeze_at_exit()  # once only
print(atexit._ncallbacks() - before, gc.get_freeze_count() == 0)
atexit._run_exitfuncs()  # what the interpreter runs at exit, before its teardown
print(gc.get_freeze_count() > 0)
"""


def test_at_exit_the_live_objects_are_frozen_once():
    done = subprocess.run([sys.executable, "-c", FREEZE], env=checkout_env(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    registered, frozen = done.stdout.split("\n")[:2]
    assert registered == "1 True"  # one handler for two calls, nothing frozen before
    assert frozen == "True"
