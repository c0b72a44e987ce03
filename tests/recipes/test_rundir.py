"""Every run gets a folder of its own, even when two start in the same second; a refused run leaves none."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
from datetime import datetime, timedelta

import pytest

from recipes.errors import ConfigError
from recipes.record.rundir import claim, release, reserve
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
    from recipes.record.rundir import LOCK, lock, unlock

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


# -- a typed hydra.run.dir, and names too long (issue 49, 5) ----------------------------------------------------------


def _one_line(proc) -> str:
    """The single line a refused run prints (exit 2, no traceback)."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return lines[0]


def test_a_typed_run_folder_that_holds_a_run_is_refused_and_left_as_it_was(tmp_path, recipe_cli):
    folder = tmp_path / "earlier"
    (folder / "repro").mkdir(parents=True)
    earlier = {folder / "resolved_config.yaml": b"action: train\n", folder / "repro" / "bundle.json": b'{"x": 1}\n'}
    for path, data in earlier.items():
        path.write_bytes(data)
    proc = recipe_cli("grpo", "action=validate", f"hydra.run.dir={folder}", cwd=tmp_path)
    line = _one_line(proc)
    assert line == (
        f"config error: hydra.run.dir={folder}: {folder} is not empty (repro/, resolved_config.yaml); a typed run "
        "folder must be new or empty, so that no earlier run's record (resolved_config.yaml, repro/) is overwritten: "
        "choose another folder, or leave hydra.run.dir out (each run gets a new folder under run.root); to go on with "
        f"the run in it: run.resume={folder} (in place of hydra.run.dir)")
    assert {path: path.read_bytes() for path in earlier} == earlier
    assert sorted(p.name for p in folder.iterdir()) == ["repro", "resolved_config.yaml"]  # no run.lock, nothing new
    assert not (tmp_path / "runs").exists() and proc.stdout == ""


@pytest.mark.parametrize("case", ["file", "proc", "long"])
def test_a_typed_run_folder_that_cannot_be_one_is_one_line(tmp_path, recipe_cli, case):
    if case == "file":
        (tmp_path / "notes.txt").write_text("mine\n")
        folder, expected = tmp_path / "notes.txt", (
            f"config error: hydra.run.dir={tmp_path}/notes.txt: {tmp_path}/notes.txt is a file; the run folder must "
            "be a folder (a new or empty one)")
    elif case == "proc":
        folder, expected = "/proc/foo", (
            "config error: hydra.run.dir=/proc/foo: cannot create the run folder /proc/foo: No such file or "
            "directory; choose a folder this user can create (on a writable file system)")
    else:
        folder, expected = tmp_path / "new" / ("b" * 300), (
            f"config error: hydra.run.dir={tmp_path}/new/{'b' * 300}: the folder name '{'b' * 30}...bbbbbb' "
            "(300 characters) is 300 bytes, over this file system's 255-byte limit for a name; choose a shorter "
            "folder name")
    proc = recipe_cli("grpo", "action=validate", f"hydra.run.dir={folder}", cwd=tmp_path)
    assert _one_line(proc) == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == (["notes.txt"] if case == "file" else [])


def test_a_run_name_too_long_blames_run_name_and_leaves_no_runs_folder(tmp_path, recipe_cli):
    proc = recipe_cli("grpo", "action=validate", f"run.name={'a' * 300}", cwd=tmp_path)
    assert _one_line(proc) == (
        f"config error: run.name='{'a' * 30}...aaaaaa' (300 characters): 300 bytes, over this file system's 255-byte "
        "limit for a folder name (the run folder is run.root/run.name/<time>); choose a shorter run.name")
    assert list(tmp_path.iterdir()) == []


def test_the_ray_job_the_pack_submitted_writes_into_the_folder_it_reserved(tmp_path, recipe_main):
    # the launcher (recipes/cluster/ray_jobs.py) reserves the run folder and writes its record and job.json there, then
    # the job's driver on the cluster runs with hydra.run.dir=<that folder> (a shared file system: the same folder)
    folder = tmp_path / "runs" / "grpo" / "2026-12-01_12-00-00"
    folder.mkdir(parents=True)
    (folder / "job.json").write_text("{}\n")
    proc = recipe_main("grpo", "action=validate", f"hydra.run.dir={folder}", cwd=tmp_path,
                       env={"KLPPO_RAY_JOB": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (folder / "resolved_config.yaml").is_file() and (folder / "job.json").read_text() == "{}\n"


def test_claim_makes_what_is_missing_and_release_takes_only_that(tmp_path):
    made = claim(tmp_path / "a" / "b", "hydra.run.dir=x")
    assert made.path.is_dir() and made.created == (tmp_path / "a", tmp_path / "a" / "b")
    release(made)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "empty").mkdir()
    kept = claim(tmp_path / "empty", "hydra.run.dir=x")
    assert kept.created == ()  # the user's own folder: a refused run leaves it
    release(kept)
    assert (tmp_path / "empty").is_dir()
    (tmp_path / "empty" / "x.txt").write_text("")
    with pytest.raises(ConfigError, match=r"hydra.run.dir=x: .*/empty is not empty \(x.txt\); a typed run folder"):
        claim(tmp_path / "empty", "hydra.run.dir=x")
    assert claim(tmp_path / "empty", "hydra.run.dir=x", reuse=True).created == ()


def test_a_reservation_that_fails_takes_back_the_parents_it_made(tmp_path):
    with pytest.raises(OSError):
        reserve(tmp_path / "runs" / "grpo" / ("a" * 300))
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(OSError):
        reserve(tmp_path / "runs" / ("a" * 300) / "2026-12-01_12-00-00")  # a parent that cannot be made
    assert list(tmp_path.iterdir()) == []
