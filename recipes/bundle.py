"""The reproducibility bundle every run folder gets, for every action: ``<run folder>/repro/``.

- ``config.yaml``: the resolved config (secret-looking keys and values redacted);
- ``rerun.sh``: the command line that makes this run again, from the folder it was launched in;
- ``bundle.json``: command line, working folder, host, versions (pack, verl, torch, ray, hydra, transformers, and
  vllm / sglang / megatron-core when installed, CUDA and NCCL when CUDA is present), git SHA, branch and dirty flag
  of the launch folder's repository (and of the pack's checkout when that is another one), the environment with
  secrets redacted (any name with key, token, secret, password, credential or auth in it: WANDB_API_KEY, HF_TOKEN,
  *_TOKEN, ...; token-shaped values and passwords inside URLs too);
- ``../nccl_env.json``: the variables every Ray worker gets, where each comes from, and their conflicts
  (recipes.nccl_env).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import socket
import subprocess
import sys
from collections.abc import Mapping
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

BUNDLE_DIR = "repro"
REDACTED = "***"
# a name is secret when one of its words contains one of these (WANDB_API_KEY, HF_TOKEN, AWS_SECRET_ACCESS_KEY, ...)
_SECRET_PARTS = ("KEY", "TOKEN", "SECRET", "PASSW", "CREDENTIAL", "PRIVATE", "COOKIE", "SIGNATURE")
# ... or is one of these words (SSH_AUTH_SOCK, BASIC_AUTH, NPM_PASS); AUTHOR and PWD stay visible
_SECRET_WORDS = {"AUTH", "OAUTH", "PASS", "PAT", "SAS", "JWT", "BEARER"}
# values that are tokens whatever their name (Hugging Face, GitHub, OpenAI-style, Slack, AWS access key, GitLab)
_TOKEN_VALUE = re.compile(
    r"\b(hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|sk-[A-Za-z0-9_-]{20,}|"
    r"xox[abprs]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}|glpat-[A-Za-z0-9_-]{20,})"
)
_URL_PASSWORD = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^/\s:@]+):(?P<password>[^/\s@]+)@")
PACKAGES = ("klppo-recipes", "verl", "torch", "ray", "hydra-core", "omegaconf", "transformers", "vllm", "sglang",
            "megatron-core", "flash-attn", "TransferQueue", "accelerate", "numpy")


def is_secret_name(name: str) -> bool:
    """True for WANDB_API_KEY, HF_TOKEN, GITHUB_TOKEN, AWS_SECRET_ACCESS_KEY, DB_PASSWORD, apiKey, logger.wandb.key."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", str(name))
    words = [w for w in re.split(r"[^A-Za-z0-9]+", spaced.upper()) if w]
    return any(part in word for word in words for part in _SECRET_PARTS) or any(w in _SECRET_WORDS for w in words)


def redact_value(value: str) -> str:
    """A value with token-shaped substrings and URL passwords replaced."""
    text = _URL_PASSWORD.sub(lambda m: f"{m.group('scheme')}{m.group('user')}:{REDACTED}@", str(value))
    return _TOKEN_VALUE.sub(REDACTED, text)


def redact_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment with every secret-looking name's value, and token-shaped values, replaced by ***."""
    return {k: (REDACTED if is_secret_name(k) and v != "" else redact_value(v)) for k, v in sorted(environ.items())}


