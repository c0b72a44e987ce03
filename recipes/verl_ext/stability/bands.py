"""Monitoring bands: each watched quantity has a band; a step outside it logs one warning line and counts.

The quantities (``conf/monitor/default.yaml``, seeded from the tuning notes in shared/seed): KL mean 0.05-0.15, grad
norm below 1.0, an entropy floor, weight-sync time per step, and the share of step time spent in communication. A
band names the verl metrics it reads (the first present wins) or a ratio of two (``of``), a ``low`` and/or ``high``
bound, and which side means instability (``unstable``: the side that counts toward a rollback under
``stability=auto``; a KL *below* its band is worth a warning, not a rollback).

Evaluated in the driver from the run folder's metrics.jsonl (:class:`BandMonitor`, a thread beside the progress
printer; summary table printed and written to ``bands.json`` / ``bands.txt`` at the end) and, for the rollback rule,
inside the trainer on each step's metrics (:func:`evaluate`). Pure Python.
"""

from __future__ import annotations

import json
import math
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

from recipes.check.schema import Monitor, load_section
from recipes.record.records import write_atomic
from recipes.run.monitor import read_metrics


@dataclass(kw_only=True, slots=True)
class Band:
    name: str
    """the quantity, e.g. ``grad_norm``"""
    keys: tuple[str, ...]
    """verl metrics read (first present); with ``of``: summed"""
    of: str | None = None
    """denominator metric: the value is sum(keys) / of (a share of the step time)"""
    low: float | None = None
    """lower bound (inclusive); None: none"""
    high: float | None = None
    """upper bound (inclusive); None: none"""
    unstable: str | None = None
    """low | high | None: the side whose violation counts toward a rollback"""
    unit: str = ""

    def value(self, metrics: dict) -> float | None:
        present = [float(metrics[k]) for k in self.keys if metrics.get(k) is not None]
        if not present:
            return None
        if self.of is None:
            return present[0]
        total = metrics.get(self.of)
        if not total:
            return None
        return sum(present) / float(total)

    def describe_range(self) -> str:
        if self.low is not None and self.high is not None:
            return f"{self.low:g} .. {self.high:g}"
        if self.high is not None:
            return f"<= {self.high:g}"
        if self.low is not None:
            return f">= {self.low:g}"
        return "any"


@dataclass(kw_only=True, slots=True)
class Violation:
    band: str
    step: int
    value: float
    side: str
    """low | high | nan"""
    bound: float | None
    unstable: bool

    def describe(self) -> str:
        if self.side == "nan":
            return f"{self.band} is {self.value}"
        word = "below" if self.side == "low" else "above"
        return f"{self.band} {self.value:.4g} {word} {self.bound:g}"


def bands_from_config(cfg) -> list[Band]:
    """The ``monitor.bands`` map of the config; [] when the monitor is off or absent."""
    monitor = load_section(Monitor, cfg.get("monitor"), "monitor")  # typed; a bad value: SchemaError naming it
    if not monitor.enabled:
        return []
    return [Band(name=name, keys=tuple(spec.keys), of=spec.of, low=spec.low, high=spec.high,
                 unstable=spec.unstable, unit=spec.unit) for name, spec in monitor.bands.items()]


def evaluate(metrics: dict, bands: list[Band], step: int = 0) -> list[Violation]:
    """The bands one step's metrics leave; a band whose metrics are absent is not judged."""
    out = []
    for band in bands:
        value = band.value(metrics)
        if value is None:
            continue
        if not math.isfinite(value):
            out.append(Violation(band=band.name, step=step, value=value, side="nan", bound=None, unstable=True))
        elif band.low is not None and value < band.low:
            out.append(Violation(band=band.name, step=step, value=value, side="low", bound=band.low,
                                 unstable=band.unstable == "low"))
        elif band.high is not None and value > band.high:
            out.append(Violation(band=band.name, step=step, value=value, side="high", bound=band.high,
                                 unstable=band.unstable == "high"))
    return out


class RollbackRule:
    """``stability=auto``'s band rule: ``limit`` steps in a row outside a band on its ``unstable`` side (a NaN
    counts); a band with ``unstable: null`` only warns. ``limit`` 0: never."""

    def __init__(self, bands: list[Band], limit: int):
        self.bands, self.limit, self.streak = bands, limit, 0

    def check(self, metrics: dict, step: int) -> str | None:
        """After one step: None, or why the run must roll back."""
        if self.limit <= 0:
            return None
        unstable = [v for v in evaluate(metrics, self.bands, step) if v.unstable]
        self.streak = self.streak + 1 if unstable else 0
        if self.streak < self.limit:
            return None
        return (f"{self.streak} steps in a row outside a band at step {step}: "
                + "; ".join(v.describe() for v in unstable))


