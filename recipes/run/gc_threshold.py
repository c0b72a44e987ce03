"""Python's garbage collector in the launcher and in every Ray worker of a run: ``run.gc_threshold``.

Each process of a verl run imports torch, transformers and verl: about half a million objects the collector tracks
(``len(gc.get_objects())`` after importing verl's agent loop), which live as long as the process. With Python's own
thresholds (700, 10, 10) the collector walks all of them again and again: during the imports, and between steps, where
verl's per-sample bookkeeping (TransferQueue metadata, tensordicts) makes young objects by the ten thousand. On the CPU
embedded default (2 cores, 2026-12-05) a full collection took 140-300 ms, and an 8-step KL-PPO run made 65 such in its
11 processes (about 10 CPU-s); a step showed them as 0.3 s stalls in whichever of its phases they fell. With (50000, 20,
100) the run made 16 over 30 ms (2.2 CPU-s), the stalls went, and 8-step runs took 0.907x the time (``python
scripts/bench_demo_cli.py --recipe kl_ppo --repeats 3 --versus run.gc_threshold=null trainer.total_training_steps=8``;
scripts/results/2026-12-05-gc-threshold/).

At exit, the same heap made the interpreter's teardown slow: it collects garbage over every object before it frees
them, about 1.4 s for a process that imported verl (``python -c "import verl.experimental.agent_loop"``: 6.5 s, 5.1 s
when the process ends at once; 2026-12-05). :func:`freeze_at_exit` moves them out of the collector's sight once the
atexit handlers have run (``gc.freeze()``); the teardown then frees them without walking them (0.15 s).

The same idea as torchtitan's ``gc_freq`` and Megatron-LM's ``--manual-gc``, which take collection out of Python's hands
in the training loop; here verl owns the loop, so only the thresholds change. Cyclic garbage lives a little longer
(until the next collection of its generation); reference counting still frees everything else at once.
"""

from __future__ import annotations

import atexit
import gc
from collections.abc import Callable, Sequence

PYTHON_THRESHOLD: tuple[int, int, int] = gc.get_threshold()
"""This interpreter's thresholds before the pack changed them (CPython's (700, 10, 10) unless the caller set its
own)."""

DEFAULT: tuple[int, int, int] = (50_000, 20, 100)
"""``run.gc_threshold``'s default: generation 0 collected after 50,000 new container objects (Python: 700), a
generation-1 collection every 20 of those (10), a full one every 100 of those (10)."""


def threshold_of(value: Sequence[int] | None) -> tuple[int, int, int]:
    """The three thresholds ``value`` stands for: itself, or Python's own for None (``run.gc_threshold=null``)."""
    if value is None:
        return PYTHON_THRESHOLD
    gen0, gen1, gen2 = (int(v) for v in value)
    return gen0, gen1, gen2


def apply(value: Sequence[int] | None) -> None:
    """Set this process's thresholds to :func:`threshold_of` ``value``."""
    gc.set_threshold(*threshold_of(value))


def freeze_at_exit() -> None:
    """After this process's other atexit handlers (it runs last when registered first), ``gc.freeze()``: the
    interpreter's teardown then skips the collections over every object still alive. Registered once."""
    if not _FREEZE_REGISTERED:
        _FREEZE_REGISTERED.append(True)
        atexit.register(gc.freeze)


_FREEZE_REGISTERED: list[bool] = []


def setup_hook(value: Sequence[int] | None, then: Callable[[], None] | None = None):
    """A named function for Ray's ``worker_process_setup_hook``: the thresholds in each worker, set before the
    worker imports torch and verl for its actor; then ``then``."""
    threshold = threshold_of(value)

    def set_worker_gc_threshold() -> None:
        gc.set_threshold(*threshold)
        freeze_at_exit()
        if then is not None:
            then()

    return set_worker_gc_threshold
