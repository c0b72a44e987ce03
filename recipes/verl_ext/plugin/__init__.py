"""verl plugin of the pack: run verl's real trainer on the CPU (the embedded default) with an ``hf`` rollout.

verl imports this package in every process that imports verl (entry-point group ``verl.plugins``). Importing it:

1. checks that verl is the pinned version (:func:`require_supported_verl`; entry points call it too, because verl
   hides plugin import errors);
2. makes verl's task runners print the config through the pack's redaction (:func:`.patches.apply_record_patches`);
   registers the ``hf`` rollout backend (:mod:`.hf_rollout`) in verl's ``RolloutReplicaRegistry`` and worker-side
   rollout table: additive, other backends are untouched;
3. only where the CPU platform is wanted (a torch build without accelerator, or ``VERL_PLATFORM=cpu``): registers
   :class:`~.platform.PlatformCPU` in verl's ``PlatformRegistry``, selects it (``VERL_PLATFORM=cpu``, inherited by
   Ray workers), turns off Ray's pre-started idle workers (``RAY_prestart_worker_first_driver=0``: one per
   logical CPU, seconds each on 2 cores) and applies the CPU patches of :mod:`.patches`. On a machine with CUDA
   nothing of this happens; there, only where the flash-attn package is missing, models take ``pack_varlen``
   attention and the critic's value model its config's attention instead of verl's hard-coded flash_attention_2,
   and log-probs a chunked fp32 function instead of verl's row loop (:func:`.patches.apply_flash_attn_fallbacks`).
   ``run.flash_attn_fallbacks=false`` (``KLPPO_FLASH_ATTN_FALLBACKS=0``) keeps verl's own code there instead.
   On every machine the v1 replay buffer takes its poll interval from ``trainer.v1.sampler.sampler_kwargs``, and
   where TransformerEngine is missing ``strategy=megatron`` runs Megatron's local layer spec
   (:func:`.megatron_no_te.apply_no_te_patches`).

The verl overrides that go with it are in :mod:`.cpu_overrides` (``CPU_VERL_OVERRIDES``); :mod:`.demo_run` runs and
measures ``main_ppo`` (bench script, e2e tests).
To make a refusal loud, put the plugin in ``VERL_USE_EXTERNAL_MODULES`` (``demo_run.loud_plugin_env``): verl then
imports it without swallowing errors.
"""

from __future__ import annotations

import logging
import os

from verl.plugin.platform import PlatformRegistry

from recipes import envvars
from recipes.verl_ext.plugin import megatron_no_te, patches
from recipes.verl_ext.plugin.patches import (
    SUPPORTED_VERL,
    UnsupportedVerlError,
    installed_verl_version,
    require_supported_verl,
)
from recipes.verl_ext.plugin.platform import PLATFORM_NAME, PlatformCPU, cpu_platform_wanted

__all__ = [
    "SUPPORTED_VERL",
    "UnsupportedVerlError",
    "cpu_platform_wanted",
    "install",
    "installed_verl_version",
    "require_supported_verl",
]

logger = logging.getLogger(__name__)


def _load_hf_replica():
    # lazy: verl imports the plugin in every process; only one that builds an hf replica needs verl's rollout stack
    from recipes.verl_ext.plugin.hf_rollout import HFReplica

    return HFReplica


def fallbacks_wanted() -> bool:
    """False where the run asked for verl's own code without flash-attn (``KLPPO_FLASH_ATTN_FALLBACKS=0``, set by
    ``run.flash_attn_fallbacks=false``); true otherwise."""
    return not envvars.is_off(envvars.FLASH_ATTN_FALLBACKS)


def install() -> None:
    """Register the ``hf`` rollout everywhere and, where the CPU platform is wanted, the CPU platform and patches."""
    try:
        require_supported_verl()
    except UnsupportedVerlError as error:
        logger.error("%s", error)  # verl swallows plugin import errors at debug level: say it out loud first
        raise

    patches.apply_rollout_patches()
    patches.apply_record_patches()
    patches.apply_trainer_patches()
    megatron_no_te.apply_no_te_patches()  # strategy=megatron without TransformerEngine; nothing where TE is installed
    patches.when_imported(
        "verl.workers.rollout.replica",
        lambda replica: replica.RolloutReplicaRegistry.register("hf", _load_hf_replica),
    )

    if not cpu_platform_wanted():
        # a GPU machine: verl's CUDA platform as it is; what flash-attn's absence would break or slow, unless the run
        # asks for verl's own code (run.flash_attn_fallbacks=false)
        if fallbacks_wanted():
            patches.apply_flash_attn_fallbacks()
        return
    if PlatformRegistry.get(PLATFORM_NAME) is not PlatformCPU:
        PlatformRegistry.register(platform=PLATFORM_NAME)(PlatformCPU)
    os.environ.setdefault("VERL_PLATFORM", PLATFORM_NAME)
    # Ray pre-starts one idle Python worker per logical CPU for the first driver; verl's CPU run declares 16
    # logical CPUs, and on a 2-core machine those idle starts delay every real actor by seconds.
    os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
    patches.apply_cpu_patches()


install()
