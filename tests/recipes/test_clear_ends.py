"""A run that ends badly says why in one line, with the last complete checkpoint and the command that goes on
(recipes/run/interrupt.py ``lost_worker_line``): a Ray worker lost without ``stability=auto``; a scheduler's SIGTERM
taken as Ctrl-C (``sigterm_as_interrupt``). Here the line and the signal handling in-process; the line through a real
training run whose worker is SIGKILLed: tests/e2e/test_recipes_cpu.py; the SIGTERM handler through a real ``ray.init``:
tests/recipes/verl_ext/test_worker_secrets.py. (A full disk during a checkpoint save: tests/recipes/test_checkpoints.py;
Ctrl-C: tests/e2e/test_interrupt.py.)"""

from __future__ import annotations

import json
import signal
import time

import pytest

from recipes.run.checkpoints import mark_complete
from recipes.run.interrupt import lost_worker_line, sigterm_as_interrupt

# the exception chain as verl's driver gets it when Ray's worker process of the actor is SIGKILLed (Ray 2.60)
ACTOR_DIED = """Traceback (most recent call last):
ray.exceptions.RayTaskError(ActorDiedError): ray::TaskRunner.run() (pid=4242, ip=127.0.0.1)
ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.
\tclass_name: create_colocated_worker_cls.<locals>.WorkerDict
\tactor_id: 5c1d
\tpid: 5151
\tnamespace: 7a
\tip: 127.0.0.1
The actor is dead because its worker process has died. Worker exit type: UNEXPECTED_SYSTEM_EXIT Worker exit detail: \
Worker unexpectedly exits with a connection error code 2. End of file. There are some potential root causes. (1) The \
process is killed by SIGKILL by OOM killer due to high memory usage.
"""


def _run_folder(tmp_path, steps: int, saved: list[int]):
    run = tmp_path / "runs" / "grpo" / "r"
    (run / "checkpoints").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "data": {}}) + "\n" for s in range(1, steps + 1)))
    for step in saved:
        folder = run / "checkpoints" / f"global_step_{step}"
        (folder / "actor").mkdir(parents=True)
        (folder / "actor" / "model.pt").write_bytes(b"w" * 64)
        mark_complete(folder, step)
    return run


def test_a_lost_worker_is_one_line_with_the_checkpoint_and_the_resume_command(tmp_path):
    run = _run_folder(tmp_path, steps=3, saved=[2])
    command = ["python", "-m", "recipes.grpo", "trainer.save_freq=2"]
    line = lost_worker_line(ACTOR_DIED, run, run / "checkpoints", command)
    assert line == (
        "training stopped after step 3: ray::WorkerDict (pid 5151) died (UNEXPECTED_SYSTEM_EXIT); last complete "
        f"checkpoint: {run}/checkpoints/global_step_2; resume: python -m recipes.grpo trainer.save_freq=2 "
        f"run.resume={run} (stability=auto restarts from the last checkpoint by itself; verl's own account is in "
        "the run folder's log)")


def test_no_checkpoint_yet_and_other_failures(tmp_path):
    run = _run_folder(tmp_path, steps=1, saved=[])
    line = lost_worker_line(ACTOR_DIED, run, run / "checkpoints", ["python"])
    assert "after step 1: ray::WorkerDict (pid 5151) died" in line and "no complete checkpoint yet" in line
    oom = "ray.exceptions.RayTaskError(OutOfMemoryError): ray::WorkerDict.update_actor()\ntorch.OutOfMemoryError: CUDA"
    assert "a Ray worker ran out of memory" in lost_worker_line(oom, run, run / "checkpoints", ["python"])
    assert lost_worker_line("ValueError: bad path", run, run / "checkpoints", ["python"]) is None


def _row(step: int) -> str:
    return json.dumps({"step": step, "data": {}}) + "\n"


@pytest.fixture
def ctrl_c():
    """SIGINT as an interactive shell leaves it (a background job, `nohup`, starts with it ignored); put back after."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield before
    signal.signal(signal.SIGINT, before)


def test_a_swallowed_interrupt_comes_again_once_training_logs_a_step(tmp_path, ctrl_c):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(_row(1))
    swallowed = []
    with pytest.raises(KeyboardInterrupt):
        with sigterm_as_interrupt(metrics, every_s=0.05):
            try:
                signal.raise_signal(signal.SIGINT)
            except KeyboardInterrupt:
                swallowed.append(1)  # as code inside verl or Ray might
            metrics.write_text(_row(1) + _row(2))  # training went on
            time.sleep(10)  # the interrupt comes again within every_s
    assert swallowed == [1]


def test_no_second_interrupt_while_no_step_is_logged(tmp_path, ctrl_c):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(_row(1))
    term = signal.getsignal(signal.SIGTERM)
    with sigterm_as_interrupt(metrics, every_s=0.05):
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGTERM)  # a scheduler's stop is Ctrl-C too
        time.sleep(0.5)  # shutting down: nothing logged, nothing raised
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == (signal.default_int_handler, term)


def test_an_ignored_ctrl_c_stays_ignored(tmp_path, ctrl_c):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # started in the background
    with sigterm_as_interrupt(tmp_path / "metrics.jsonl"):
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        signal.raise_signal(signal.SIGINT)  # nothing happens


def test_a_checkpoint_saved_but_not_logged_is_not_the_one_offered(tmp_path):
    # stopped between verl's save of step 4 and its log of step 4: run.resume= goes on from step 2, and so says the line
    run = _run_folder(tmp_path, steps=3, saved=[2, 4])
    line = lost_worker_line(ACTOR_DIED, run, run / "checkpoints", ["python"])
    assert f"last complete checkpoint: {run}/checkpoints/global_step_2;" in line
