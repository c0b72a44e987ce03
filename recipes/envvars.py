"""The pack's environment variables: one prefix, ``KLPPO_``; the names of earlier releases still work, with a note.

================================  ======================================================================================
name                              what
================================  ======================================================================================
``KLPPO_CONF_DIR``                the conf/ tree to compose from (a copied recipe's entry point sets it)
``KLPPO_DATA_DIR``                where the tiny demo assets are built and cached (default ~/.cache/klppo-recipes)
``KLPPO_SYNC_LOG``                the weight sync log every actor rank appends to (<run folder>/weight_sync.jsonl)
``KLPPO_SYNC_WEIGHTS``            0 turns the hf rollout's weight sync off (a test of what happens without it)
``KLPPO_FLASH_ATTN_FALLBACKS``    0: verl's own code where flash-attn is missing (``run.flash_attn_fallbacks=false``)
``KLPPO_RAY_JOB``                 set in the driver of a Ray Job that the pack submitted
================================  ======================================================================================
"""

from __future__ import annotations

import logging
import os

CONF_DIR = "KLPPO_CONF_DIR"
DATA_DIR = "KLPPO_DATA_DIR"
SYNC_LOG = "KLPPO_SYNC_LOG"
SYNC_WEIGHTS = "KLPPO_SYNC_WEIGHTS"
FLASH_ATTN_FALLBACKS = "KLPPO_FLASH_ATTN_FALLBACKS"
RAY_JOB = "KLPPO_RAY_JOB"

# the names of earlier releases -> today's
DEPRECATED = {
    "PACK_DATA_DIR": DATA_DIR,
    "HYBRID_ENGINE_SYNC_LOG": SYNC_LOG,
    "HYBRID_ENGINE_SYNC_WEIGHTS": SYNC_WEIGHTS,
}

logger = logging.getLogger(__name__)
_warned: set[str] = set()


def getenv(name: str, default: str | None = None) -> str | None:
    """The value of the pack variable ``name``, or of its old name (noted once per process), or ``default``."""
    value = os.environ.get(name)
    if value is not None:
        return value
    for old, new in DEPRECATED.items():
        if new == name and old in os.environ:
            if old not in _warned:
                _warned.add(old)
                logger.warning("%s is deprecated: set %s instead (read %s=%s for now)", old, new, old, os.environ[old])
            return os.environ[old]
    return default


def is_off(name: str) -> bool:
    """Whether the pack switch ``name`` is set to ``0``/``false``/``no``/``off`` (unset: on)."""
    return (getenv(name) or "1").strip().lower() in ("0", "false", "no", "off")