def redact_config(node):
    """A plain container with secret-looking keys' scalar values and token-shaped strings replaced."""
    if isinstance(node, dict):
        return {k: (REDACTED if is_secret_name(str(k)) and v not in (None, "") and not isinstance(v, (dict, list, bool))
                    else redact_config(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [redact_config(v) for v in node]
    if isinstance(node, str):
        return redact_value(node)
    return node


def redact_arg(arg: str) -> str:
    """A command-line argument with a secret value hidden: ``+logger.wandb.api_key=abc`` -> ``...api_key=***``."""
    if "=" in arg and not arg.startswith("-"):
        key, value = arg.split("=", 1)
        leaf = key.lstrip("+~").rsplit(".", 1)[-1].rsplit("/", 1)[-1]
        if is_secret_name(leaf) and value:
            return f"{key}={REDACTED}"
    return redact_value(arg)


def versions() -> dict:
    """Versions of the pack and the stack it runs on; CUDA, NCCL and the GPUs when CUDA is present."""
    out: dict = {"python": platform.python_version(), "platform": platform.platform()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    try:
        import torch

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


def _git(folder: Path, *args: str) -> str | None:
    try:
        proc = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.rstrip() if proc.returncode == 0 else None


def git_state(folder: str | os.PathLike) -> dict | None:
    """SHA, branch, dirty flag (tracked files changed) and changed paths of the repository holding ``folder``."""
    folder = Path(folder)
    top = _git(folder, "rev-parse", "--show-toplevel")
    if not top:
        return None
    status = _git(folder, "status", "--porcelain", "--untracked-files=no") or ""
    changed = [line[3:] for line in status.splitlines() if line.strip()]
    remote = _git(folder, "config", "--get", "remote.origin.url")
    return {
        "root": top,
        "sha": _git(folder, "rev-parse", "HEAD"),
        "branch": _git(folder, "rev-parse", "--abbrev-ref", "HEAD"),
        "dirty": bool(changed),
        "changed": changed[:200],
        "remote": redact_value(remote) if remote else None,
    }


def _hydra_overrides() -> list[str] | None:
    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            return list(HydraConfig.get().overrides.task)
    except Exception:  # noqa: BLE001
        return None
    return None


def command_line(recipe: str | None, overrides: list[str] | None = None) -> list[str]:
    """The argv that makes this run again: the recipe's entry point and this job's overrides (secrets hidden)."""
    from recipes.copy import entry_command

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
    pack_root = Path(__file__).resolve().parent.parent
    pack_git = git_state(pack_root) if (pack_root / ".git").exists() else None
    if pack_git and (data["git"] is None or pack_git["root"] != data["git"]["root"]):
        data["pack_git"] = pack_git
    return data


def write_bundle(run_dir: str | os.PathLike, cfg: DictConfig, recipe: str | None = None,
                 overrides: list[str] | None = None) -> Path:
    """Write ``run_dir/repro/{bundle.json,config.yaml,rerun.sh}`` and ``run_dir/nccl_env.json``; the bundle folder."""
    from recipes.nccl_env import worker_env, write_record

    folder = Path(run_dir) / BUNDLE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    data = collect(cfg, recipe, overrides)
    record = worker_env(cfg)
    write_record(run_dir, record)
    data["nccl_env"] = {"file": "../nccl_env.json", "conflicts": record.conflicts}
    (folder / "bundle.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    container = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    container = redact_config({k: v for k, v in container.items() if k != "hydra"})
    (folder / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(container)))
    rerun = folder / "rerun.sh"
    rerun.write_text("#!/usr/bin/env bash\n# the command that made this run, from the folder it was launched in\n"
                     f"cd {shlex.quote(data['cwd'])} && {shlex.join(data['command'])} \"$@\"\n")
    rerun.chmod(0o755)
    return folder


def write_for_job(cfg: DictConfig, run_dir: str | os.PathLike) -> list[str]:
    """The launch flow's call, for every action: write the bundle of this Hydra job; its NCCL conflicts as warnings.

    Never fails the run: a bundle that cannot be written is a warning.
    """
    from hydra.core.hydra_config import HydraConfig

    recipe = HydraConfig.get().job.config_name if HydraConfig.initialized() else None
    try:
        folder = write_bundle(run_dir, cfg, recipe)
        data = json.loads((folder / "bundle.json").read_text())
    except Exception as error:  # noqa: BLE001 - the record must not stop the run
        return [f"warning: reproducibility bundle not written: {' '.join(str(error).split())[:200]}"]
    lines = [f"warning: nccl env: {line}" for line in data.get("nccl_env", {}).get("conflicts", [])]
    git = data.get("git") or {}
    if git.get("dirty"):
        lines.append(f"note: the launch folder's repository has uncommitted changes (git {str(git.get('sha'))[:12]}, "
                     f"dirty); {BUNDLE_DIR}/bundle.json lists them")
    return lines
