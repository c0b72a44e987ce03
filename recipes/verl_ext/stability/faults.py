"""Why an attempt failed, from the exceptions in its traceback and the attempt process's exit (``stability=auto``).

The reason is read from the *types* of the exceptions (each traceback's ``module.Type: message`` lines), not from
words in their messages: Ray's stock message for a dead actor lists "killed by SIGKILL by OOM killer" among its
possible causes, which is no evidence of an out-of-memory error.

==============  =================================================================================================
reason          evidence
==============  =================================================================================================
``nan_loss``    the pack's trainer raised ``StabilityFault[nan_loss]`` (a NaN/Inf loss, before the step's checkpoint)
``bands``       ``StabilityFault[bands]``: steps in a row outside a band marked ``unstable``
``nan_weights`` sampling saw NaN/Inf probabilities (torch's multinomial check): the weights are no longer finite
``oom``         ``torch.OutOfMemoryError`` (CUDA), Python's ``MemoryError`` (host), Ray's ``OutOfMemoryError`` (its
                memory monitor killed the task)
``worker_lost`` a Ray worker or actor died (``ActorDiedError``, ``RayActorError``, ``WorkerCrashedError``, ...), or
                the attempt process was killed by a signal without writing its failure
``error``       anything else (a bug, a bad path): not retried
==============  =================================================================================================
"""

from __future__ import annotations

import re
import signal

RETRYABLE = ("nan_loss", "bands", "nan_weights", "oom", "worker_lost")

_TYPE_LINE = re.compile(r"^(?:[A-Za-z_][\w]*\.)*([A-Za-z_]\w*(?:Error|Exception|Fault))\b(?:\([^)]*\))?:?", re.M)
OOM_TYPES = {"OutOfMemoryError", "MemoryError"}
WORKER_TYPES = {"ActorDiedError", "RayActorError", "WorkerCrashedError", "ActorUnavailableError", "NodeDiedError",
                "LocalRayletDiedError", "OwnerDiedError"}
NAN_SAMPLING = "probability tensor contains either `inf`, `nan` or element < 0"


def exception_types(text: str) -> set[str]:
    """The exception type names a traceback text shows (``ray.exceptions.ActorDiedError: ...`` -> ActorDiedError)."""
    return {m.group(1) for m in _TYPE_LINE.finditer(text)}


def classify(message: str, exitcode: int | None = None) -> str:
    """The failure's reason from its traceback text (the exception chain as the attempt saw it) and exit code."""
    if "StabilityFault[" in message:
        return message.split("StabilityFault[", 1)[1].split("]", 1)[0]
    types = exception_types(message)
    if types & OOM_TYPES or "CUDA out of memory" in message:
        return "oom"
    if NAN_SAMPLING in message:
        return "nan_weights"
    if types & WORKER_TYPES:
        return "worker_lost"
    if exitcode is not None and exitcode < 0:  # the attempt process itself was killed by a signal
        return "worker_lost"
    return "error"


def exit_description(exitcode: int | None) -> str:
    """``exited with code 1`` / ``was killed by SIGKILL``."""
    if exitcode is not None and exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"
