"""verl's and Ray's output goes to the run folder's log; the pack's own lines reach the terminal."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import subprocess, sys
    from pathlib import Path
    from recipes.run.console import verl_output_to_log
    log = Path(sys.argv[1])
    print("before", flush=True)
    with verl_output_to_log(log, verbose=sys.argv[2] == "1") as term:
        print("verl says hello")                                   # this process's stdout
        print("a warning from Ray", file=sys.stderr)               # this process's stderr
        subprocess.run([sys.executable, "-c", "print('from a worker process')"], check=True)  # a child
        term.say("step 1/2  reward +0.100")
        term.note("note: a notice")
    print("after", flush=True)
""")


def run(tmp_path, verbose: bool):
    log = tmp_path / "verl.log"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(log), "1" if verbose else "0"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc, log.read_text()


def test_quiet_run_keeps_verl_output_in_the_log(tmp_path):
    proc, log = run(tmp_path, verbose=False)
    assert proc.stdout.splitlines() == ["before", "step 1/2  reward +0.100", "after"]
    assert proc.stderr.splitlines() == ["note: a notice"]
    assert sorted(log.splitlines()) == ["a warning from Ray", "from a worker process", "verl says hello"]


def test_verbose_run_also_shows_it_live(tmp_path):
    proc, log = run(tmp_path, verbose=True)
    assert proc.stdout.splitlines() == ["before", "step 1/2  reward +0.100", "after"]
    assert sorted(proc.stderr.splitlines()) == sorted(["note: a notice", *log.splitlines()])
    assert "from a worker process" in log
