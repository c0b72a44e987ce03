"""The reproducibility bundle every run folder gets, for every action: ``<run folder>/repro/``.

- ``../resolved_config.yaml`` (beside the folder): the config verl's trainer receives, secrets redacted;
- ``rerun.sh``: the command line that makes this run again, from the folder it was launched in;
- ``bundle.json``: command line, working folder, host, versions (pack, verl, torch, ray, hydra, transformers, and
  vllm / sglang / megatron-core when installed, CUDA and NCCL when CUDA is present), git SHA, branch and dirty flag
  of the launch folder's repository (and of the pack's checkout when that is another one), the environment with
  secrets redacted (the policy of recipes/record/redact.py: WANDB_API_KEY, HF_TOKEN, *_PASSWORD, key-shaped values and
  passwords inside URLs);
- ``../nccl_env.json``: the variables every Ray worker gets, where each comes from, and their conflicts
  (recipes.cluster.nccl_env).
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import socket
import sys
from collections.abc import Mapping
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from recipes.cluster.nccl_env import WorkerEnv, record_lines
from recipes.cluster.nccl_env import write_record as write_nccl_record
from recipes.compose.confdir import entry_command
from recipes.record import yamlio
from recipes.record.gitstate import git_state
from recipes.record.redact import redact_arg, redact_config, redact_env

BUNDLE_DIR = "repro"
RESOLVED_CONFIG = "resolved_config.yaml"
PACKAGES = ("klppo-recipes", "verl", "torch", "ray", "hydra-core", "omegaconf", "transformers", "vllm", "sglang",
            "megatron-core", "flash-attn", "TransferQueue", "accelerate", "numpy")


def versions() -> dict:
    """Versions of the pack and the stack it runs on; CUDA, NCCL and the GPUs when CUDA is present."""
    out: dict = {"python": platform.python_version(), "platform": platform.platform()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    try:
        import torch  # lazy: seconds to import, and only a run's record needs it (the CLI loads this module at start)

        out["torch"] = torch.__version__
        out["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            version = torch.cuda.nccl.version()
            out["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
            out["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        else:
            out["nccl"] = None
    except Exception as error:  # noqa: BLE001 - a broken torch must not stop the record
        out["torch_error"] = str(error).splitlines()[0]
    return out


def _hydra_overrides() -> list[str] | None:
    try:
        if HydraConfig.initialized():
            return list(HydraConfig.get().overrides.task)
    except Exception:  # noqa: BLE001
        return None
    return None


def command_line(recipe: str | None, overrides: list[str] | None = None) -> list[str]:
    """The argv that makes this run again: the recipe's entry point and this job's overrides (secrets hidden)."""
    if overrides is None:
        overrides = _hydra_overrides()
    if overrides is None:
        overrides = [a for a in sys.argv[1:] if a not in ("-m", "--multirun")]
    entry = entry_command(recipe) if recipe else [sys.executable, *sys.argv[:1]]
    return [*entry, *(redact_arg(a) for a in overrides)]


def collect(cfg: DictConfig, recipe: str | None = None, overrides: list[str] | None = None,
            cwd: str | os.PathLike | None = None, environ: Mapping[str, str] | None = None) -> dict:
    """Everything the bundle records, as a JSON-ready dict."""
    cwd = Path(cwd or os.getcwd()).resolve()
    environ = os.environ if environ is None else environ
    data = {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "recipe": recipe,
        "action": OmegaConf.select(cfg, "action", default=None),
        "command": command_line(recipe, overrides),
        "argv": [redact_arg(a) for a in sys.argv],
        "cwd": str(cwd),
        "host": socket.gethostname(),
        "versions": versions(),
        "git": git_state(cwd),
        "env": redact_env(environ),
    }
    pack_root = Path(__file__).resolve().parents[2]
    pack_git = git_state(pack_root) if (pack_root / ".git").exists() else None
    if pack_git and (data["git"] is None or pack_git["root"] != data["git"]["root"]):
        data["pack_git"] = pack_git
    return data


def save_config(cfg: DictConfig, path: Path) -> None:
    """The config as YAML, resolved, without Hydra's own node, secrets redacted (recipes/record/redact.py)."""
    container = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    container = redact_config({k: v for k, v in container.items() if k != "hydra"})
    path.write_text(yamlio.dump(container))
    os.chmod(path, 0o644)


def write_record(run_dir: str | os.PathLike, cfg: DictConfig, workers: WorkerEnv, recipe: str | None = None,
                 overrides: list[str] | None = None) -> list[str]:
    """Write the run's record, once: ``resolved_config.yaml`` (the config verl receives), ``repro/bundle.json``,
    ``repro/rerun.sh`` and ``nccl_env.json``. Returns the lines to show: NCCL conflicts, a dirty checkout."""
    run_dir = Path(run_dir)
    folder = run_dir / BUNDLE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir / RESOLVED_CONFIG)
    nccl_path = write_nccl_record(run_dir, workers)
    data = collect(cfg, recipe, overrides)
    data["config"] = f"../{RESOLVED_CONFIG}"
    data["nccl_env"] = {"file": f"../{nccl_path.name}", "conflicts": workers.conflicts}
    (folder / "bundle.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    rerun = folder / "rerun.sh"
    rerun.write_text("#!/usr/bin/env bash\n# the command that made this run, from the folder it was launched in\n"
                     f"cd {shlex.quote(data['cwd'])} && {shlex.join(data['command'])} \"$@\"\n")
    rerun.chmod(0o755)
    lines = record_lines(workers, nccl_path)
    git = data.get("git") or {}
    if git.get("dirty"):
        lines.append(f"note: the launch folder's repository has uncommitted changes (git {str(git.get('sha'))[:12]}, "
                     f"dirty); {BUNDLE_DIR}/bundle.json lists them")
    return lines
