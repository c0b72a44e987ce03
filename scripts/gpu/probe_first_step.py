"""Stack samples of every process of one run while its first step waits, to read what the wait is.

Every GPU arm waits 20-35 s between the start of step 1 and the first request reaching the engine: vLLM and SGLang
alike, verl's own run too (docs/vs_verl.md, "The first generation"). This starts a run, waits until its verl.log
prints the step-1 marker, and at each offset after it dumps the Python stack of the run's process and all of its
descendants (Ray's workers are children of the raylet the recipe starts) with py-spy:

    python scripts/gpu/probe_first_step.py --run-dir RUN --out OUT --after 5,12,20 -- \\
        python -m recipes.grpo ... hydra.run.dir=RUN

OUT gets processes.txt (each process: pid, parent, command line, at the first sample) and stacks_tNs.txt (each
process's stack N s after the marker); the command's own output goes to OUT/run.log. py-spy: --py-spy PATH, or a
py-spy wheel (``pip download py-spy==0.4.3``, docs/vs_verl.md) given as --py-spy-wheel, whose binary is unpacked
beside OUT. Exit: the run's exit code, or 3 when the marker never came.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

MARKER = "Training Progress:"
"""What verl's trainer prints when its step loop starts (its tqdm bar, in verl.log)."""


def descendants(root: int) -> list[tuple[int, int]]:
    """``(pid, parent)`` of ``root`` and every process below it, from /proc (parents before children)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone while read
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    parent = {pid: ppid for ppid, pids in children.items() for pid in pids}
    out, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        out.append((pid, parent.get(pid, -1)))
        todo.extend(sorted(children.get(pid, [])))
    return out


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "(gone)"


def wait_for_marker(log: Path, proc: subprocess.Popen, timeout_s: float) -> float | None:
    """The time the marker appeared in ``log`` (polled every 0.2 s); None if the run ended or the time ran out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if log.is_file() and MARKER in log.read_text(errors="replace"):
            return time.monotonic()
        time.sleep(0.2)
    return None


def dump_all(py_spy: str, root: int, out: Path, nonblocking: bool = False) -> None:
    """Every process under ``root``, its stack (py-spy dump; a process py-spy cannot read says so) into ``out``;
    ``nonblocking``: read each without pausing it (py-spy's --nonblocking), for a run that is also timed."""
    with out.open("w") as f:
        for pid, parent in descendants(root):
            f.write(f"===== pid {pid} (parent {parent}): {command_line(pid)[:300]}\n")
            command = [py_spy, "dump", "--pid", str(pid), *(["--nonblocking"] if nonblocking else [])]
            result = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
            f.write((result.stdout or result.stderr).strip() + "\n\n")


def py_spy_binary(args) -> str:
    if args.py_spy:
        return args.py_spy
    with zipfile.ZipFile(args.py_spy_wheel) as wheel:
        (member,) = [n for n in wheel.namelist() if n.endswith("/scripts/py-spy")]
        target = args.out / "py-spy"
        target.write_bytes(wheel.read(member))
    target.chmod(0o755)
    return str(target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", type=Path, required=True, help="the run folder whose verl.log is read")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--after", default="5,12,20", help="seconds after the marker, comma-separated")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for the marker")
    parser.add_argument("--nonblocking", action="store_true",
                        help="py-spy reads each process without pausing it (the run is also timed)")
    spy = parser.add_mutually_exclusive_group(required=True)
    spy.add_argument("--py-spy", help="the py-spy binary")
    spy.add_argument("--py-spy-wheel", type=Path, help="a py-spy wheel; its binary is unpacked into OUT")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- and the run's command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the run's command after --")
    args.out.mkdir(parents=True, exist_ok=True)
    binary = py_spy_binary(args)
    offsets = sorted(float(s) for s in args.after.split(","))

    with (args.out / "run.log").open("w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    seen = wait_for_marker(args.run_dir / "verl.log", proc, args.timeout)
    if seen is None:
        print(f"probe: no '{MARKER}' in {args.run_dir / 'verl.log'}; the run's output: {args.out / 'run.log'}",
              file=sys.stderr)
        if proc.poll() is None:
            proc.terminate()
        proc.wait()
        return 3
    with (args.out / "processes.txt").open("w") as f:
        for pid, parent in descendants(proc.pid):
            f.write(f"{pid} {parent} {command_line(pid)[:300]}\n")
    for offset in offsets:
        time.sleep(max(0.0, seen + offset - time.monotonic()))
        if proc.poll() is not None:
            break
        stacks = args.out / f"stacks_t{offset:g}s.txt"
        dump_all(binary, proc.pid, stacks, args.nonblocking)
        print(f"probe: stacks {offset:g} s after the marker: {stacks}", file=sys.stderr)
    return proc.wait()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
