"""What the pack adds to the ``ray.init`` that verl 0.9.1's ``run_ppo`` makes (``ray.init`` wrapped while it runs).

- Every worker sets the run's garbage-collector thresholds first thing, by Ray's setup hook
  (``run.gc_threshold``, :mod:`recipes.run.gc_threshold`).
- Secret runtime-env variables reach the workers by the same hook, not by the logged ``env_vars``
  (:mod:`recipes.verl_ext.worker_secrets`).
- The driver's Python signal handlers stay: ``ray.init`` installs its own SIGTERM handler, which ends the process at
  once, so a scheduler's SIGTERM would skip the pack's clean stop (the last checkpoint and the resume command,
  recipes/run/interrupt.py). The handlers in place before the call are put back after it.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import threading
from collections.abc import Iterator, Mapping, Sequence

from recipes.run import gc_threshold
from recipes.verl_ext.worker_secrets import setup_hook

KEPT_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def pack_ray_init(secrets: Mapping[str, str], gc: Sequence[int] | None = gc_threshold.DEFAULT) -> Iterator[None]:
    """While open, ``ray.init`` carries the garbage-collector thresholds ``gc`` and ``secrets`` by the setup hook
    and keeps this process's signal handlers."""
    import ray  # lazy: only a training run starts Ray

    original = ray.init

    @functools.wraps(original)
    def init(*args, runtime_env=None, **kwargs):
        runtime_env = with_setup_hook(runtime_env, secrets, gc)
        kept = kept_handlers()
        try:
            return original(*args, runtime_env=runtime_env, **kwargs)
        finally:
            for sig, handler in kept.items():
                signal.signal(sig, handler)

    ray.init = init
    try:
        yield
    finally:
        ray.init = original


def with_setup_hook(runtime_env: Mapping | None, secrets: Mapping[str, str], gc: Sequence[int] | None) -> dict:
    """``runtime_env`` with a ``worker_process_setup_hook`` that sets the thresholds ``gc``, then ``secrets``, then
    runs the hook it had already (a function, or Ray's ``"module.function"`` string)."""
    runtime_env = dict(runtime_env or {})
    # the secrets hook runs a given hook in either form (no secrets: it sets nothing)
    then = setup_hook(secrets, runtime_env.get("worker_process_setup_hook"))
    runtime_env["worker_process_setup_hook"] = gc_threshold.setup_hook(gc, then)
    return runtime_env


def kept_handlers() -> dict:
    """The Python handlers of :data:`KEPT_SIGNALS` now, where they can be set again (the main thread; handlers
    Python installed)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: handler for sig in KEPT_SIGNALS if (handler := signal.getsignal(sig)) is not None}
