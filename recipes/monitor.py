"""What the user sees while verl trains: one progress line per step read from metrics.jsonl, and a PNG at the end.

verl's `file` logger writes every step's metrics as one JSON line to $VERL_FILE_LOGGER_PATH (the run folder's
metrics.jsonl). A thread in the driver follows that file and prints `step 3/20 reward ... kl ... entropy ... 2.1 s`.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

REWARD_KEYS = ("critic/score/mean", "critic/rewards/mean")
KL_KEYS = ("actor/kl_loss", "critic/kl", "actor/ppo_kl")
ENTROPY_KEYS = ("actor/entropy",)
STEP_TIME_KEYS = ("timing_s/step",)


def first(metrics: dict, keys: tuple[str, ...]):
    for key in keys:
        if key in metrics and metrics[key] is not None:
            return float(metrics[key])
    return None


def read_metrics(path: Path) -> list[tuple[int, dict]]:
    """(step, metrics) per line of a verl file-logger JSONL; a partly written last line is skipped."""
    rows = []
    if not path.is_file():
        return rows
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        rows.append((int(row["step"]), row["data"]))
    return rows


def progress_line(step: int, total: int | None, metrics: dict) -> str:
    parts = [f"step {step}/{total}" if total else f"step {step}"]
    for label, keys, fmt in (("reward", REWARD_KEYS, "{:+.3f}"), ("kl", KL_KEYS, "{:.4f}"),
                             ("entropy", ENTROPY_KEYS, "{:.3f}")):
        value = first(metrics, keys)
        if value is not None:
            parts.append(f"{label} {fmt.format(value)}")
    seconds = first(metrics, STEP_TIME_KEYS)
    if seconds is not None:
        parts.append(f"{seconds:.1f} s")
    return "  ".join(parts)


class ProgressPrinter:
    """Follows metrics.jsonl in a background thread and prints one line per new step."""

    def __init__(self, path: Path, total_steps: int | None, interval: float = 0.5, out=print):
        self.path, self.total, self.interval, self.out = path, total_steps, interval, out
        self._seen = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=5)
        self._flush()

    def _flush(self):
        rows = read_metrics(self.path)
        for step, metrics in rows[self._seen:]:
            self.out(progress_line(step, self.total, metrics))
        self._seen = len(rows)

    def _run(self):
        while not self._stop.is_set():
            self._flush()
            time.sleep(self.interval)


def plot_metrics(metrics_path: Path, png_path: Path, title: str = "") -> Path | None:
    """reward, KL and entropy per step side by side; None when there is nothing to draw."""
    rows = read_metrics(metrics_path)
    if not rows:
        return None
    import matplotlib  # lazy: slow to import, and only the end-of-run plot needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: must follow matplotlib.use("Agg") (no display on a training node)

    panels = [("reward", REWARD_KEYS), ("KL", KL_KEYS), ("entropy", ENTROPY_KEYS)]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.2))
    for ax, (label, keys) in zip(axes, panels, strict=True):
        points = [(step, first(m, keys)) for step, m in rows if first(m, keys) is not None]
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3)
        ax.set_title(label)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return png_path