@dataclass(kw_only=True, slots=True)
class BandStats:
    band: Band
    values: list[float] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)

    def row(self) -> dict:
        finite = [v for v in self.values if math.isfinite(v)]
        return {
            "band": self.band.name,
            "range": self.band.describe_range(),
            "unit": self.band.unit,
            "steps": len(self.values),
            "violations": len(self.violations),
            "low": sum(v.side == "low" for v in self.violations),
            "high": sum(v.side == "high" for v in self.violations),
            "min": min(finite) if finite else None,
            "mean": sum(finite) / len(finite) if finite else None,
            "max": max(finite) if finite else None,
            "first_violation_step": self.violations[0].step if self.violations else None,
        }


class BandTally:
    """Per-band values and violations over a run, fed one step at a time."""

    def __init__(self, bands: list[Band]):
        self.stats = {b.name: BandStats(band=b) for b in bands}

    def add(self, step: int, metrics: dict) -> list[Violation]:
        for stats in self.stats.values():
            value = stats.band.value(metrics)
            if value is not None:
                stats.values.append(value)
        found = evaluate(metrics, [s.band for s in self.stats.values()], step=step)
        for v in found:
            self.stats[v.band].violations.append(v)
        return found

    def rows(self) -> list[dict]:
        return [s.row() for s in self.stats.values()]

    def table(self) -> str:
        def num(x):
            return "-" if x is None else f"{x:.4g}"

        lines = [f"{'band':<14} {'range':<14} {'steps':>5} {'out':>4} {'low':>4} {'high':>4} "
                 f"{'min':>9} {'mean':>9} {'max':>9}"]
        for r in self.rows():
            lines.append(f"{r['band']:<14} {r['range']:<14} {r['steps']:>5} {r['violations']:>4} {r['low']:>4} "
                         f"{r['high']:>4} {num(r['min']):>9} {num(r['mean']):>9} {num(r['max']):>9}")
        return "\n".join(lines)

    def write(self, run_dir: Path) -> tuple[Path, Path]:
        bands = {name: asdict(s.band) for name, s in self.stats.items()}
        payload = {"bands": bands, "summary": self.rows(),
                   "violations": [asdict(v) for s in self.stats.values() for v in s.violations]}
        json_path, txt_path = Path(run_dir) / "bands.json", Path(run_dir) / "bands.txt"
        write_atomic(json_path, json.dumps(payload, indent=1, default=str))
        write_atomic(txt_path, self.table() + "\n")
        return json_path, txt_path


class BandMonitor:
    """Follows metrics.jsonl in a driver thread: a warning line for the first violation of each band and side (the
    later ones are counted, not printed); the summary table at exit."""

    def __init__(self, metrics_path: Path, bands: list[Band], run_dir: Path, interval: float = 0.5, out=print):
        self.path, self.run_dir, self.interval, self.out = Path(metrics_path), Path(run_dir), interval, out
        self.tally = BandTally(bands)
        self._seen = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        if self.tally.stats:
            self._flush(quiet=True)  # a resumed run's earlier steps: counted in the summary, warned about before
            self._thread.start()
        return self

    def __exit__(self, *exc):
        if not self.tally.stats:
            return
        self._stop.set()
        self._thread.join(timeout=5)
        self._flush()
        self.out("monitoring bands (bands.txt, bands.json):\n" + self.tally.table())
        self.tally.write(self.run_dir)

    def _flush(self, quiet: bool = False):
        rows = read_metrics(self.path)
        if len(rows) < self._seen:  # a rollback moved the rows after its checkpoint aside: count the rest again
            self.tally, self._seen = BandTally([st.band for st in self.tally.stats.values()]), 0
            quiet = True
        for step, metrics in rows[self._seen:]:
            for v in self.tally.add(step, metrics):
                if quiet:
                    continue
                stats = self.tally.stats[v.band]
                if sum(1 for seen in stats.violations if seen.side == v.side) == 1:
                    self.out(f"band warning: step {step} {v.describe()} (band {stats.band.describe_range()}; "
                             f"later steps outside it are counted in the summary)")
        self._seen = len(rows)

    def _run(self):
        while not self._stop.is_set():
            self._flush()
            self._stop.wait(self.interval)  # wakes at once when the run ends (__exit__ joins this thread)



