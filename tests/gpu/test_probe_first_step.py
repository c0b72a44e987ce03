"""scripts/gpu/probe_first_step.py, as it is typed on the GPU machine, against a stand-in run on the CPU: a command
that prints verl's step-1 marker into its verl.log and keeps a child process alive, and a stand-in py-spy that
prints the pid it was asked for (the real one needs ptrace on the GPU machine's processes). What is asserted is what
the probe promises: one stack per process of the run, parents and children, at each offset after the marker."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROBE = REPO / "scripts" / "gpu" / "probe_first_step.py"

RUN = """
import subprocess, sys, time
from pathlib import Path
run = Path(sys.argv[1])
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
Path(run / "child.pid").write_text(str(child.pid))
time.sleep(0.5)
(run / "verl.log").write_text("loading\\nTraining Progress:   0%|  | 0/4\\n")
time.sleep(2.5)
child.kill()
sys.exit(7)
"""

SPY = "#!/bin/sh\n# py-spy dump --pid PID [--nonblocking]\necho \"stack of $3 $4\"\n"


def _stub_spy(folder: Path) -> Path:
    spy = folder / "py-spy"
    spy.write_text(SPY)
    spy.chmod(0o755)
    return spy


def _probe(tmp_path, *spy_args, script=RUN, after="1,2"):
    run, out = tmp_path / "run", tmp_path / "out"
    run.mkdir()
    (tmp_path / "run.py").write_text(script)
    proc = subprocess.run([sys.executable, str(PROBE), "--run-dir", str(run), "--out", str(out), "--after", after,
                           "--timeout", "20", *spy_args, "--", sys.executable, str(tmp_path / "run.py"), str(run)],
                          capture_output=True, text=True, timeout=60)
    return proc, run, out


@pytest.mark.slow
def test_every_process_of_the_run_is_sampled_at_each_offset_after_the_marker(tmp_path):
    proc, run, out = _probe(tmp_path, "--py-spy", str(_stub_spy(tmp_path)))
    assert proc.returncode == 7, proc.stderr  # the run's own exit code
    child = (run / "child.pid").read_text()
    assert sorted(p.name for p in out.glob("stacks_t*.txt")) == ["stacks_t1s.txt", "stacks_t2s.txt"]
    for stacks in out.glob("stacks_t*.txt"):
        text = stacks.read_text()
        assert f"stack of {child}" in text
        assert text.count("===== pid ") == 2  # the run and its child, nothing of the probe's own
    listed = [line.split()[0] for line in (out / "processes.txt").read_text().splitlines()]
    assert len(listed) == 2 and listed[1] == child
    assert "probe: stacks 1 s after the marker" in proc.stderr


@pytest.mark.slow
def test_nonblocking_reads_each_process_without_pausing_it(tmp_path):
    """--nonblocking, for a run that is also timed: py-spy reads the stacks without stopping the processes."""
    proc, run, out = _probe(tmp_path, "--nonblocking", "--py-spy", str(_stub_spy(tmp_path)), after="1")
    assert proc.returncode == 7, proc.stderr
    text = (out / "stacks_t1s.txt").read_text()
    assert f"stack of {(run / 'child.pid').read_text()} --nonblocking" in text


@pytest.mark.slow
def test_the_binary_comes_out_of_a_py_spy_wheel(tmp_path):
    wheel = tmp_path / "py_spy-0.4.3-py2.py3-none-manylinux1_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("py_spy-0.4.3.data/scripts/py-spy", SPY)
    proc, run, out = _probe(tmp_path, "--py-spy-wheel", str(wheel), after="1")
    assert proc.returncode == 7, proc.stderr
    assert f"stack of {(run / 'child.pid').read_text()}" in (out / "stacks_t1s.txt").read_text()


@pytest.mark.slow
def test_a_run_that_never_prints_the_marker_is_one_line_and_exit_3(tmp_path):
    quiet = "import sys, time\ntime.sleep(1)\nsys.exit(0)\n"
    proc, run, out = _probe(tmp_path, "--py-spy", str(_stub_spy(tmp_path)), script=quiet)
    assert proc.returncode == 3
    assert proc.stderr.strip().splitlines() == [
        f"probe: no 'Training Progress:' in {run / 'verl.log'}; the run's output: {out / 'run.log'}"]
    assert not list(out.glob("stacks_t*.txt"))
