"""action=train: hand the finalized config to verl 0.9.1's own trainer (its default v1 path), unchanged.

Before verl starts: the pinned-verl check, the tiny assets (embedded default), the driver's own trackers pointed at
the run folder. While it runs: one progress line per step on the terminal; verl's and Ray's own output in
``verl.log`` in the run folder (``run.verbose=true`` also shows it live). After: reward / KL / entropy per step as a
PNG beside the metrics, and Ray shut down, so the next run of a sweep in this process starts clean.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from recipes.compose.confdir import entry_command
from recipes.record.records import WriteFailed, disk_full_line
from recipes.run.checkpoints import step_of
from recipes.run.console import LOG_NAME, verl_output_to_log
from recipes.run.finalize import FinalRun
from recipes.run.interrupt import EXIT_CODE, interrupted_lines, lost_worker_line, sigterm_as_interrupt
from recipes.run.monitor import KL_KEYS, REWARD_KEYS, ProgressPrinter, first, plot_metrics, read_metrics
from recipes.run.resume import SUPERSEDED, keep_metrics_up_to
from recipes.verl_ext import api as verl
from recipes.verl_ext.demo import ensure_tiny_assets
from recipes.verl_ext.plugin.patches import require_supported_verl
from recipes.verl_ext.plugin.vllm_sync import SCHEME as VLLM_SCHEME
from recipes.verl_ext.plugin.weight_sync import read_sync_log
from recipes.verl_ext.stability import supervise
from recipes.verl_ext.stability.bands import bands_from_config


def run_training(final: FinalRun) -> None:
    require_supported_verl()
    cfg = final.cfg
    if cfg.model.name == "tiny" or cfg.task.get("name") == "tiny":
        ensure_tiny_assets()
    # the driver's own trackers (and Ray's local workers) see the run's env too; the next job of a sweep run in
    # this process gets its own
    with job_environ(final.env):
        train_and_summarize(final)


@contextlib.contextmanager
def job_environ(env: dict[str, str]):
    """``env`` set where this process has no value of its own, for the block; the environment restored after."""
    saved = dict(os.environ)
    for key, value in env.items():
        os.environ.setdefault(key, value)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def train_and_summarize(final: FinalRun) -> None:
    """verl's trainer under the pack's monitors, its output in the run folder's log; the end-of-run summary."""
    cfg = final.cfg
    run_dir = final.run_dir
    metrics_path = run_dir / "metrics.jsonl"
    total = OmegaConf.select(cfg, "trainer.total_training_steps")
    verbose = bool(OmegaConf.select(cfg, "run.verbose", default=False))
    print(f"training: {cfg.run.name} in {run_dir} (metrics.jsonl, checkpoints/, curves.png; verl's output in "
          f"{LOG_NAME})", flush=True)
    kl_band = next((b for b in bands_from_config(cfg) if b.name == "kl_mean"), None)
    kl_keys = kl_band.keys if kl_band is not None else KL_KEYS
    resumed_lines(cfg, metrics_path)
    try:
        with sigterm_as_interrupt(metrics_path), verl_output_to_log(run_dir / LOG_NAME, verbose) as term:
            with ProgressPrinter(metrics_path, total, out=term.say, kl_keys=kl_keys):
                # monitoring bands; under stability=auto the rollback supervisor (recipes/verl_ext/stability)
                supervise(writable(cfg), run_dir, run_verl, metrics_path, out=term.say)
    except KeyboardInterrupt:
        checkpoints = Path(str(cfg.trainer.default_local_dir))
        for line in interrupted_lines(run_dir, checkpoints, rerun_command(cfg)):
            print(line, file=sys.stderr)
        sys.exit(EXIT_CODE)
    except Exception as error:
        full = disk_full_line(error, checkpoints=Path(str(cfg.trainer.default_local_dir)))
        if full:  # one line naming the path; every complete checkpoint stays
            print(full, file=sys.stderr)
            sys.exit(1)
        lost = None if OmegaConf.select(cfg, "stability.mode") == "auto" else lost_worker_line(
            "".join(traceback.format_exception(error)), run_dir, Path(str(cfg.trainer.default_local_dir)),
            rerun_command(cfg))
        if lost:  # a worker died (stability=auto would have restarted): the cause and the way on, no traceback
            print(lost, file=sys.stderr)
            sys.exit(1)
        if not verbose:  # what verl said last is in the log, not on the terminal
            print(f"training failed; the last lines of {run_dir / LOG_NAME}:\n{log_tail(run_dir / LOG_NAME)}",
                  file=sys.stderr)
        raise
    try:
        summarize(metrics_path, run_dir, title=f"{cfg.run.name}: {cfg.model.name}, {cfg.strategy.name}",
                  kl_keys=kl_keys, kl_band=(kl_band.low, kl_band.high) if kl_band is not None else (None, None))
    except WriteFailed as error:
        print(error, file=sys.stderr)
        sys.exit(1)


