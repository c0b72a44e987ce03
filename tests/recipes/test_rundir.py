"""Every run gets a folder of its own, even when two start in the same second; a refused run leaves none."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
from datetime import datetime, timedelta

import pytest

from recipes.rundir import release, reserve
from tests.conftest import checkout_env


def _reserve(path, queue):
    queue.put(str(reserve(path).path))


def test_reserve_gives_each_process_its_own_folder(tmp_path):
    target = tmp_path / "runs" / "grpo" / "2026-12-01_12-00-00"
    queue = multiprocessing.get_context("spawn").Queue()
    procs = [multiprocessing.get_context("spawn").Process(target=_reserve, args=(target, queue)) for _ in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(30)
    got = sorted(queue.get(timeout=5) for _ in procs)
    assert got == sorted([str(target)] + [f"{target}-{n}" for n in (1, 2, 3)])


def test_release_removes_only_what_it_made(tmp_path):
    first = reserve(tmp_path / "runs" / "grpo" / "t")
    second = reserve(tmp_path / "runs" / "grpo" / "t")
    assert second.path.name == "t-1" and second.created == (second.path,)
    release(first)
    assert not first.path.exists() and (tmp_path / "runs" / "grpo").is_dir()  # t-1 still lives there
    release(second)
    assert not second.path.exists()
    alone = reserve(tmp_path / "fresh" / "grpo" / "t")
    release(alone)
    assert not (tmp_path / "fresh").exists()  # a lone reservation takes its parents with it


def test_a_taken_name_gets_the_next_suffix_through_the_cli(tmp_path, recipe_main):
    start = datetime.now()
    for seconds in range(60):  # every name the run could take in the next minute is taken
        (tmp_path / "runs" / "grpo" / (start + timedelta(seconds=seconds)).strftime("%Y-%m-%d_%H-%M-%S")).mkdir(
            parents=True)
    proc = recipe_main("grpo", "action=validate", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    written = list((tmp_path / "runs" / "grpo").glob("*/resolved_config.yaml"))
    assert len(written) == 1 and written[0].parent.name.endswith("-1")
    assert f"written to {written[0]}" in proc.stdout


@pytest.mark.slow  # child processes
def test_two_runs_started_together_never_share_a_folder(tmp_path):
    command = [sys.executable, "-m", "recipes.grpo", "action=validate"]
    procs = [subprocess.Popen(command, cwd=tmp_path, env=checkout_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [proc.communicate(timeout=300) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], [err[-1000:] for _, err in outs]
    folders = {line.rsplit("written to ", 1)[1] for out, _ in outs for line in out.splitlines() if "written to" in line}
    assert len(folders) == 2


@pytest.mark.slow  # 5.7-8.2 s on 2 cores (CI, 2026-12-05): a multirun of validations in-process
def test_a_sweep_gets_a_folder_of_its_own(tmp_path, recipe_main):
    start = datetime.now()
    for seconds in range(60):  # another sweep holds every name this one could take in the next minute
        name = "multirun-" + (start + timedelta(seconds=seconds)).strftime("%Y-%m-%d_%H-%M-%S")
        (tmp_path / "runs" / "grpo" / name).mkdir(parents=True)
    proc = recipe_main("grpo", "-m", "actor_rollout_ref.rollout.n=1,2", "action=validate", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    written = sorted((tmp_path / "runs" / "grpo").glob("*/*/resolved_config.yaml"))
    assert [(p.parent.parent.name.endswith("-1"), p.parent.name) for p in written] == [(True, "0"), (True, "1")]
    assert (written[0].parent.parent / "sweep_results.json").is_file()


def test_a_run_folder_is_locked_while_its_run_lives_and_a_dead_runs_lock_is_taken_over(tmp_path):
    import json
    import socket

    import pytest

    from recipes.errors import ConfigError
    from recipes.rundir import LOCK, lock, unlock

    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / LOCK).write_text(json.dumps({"pid": live.pid, "host": socket.gethostname()}))
        with pytest.raises(ConfigError, match=rf"run.resume=x: {tmp_path} is in use by process {live.pid} on "):
            lock(tmp_path, "run.resume=x")
    finally:
        live.kill()
        live.wait()
    held = lock(tmp_path, "run.resume=x")  # its process is gone: taken over
    assert json.loads(held.read_text())["pid"] != live.pid
    unlock(held)
    assert not held.exists()
    (tmp_path / LOCK).write_text(json.dumps({"pid": live.pid, "host": "another-host"}))
    with pytest.raises(ConfigError, match="in use by process"):  # another machine's: cannot be checked, kept
        lock(tmp_path, "run.resume=x")
    unlock(tmp_path / LOCK)  # not ours: stays
    assert (tmp_path / LOCK).exists()


def test_a_typed_run_folder_that_does_not_exist_yet_is_made_and_locked(tmp_path, recipe_main):
    folder = tmp_path / "not" / "yet" / "there"
    proc = recipe_main("grpo", "action=validate", f"hydra.run.dir={folder}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert (folder / "resolved_config.yaml").is_file()
    assert not (folder / "run.lock").exists()  # released when the run ended
