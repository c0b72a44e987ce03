"""action=train: hand the validated, resolved config to verl 0.9.1's own trainer (its default v1 path).

Before verl starts: the pinned-verl check, the tiny assets (embedded default), the run folder's logging wiring
(metrics.jsonl through verl's `file` logger, TensorBoard and wandb folders, wandb offline without a key). While it
runs: one progress line per step. After: reward / KL / entropy per step as a PNG beside the metrics.
"""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from recipes.monitor import REWARD_KEYS, ProgressPrinter, first, plot_metrics, read_metrics


def run_env(cfg: DictConfig, run_dir: Path) -> dict[str, str]:
    """Environment for every Ray worker of this run: where the loggers write, the plugin loaded loudly."""
    env = {
        "VERL_FILE_LOGGER_PATH": str(run_dir / "metrics.jsonl"),
        "TENSORBOARD_DIR": str(run_dir / "tensorboard"),
        "WANDB_DIR": str(run_dir),
        # verl hides plugin import errors; naming the plugin here makes a refusal (wrong verl) loud in every worker
        "VERL_USE_EXTERNAL_MODULES": "recipes.verl_ext.plugin",
    }
    # stability (recipes.verl_ext.stability): its trainer and KL guard are registered in every Ray worker
    env["VERL_USE_EXTERNAL_MODULES"] += ",recipes.verl_ext.stability.verl_hooks"
    # each actor rank appends what it received per weight sync (the hf rollout's resharder hand-off)
    from recipes.verl_ext.plugin.weight_sync import SYNC_LOG_ENV

    env[SYNC_LOG_ENV] = str(run_dir / "weight_sync.jsonl")
    # TransferQueue asks torch for 8 threads and warns on every put/get where the machine has fewer cores
    import psutil

    env["TQ_NUM_THREADS"] = os.environ.get("TQ_NUM_THREADS", str(min(8, psutil.cpu_count(logical=False) or 1)))
    if "wandb" in list(cfg.trainer.logger) and not os.environ.get("WANDB_API_KEY"):
        env["WANDB_MODE"] = "offline"
    return env


def prepare(cfg: DictConfig) -> Path:
    """Wire the run folder into the config verl receives; returns the run folder."""
    run_dir = Path(cfg.run.dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    loggers = [str(x) for x in cfg.trainer.logger]
    if "file" not in loggers:
        loggers.append("file")  # metrics.jsonl always
    cfg.trainer.logger = loggers
    env_vars = OmegaConf.select(cfg, "ray_kwargs.ray_init.runtime_env.env_vars") or {}
    merged = {**OmegaConf.to_container(OmegaConf.create(env_vars)), **run_env(cfg, run_dir)}
    OmegaConf.update(cfg, "ray_kwargs.ray_init.runtime_env.env_vars", merged, merge=False, force_add=True)
    for key, value in run_env(cfg, run_dir).items():
        os.environ.setdefault(key, value)  # the driver's own trackers (and Ray's local workers) see them too
    return run_dir


def run_training(checked) -> None:
    from recipes.verl_ext.plugin import require_supported_verl

    require_supported_verl()
    cfg = checked.cfg
    if cfg.model.name == "tiny" or cfg.task.get("name") == "tiny":
        from recipes.verl_ext.demo import ensure_tiny_assets

        ensure_tiny_assets()
    run_dir = prepare(cfg)
    # the env every Ray worker gets and its conflicts with verl's forced values, to nccl_env.json (recipes/nccl_env.py)
    from recipes.nccl_env import record_for_training

    for line in record_for_training(cfg, run_dir):
        print(line)

    from verl.utils.device import auto_set_device

    auto_set_device(cfg)
    total = OmegaConf.select(cfg, "trainer.total_training_steps")
    metrics_path = run_dir / "metrics.jsonl"
    print(f"training: {checked.cfg.run.name} in {run_dir} (metrics.jsonl, checkpoints/, curves.png)", flush=True)
    with ProgressPrinter(metrics_path, total):
        # stability (recipes.verl_ext.stability): monitoring bands; under stability=auto the rollback supervisor
        from recipes.verl_ext.stability import supervise

        supervise(cfg, run_dir, run_verl, metrics_path)
    summarize(metrics_path, run_dir, title=f"{cfg.run.name}: {cfg.model.name}, {cfg.strategy.name}")


def run_verl(cfg: DictConfig) -> None:
    """verl's own trainer on the config (module level: the rollback supervisor runs it in a child process)."""
    from verl.trainer.main_ppo import TaskRunnerV1, run_ppo

    if cfg.trainer.use_v1:
        run_ppo(cfg, task_runner_class=TaskRunnerV1)
    else:
        from verl.trainer.main_ppo_v0 import TaskRunner

        run_ppo(cfg, task_runner_class=TaskRunner)


def summarize(metrics_path: Path, run_dir: Path, title: str = "") -> None:
    rows = read_metrics(metrics_path)
    png = plot_metrics(metrics_path, run_dir / "curves.png", title=title)
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
    from recipes.verl_ext.plugin.weight_sync import read_sync_log

    records = read_sync_log(path)
    if not records:
        return None
    syncs = len({r["global_steps"] for r in records})
    per_rank: dict[int, list[dict]] = {}
    for record in records:
        per_rank.setdefault(record["rank"], []).append(record)
    last = [per_rank[rank][-1] for rank in sorted(per_rank)]
    schemes = sorted({r["scheme"] for r in last})
    if schemes != ["gather_to_feeders"]:
        reason = next((r["fallback_reason"] for r in last if r.get("fallback_reason")), "")
        return f"weight sync: verl's full_tensor() path on every rank ({reason})" if reason else None
    received = ", ".join(f"rank {r['rank']} {_mib(r['received_bytes'])}" for r in last)
    verl = ", ".join(f"{_mib(r['full_tensor_bytes'])}" for r in last)
    return (
        f"weight sync ({syncs} syncs, hybrid_engine resharder, weight_sync.jsonl): per sync {received} received "
        f"(planned {', '.join(_mib(r['planned_bytes']) for r in last)}); verl's full_tensor() path: {verl}"
    )


def _mib(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 2**20:.2f} MiB"
