"""The verl 0.9.1 functions the rest of the pack calls, in one place: what to re-check when verl moves.

The app (compose, validate, finalize, plan, train) reaches verl only through this module and the rooms beside it.
Every import of verl here is deliberately lazy: ``import verl`` costs seconds, and ``--help``, ``--cfg job`` or a
config error must not pay it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import sys
import types
import warnings
from typing import Literal, get_args

from recipes.check.schema import Run, load_section
from recipes.run import gc_threshold
from recipes.verl_ext.early_start import EarlyStart, close_transfer_queue
from recipes.verl_ext.ray_init import pack_ray_init
from recipes.verl_ext.worker_secrets import take_secrets

# verl 0.9.1's own fallback for vLLM's MaxLoRARanks (verl/workers/rollout/vllm_rollout/utils.py,
# get_vllm_max_lora_rank), used where vLLM is not installed; tests/recipes/verl_ext/test_api.py holds them equal
VLLM_LORA_RANKS = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]
_VLLM_ROLLOUT_UTILS = "verl.workers.rollout.vllm_rollout.utils"


def _quietly():
    """verl prints and warns while it inspects a config; the pack reports problems itself."""
    stack = contextlib.ExitStack()
    stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    return stack


def installed_version() -> str:
    """``verl.__version__`` of the verl this process imports (raises whatever importing verl raises)."""
    import verl  # lazy: seconds to import; callers on the CLI's start-up path ask only when they record a run

    return verl.__version__


def roles(cfg) -> tuple[bool, bool]:
    """(uses a critic, uses a reference policy), decided as verl 0.9.1's ``need_critic`` and
    ``need_reference_policy`` decide them (verl/trainer/ppo/utils.py). Written out here because importing that
    module costs a third of a second of pandas and Ray; tests/recipes/verl_ext/test_api.py holds the two equal."""
    critic = cfg.critic.enable
    use_critic = bool(critic) if critic is not None else str(cfg.algorithm.adv_estimator) == "gae"
    use_ref = bool(cfg.algorithm.get("use_kl_in_reward", False) or cfg.actor_rollout_ref.actor.use_kl_loss)
    return use_critic, use_ref


def validate_config(cfg, *, use_critic: bool, use_reference_policy: bool) -> None:
    """verl's own ``validate_config`` and the dataclass conversions its workers do first; raises verl's errors."""
    from verl.utils.config import omega_conf_to_dataclass  # lazy: import verl costs seconds
    from verl.utils.config import validate_config as verl_validate_config  # lazy: import verl costs seconds

    with _quietly(), _lora_rank_check_without_vllm():
        verl_validate_config(config=cfg, use_reference_policy=use_reference_policy, use_critic=use_critic)
        omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
        omega_conf_to_dataclass(cfg.algorithm)


def max_lora_rank(lora_rank: int) -> int:
    """verl's ``get_vllm_max_lora_rank`` on its fallback rank list: the smallest allowed rank >= ``lora_rank``."""
    assert lora_rank > 0, f"lora_rank must be greater than 0, get {lora_rank}"
    ranks = sorted(get_args(VLLM_LORA_RANKS))
    if lora_rank > ranks[-1]:
        raise ValueError(f"lora_rank must be less than or equal to {ranks[-1]}, but got {lora_rank}")
    return next(rank for rank in ranks if lora_rank <= rank)


@contextlib.contextmanager
def _lora_rank_check_without_vllm():
    """verl's validate_config checks a LoRA rank by importing its vLLM rollout utilities, which import vLLM (a
    cluster package): on a machine without vLLM it fails before checking anything. There, the same check runs on
    verl's own fallback rank list; with vLLM installed, verl's function runs unchanged."""
    if importlib.util.find_spec("vllm") is not None or _VLLM_ROLLOUT_UTILS in sys.modules:
        yield
        return
    stand_in = types.ModuleType(_VLLM_ROLLOUT_UTILS)
    stand_in.get_vllm_max_lora_rank = max_lora_rank
    sys.modules[_VLLM_ROLLOUT_UTILS] = stand_in
    try:
        yield
    finally:
        if sys.modules.get(_VLLM_ROLLOUT_UTILS) is stand_in:
            del sys.modules[_VLLM_ROLLOUT_UTILS]


def detected_device(cfg) -> str | None:
    """The ``trainer.device`` verl's ``auto_set_device`` would set on this machine (None: it keeps the config's)."""
    from verl.utils.device import get_platform  # lazy: import verl costs seconds

    detected = get_platform().device_name
    current = cfg.trainer.device
    return detected if detected != "cpu" and current != detected else None


def ppo_ray_runtime_env(cfg) -> dict:
    """verl's ``get_ppo_ray_runtime_env``: the runtime env its ``run_ppo`` gives ray.init (reads os.environ)."""
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env  # lazy: import verl costs seconds

    return dict(get_ppo_ray_runtime_env(cfg))


def shutdown_ray() -> None:
    """End this process's Ray session (verl's run_ppo leaves it up): the next run in this process starts clean."""
    import ray  # lazy: only a training run has started Ray

    if ray.is_initialized():
        close_transfer_queue()
        ray.shutdown()


def gc_setting(cfg) -> list[int] | None:
    """``run.gc_threshold`` of ``cfg`` (a config without ``run``: the pack's default)."""
    node = cfg.get("run")
    return list(gc_threshold.DEFAULT) if node is None else load_section(Run, node, "run").gc_threshold


def run_ppo(cfg, task_runner_class=None) -> None:
    """verl's ``run_ppo`` with its v1 task runner (``trainer.use_v1``) or the legacy one; or a given runner class."""
    from verl.trainer.main_ppo import TaskRunnerV1  # lazy: import verl costs seconds
    from verl.trainer.main_ppo import run_ppo as verl_run_ppo  # lazy: import verl costs seconds

    if task_runner_class is None:
        if cfg.trainer.use_v1:
            task_runner_class = TaskRunnerV1
        else:
            from verl.trainer.main_ppo_v0 import TaskRunner  # lazy: only the legacy trainer (trainer.use_v1=false)

            task_runner_class = TaskRunner
    cfg, secrets = take_secrets(cfg)  # secret env vars reach the workers by Ray's setup hook (ray_init.py)
    threshold = gc_setting(cfg)
    gc_threshold.apply(threshold)  # this driver's; the workers' by the same setup hook
    if cfg.trainer.use_v1 and task_runner_class is TaskRunnerV1:
        # TransferQueue's actors and the hf rollout's servers start while the task runner imports verl and builds
        # its workers (recipes/verl_ext/early_start.py)
        task_runner_class = EarlyStart(task_runner_class, cfg)
    with pack_ray_init(secrets, threshold):
        verl_run_ppo(cfg, task_runner_class=task_runner_class)
