"""What the user sees while verl trains: one progress line per step read from metrics.jsonl, and a PNG at the end.

verl's `file` logger writes every step's metrics as one JSON line to $VERL_FILE_LOGGER_PATH (the run folder's
metrics.jsonl). A thread in the driver follows that file and prints
`step 3/20  reward +0.142  kl 0.063 (coef 0.064)  entropy 6.182  1.4 s`: the KL is the one the KL band reads (the
loss-side KL for GRPO, the in-reward KL for KL-PPO), with the coefficient that weighs it; a step whose PPO updates
the KL guard stopped says so.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from recipes.record.records import WriteFailed, replace_from

REWARD_KEYS = ("critic/score/mean", "critic/rewards/mean")
# the KL to the reference policy: loss-side (GRPO, use_kl_loss) or in-reward (KL-PPO, use_kl_in_reward); the default
# of the kl_mean band's keys (conf/monitor/default.yaml), which the recipes pass in
KL_KEYS = ("actor/kl_loss", "actor/reward_kl_penalty")
# the coefficient that weighs each KL: the pack's loss-side controller's (or verl's own) for the loss-side KL, verl's
# in-reward controller's for the in-reward KL. A KL-PPO step also logs the loss-side coefficient, unused there: a KL is
# shown with its own coefficient, never with the first one found.
KL_COEF_KEYS = {
    "actor/kl_loss": ("kl_control/loss_coef", "actor/kl_coef"),
    "actor/reward_kl_penalty": ("actor/reward_kl_penalty_coeff",),
}
ENTROPY_KEYS = ("actor/entropy",)
STEP_TIME_KEYS = ("timing_s/step",)


def first(metrics: dict, keys: tuple[str, ...]):
    for key in keys:
        if key in metrics and metrics[key] is not None:
            return float(metrics[key])
    return None


def kl_with_coef(metrics: dict, kl_keys: tuple[str, ...] = KL_KEYS) -> tuple[float | None, float | None]:
    """(KL, its coefficient) of one step: the first of ``kl_keys`` present, and the coefficient that weighs that KL
    (None for a KL key with no known coefficient)."""
    for key in kl_keys:
        if metrics.get(key) is not None:
            return float(metrics[key]), first(metrics, KL_COEF_KEYS.get(key, ()))
    return None, None


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


def final_metrics(run_dir: Path, kl_keys: tuple[str, ...] = KL_KEYS) -> tuple[float | None, float | None]:
    """(reward, KL) of the last step in ``run_dir/metrics.jsonl``; (None, None) without one."""
    rows = read_metrics(Path(run_dir) / "metrics.jsonl")
    if not rows:
        return None, None
    last = rows[-1][1]
    return first(last, REWARD_KEYS), first(last, kl_keys)


def progress_line(step: int, total: int | None, metrics: dict, kl_keys: tuple[str, ...] = KL_KEYS) -> str:
    parts = [f"step {step}/{total}" if total else f"step {step}"]
    reward, (kl, coef) = first(metrics, REWARD_KEYS), kl_with_coef(metrics, kl_keys)
    if reward is not None:
        parts.append(f"reward {reward:+.3f}")
    if kl is not None:
        parts.append(f"kl {kl:.4f}" + (f" (coef {coef:.4g})" if coef is not None else ""))
    entropy = first(metrics, ENTROPY_KEYS)
    if entropy is not None:
        parts.append(f"entropy {entropy:.3f}")
    seconds = first(metrics, STEP_TIME_KEYS)
    if seconds is not None:
        parts.append(f"{seconds:.1f} s")
    if metrics.get("guard/stopped"):
        parts.append(f"guard: KL {metrics.get('guard/kl', 0):.3g} stopped the updates after "
                     f"{metrics.get('guard/updates', 0):g} of {metrics.get('guard/planned', 0):g}")
    return "  ".join(parts)


class ProgressPrinter:
    """Follows metrics.jsonl in a background thread and prints one line per new step."""

    def __init__(self, path: Path, total_steps: int | None, interval: float = 0.5, out=print,
                 kl_keys: tuple[str, ...] = KL_KEYS):
        self.path, self.total, self.interval, self.out, self.kl_keys = path, total_steps, interval, out, kl_keys
        self._seen = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._seen = len(read_metrics(self.path))  # a resumed run's earlier steps were shown when they ran
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=5)
        self._flush()

    def _flush(self):
        rows = read_metrics(self.path)
        self._seen = min(self._seen, len(rows))  # a rollback moved the rows after its checkpoint aside
        for step, metrics in rows[self._seen:]:
            self.out(progress_line(step, self.total, metrics, self.kl_keys))
        self._seen = len(rows)

    def _run(self):
        while not self._stop.is_set():
            self._flush()
            self._stop.wait(self.interval)  # wakes at once when the run ends (__exit__ joins this thread)


def plot_metrics(metrics_path: Path, png_path: Path, title: str = "", kl_keys: tuple[str, ...] = KL_KEYS,
                 kl_band: tuple[float | None, float | None] = (None, None)) -> Path | None:
    """Reward, the KL to the reference with its band and the controller's target, entropy, and the KL coefficient,
    per step; each axis names the metric it draws. None when there is nothing to draw."""
    rows = read_metrics(metrics_path)
    if not rows:
        return None
    import matplotlib  # lazy: slow to import, and only the end-of-run plot needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: must follow matplotlib.use("Agg") (no display on a training node)

    kl_used = next((k for k in kl_keys if any(k in m for _, m in rows)), None)
    panels = [("reward", REWARD_KEYS), ("KL to the reference", kl_keys), ("entropy", ENTROPY_KEYS),
              ("KL coefficient", KL_COEF_KEYS.get(kl_used, ("kl_control/loss_coef",)))]
    fig, axes = plt.subplots(1, 4, figsize=(15, 3.4))
    for ax, (label, keys) in zip(axes, panels, strict=True):
        points = [(step, first(m, keys)) for step, m in rows if first(m, keys) is not None]
        used = next((k for k in keys if any(k in m for _, m in rows)), keys[0])
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3, label=used)
        ax.set_title(label)
        ax.set_xlabel("step")
        ax.set_ylabel(used, fontsize=8)
        ax.grid(alpha=0.3)
    _draw_kl_band(axes[1], rows, kl_band)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    tmp = Path(png_path).with_name(f".{Path(png_path).name}.tmp-{os.getpid()}.png")
    try:
        fig.savefig(tmp, dpi=110)  # written aside, then renamed: a reader never sees half a picture
    except OSError as error:
        tmp.unlink(missing_ok=True)
        raise WriteFailed(Path(png_path), error) from None
    finally:
        plt.close(fig)
    return replace_from(tmp, png_path)


def _draw_kl_band(ax, rows: list[tuple[int, dict]], band: tuple[float | None, float | None]) -> None:
    low, high = band
    if low is not None or high is not None:
        top = high if high is not None else ax.get_ylim()[1]
        ax.axhspan(low or 0.0, top, color="tab:green", alpha=0.12, label=_band_label(low, high))
    targets = [(step, m["kl_control/target"]) for step, m in rows if m.get("kl_control/target") is not None]
    if targets:
        ax.plot([t[0] for t in targets], [t[1] for t in targets], linestyle="--", color="tab:red", label="target")
    ax.legend(fontsize=7, loc="upper left")


def _band_label(low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return f"band {low:g} .. {high:g}"
    return f"band <= {high:g}" if high is not None else f"band >= {low:g}"
