"""Break each named behaviour on purpose in the clone, run the test that names it, restore. Issue 48 section 3."""
import subprocess, sys, time
from pathlib import Path
ROOT = Path("/tmp/bop")
BREAKS = [
    ("README demo figures: the tiny actor learns 10x slower (lr 7e-4)", "conf/model/tiny.yaml",
     "      lr: 7.0e-3", "      lr: 7.0e-4",
     ["tests/e2e/test_demo.py::test_the_readme_demo_figures_hold_within_tolerance"]),
]
log = open("/tmp/bop_results.txt", "a")
for name, file, old, new, tests in BREAKS:
    path = ROOT / file
    text = path.read_text()
    assert text.count(old) == 1, (name, text.count(old))
    path.write_text(text.replace(old, new))
    start = time.time()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
                          cwd=ROOT, capture_output=True, text=True)
    path.write_text(text)
    tail = [l for l in proc.stdout.splitlines() if l.startswith(("FAILED", "ERROR", "E  ")) or " passed" in l or " failed" in l]
    print(f"== {name}: pytest exit {proc.returncode} in {time.time() - start:.0f} s", file=log)
    print("\n".join(tail[-12:]), file=log, flush=True)
