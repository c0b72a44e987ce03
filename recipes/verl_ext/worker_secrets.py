"""Secrets for the Ray workers by a path that logs nothing.

verl 0.9.1's ``run_ppo`` prints ``ray init kwargs: {...}`` with the whole runtime env (into verl.log), and Ray's
runtime-env agent logs every runtime env it creates (``runtime_env_agent.log``, once per worker). A token given as
``ray_kwargs.ray_init.runtime_env.env_vars.HF_TOKEN`` would land in both, in clear.

Here the secret entries (by the pack's one policy, recipes/record/redact.py: a secret name such as HF_TOKEN or
WANDB_API_KEY, or a key-shaped value) leave ``env_vars`` before verl sees the config, and reach each worker through
Ray's ``worker_process_setup_hook``: a function that sets them in the worker's environment before any task or actor
runs there. Ray pickles that function into its GCS store and puts only its key in the runtime env, so neither line
above holds the value. The workers' environment is the same as before (the hook runs at worker start).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping

from omegaconf import DictConfig, OmegaConf, open_dict

from recipes.record.redact import is_secret_name, redact_value

ENV_KEY = "ray_kwargs.ray_init.runtime_env.env_vars"


def is_secret_entry(name: str, value: str) -> bool:
    """A runtime-env variable whose value must not be logged: a secret name (non-empty) or a key-shaped value."""
    text = str(value)
    return (is_secret_name(name) and text != "") or redact_value(text) != text


def take_secrets(cfg: DictConfig) -> tuple[DictConfig, dict[str, str]]:
    """(a copy of ``cfg`` without the secret entries of its runtime env, those entries). ``cfg`` is not changed."""
    env = OmegaConf.select(cfg, ENV_KEY, default=None)
    if not env:
        return cfg, {}
    secrets = {str(k): str(v) for k, v in env.items() if is_secret_entry(str(k), "" if v is None else str(v))}
    if not secrets:
        return cfg, {}
    kept = OmegaConf.create(OmegaConf.to_container(cfg))
    with open_dict(kept):
        node = OmegaConf.select(kept, ENV_KEY)
        for name in secrets:
            del node[name]
    return kept, secrets


def set_environ(secrets: Mapping[str, str]) -> None:
    """The worker setup hook: the secrets into this worker's environment."""
    os.environ.update(secrets)


def setup_hook(secrets: Mapping[str, str], then=None):
    """A named function (Ray exports the hook by its name) that sets ``secrets``, then runs ``then``: a hook given
    before, as a function or as Ray's ``"module.function"`` string."""
    secrets = dict(secrets)

    def set_worker_secrets() -> None:
        set_environ(secrets)
        if callable(then):
            then()
        elif isinstance(then, str) and then:
            module, _, name = then.rpartition(".")
            getattr(importlib.import_module(module), name)()

    return set_worker_secrets