def rerun_command(cfg: DictConfig) -> list[str]:
    """The command line of this run, as Hydra received it (the embedded defaults it added included)."""
    overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    return [*entry_command(str(cfg.run.name)), *overrides]


def resumed_lines(cfg: DictConfig, metrics_path: Path) -> None:
    """Under run.resume: the rows of steps after the checkpoint move aside (those steps run again), and one line
    says where the run goes on from."""
    record_dir = OmegaConf.select(cfg, "run.record_dir")
    if not record_dir:
        return
    checkpoint = Path(str(cfg.trainer.resume_from_path))
    step = step_of(checkpoint) or 0
    kept = keep_metrics_up_to(metrics_path, step, Path(str(record_dir)) / SUPERSEDED)
    print(f"resuming after step {step} from {checkpoint} ({kept} steps in metrics.jsonl kept; this launch's "
          f"record: {record_dir})", flush=True)


def log_tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log, indented."""
    text = path.read_text(errors="replace") if path.is_file() else ""
    return "\n".join(f"  {line}" for line in text.splitlines()[-lines:])


def writable(cfg: DictConfig) -> DictConfig:
    """An equal, writable copy: verl's TaskRunner and the rollback supervisor may add keys to the config they get."""
    return OmegaConf.create(OmegaConf.to_container(cfg))


def run_verl(cfg: DictConfig) -> None:
    """verl's own trainer on the config (module level: the rollback supervisor runs it in a child process)."""
    try:
        verl.run_ppo(cfg)
    finally:
        verl.shutdown_ray()


def summarize(metrics_path: Path, run_dir: Path, title: str = "", kl_keys: tuple[str, ...] = KL_KEYS,
              kl_band: tuple[float | None, float | None] = (None, None)) -> None:
    rows = read_metrics(metrics_path)
    png = plot_metrics(metrics_path, run_dir / "curves.png", title=title, kl_keys=kl_keys, kl_band=kl_band)
    rewards = [first(m, REWARD_KEYS) for _, m in rows]
    rewards = [r for r in rewards if r is not None]
    if len(rewards) >= 4:
        k = max(1, len(rewards) // 4)
        head, tail = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
        print(f"mean reward: first {k} steps {head:+.3f} -> last {k} steps {tail:+.3f}")
    line = weight_sync_summary(run_dir / "weight_sync.jsonl")
    if line:
        print(line)
    if png:
        print(f"curves: {png}")


def weight_sync_summary(path: Path) -> str | None:
    """One line: bytes each rank received per weight sync, beside what verl's ``full_tensor()`` path receives."""
    records = read_sync_log(path)
    if not records:
        return None
    syncs = len({r["global_steps"] for r in records})
    per_rank: dict[int, list[dict]] = {}
    for record in records:
        per_rank.setdefault(record["rank"], []).append(record)
    last = [per_rank[rank][-1] for rank in sorted(per_rank)]
    schemes = sorted({r["scheme"] for r in last})
    if schemes == [VLLM_SCHEME]:
        return _vllm_sync_line(records)
    if schemes != ["gather_to_feeders"]:
        reason = next((r["fallback_reason"] for r in last if r.get("fallback_reason")), "")
        return f"weight sync: verl's full_tensor() path on every rank ({reason})" if reason else None
    received = ", ".join(f"rank {r['rank']} {_mib(r['received_bytes'])}" for r in last)
    verl_path = ", ".join(f"{_mib(r['full_tensor_bytes'])}" for r in last)
    return (
        f"weight sync ({syncs} syncs, hybrid_engine resharder, weight_sync.jsonl): per sync {received} received "
        f"(planned {', '.join(_mib(r['planned_bytes']) for r in last)}); verl's full_tensor() path: {verl_path}"
    )


def _vllm_sync_line(records: list[dict]) -> str:
    """The sync into vLLM in one line: its median time, the bytes streamed, how many syncs the checksum held and
    what the check took."""
    feeders = [r for r in records if r.get("feeder")] or records
    seconds = sorted(r["seconds"] for r in feeders)
    checks = [r.get("extra", {}).get("checksum", {}) for r in feeders]
    matched = sum(1 for c in checks if c.get("match") is True)
    unchecked = next((c["checked"] for c in checks if c.get("checked", "").startswith("no")), None)
    check = f"checksum matched in {matched} of {len(feeders)}" + (f" ({unchecked})" if unchecked else "")
    check_seconds = sorted(c["check_seconds"] for c in checks if "check_seconds" in c)
    if check_seconds:  # the check's own time, beside the sync's: both sides' checksums and the read-back
        check += f", the check {check_seconds[len(check_seconds) // 2]:.3f} s a sync (median)"
    return (
        f"weight sync into vLLM ({len(feeders)} syncs, verl's CUDA-IPC path, weight_sync.jsonl): median "
        f"{seconds[len(seconds) // 2]:.3f} s for {_size(feeders[-1]['model_bytes'])}; {check}"
    )


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.2f} MiB"


def _mib(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 2**20:.2f} MiB"
