"""What Ray reported about an attempt, in the recovery taxonomy. Pure: exceptions are told
apart by their class names, so this module needs no Ray to import or to test.

Ray itself never retries (every task is submitted with ``max_retries=0``); the dispatcher
acts on these classes by the recovery policy:

| Ray reported | class | what happens to the task |
|---|---|---|
| the worker process died (``WorkerCrashedError``), its owner or object was lost | ``worker_crash`` | retried; spends one of ``max_expiries``, like an agent that died |
| the node died (``NodeDiedError``) | ``node_loss`` | retried; spends one of ``max_expiries`` |
| Ray's memory monitor killed the worker (``OutOfMemoryError``) | ``worker_crash`` (evidence says OOM) | retried; spends one of ``max_expiries`` |
| anything else Ray raised | ``unknown`` | retried; spends one of ``max_expiries`` |

The task's own command is judged as on an agent: its exit code and the tail of its log
(``flashruntime.recovery.from_local_launch``). A deterministic error (``ImportError``, a
``SyntaxError``, a command that cannot start) is ``application_error``: the task fails at once,
without a retry. Any other failed exit is ``worker_crash`` and spends one of ``max_attempts``.
"""

from __future__ import annotations

import re

from flashruntime.protocol.v1alpha1 import FailureClass

__all__ = ["classify_ray_error", "is_cancellation"]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")

# (class name, failure class, what the evidence says), the first name in an exception's MRO wins.
_RAY_ERRORS: tuple[tuple[str, FailureClass, str], ...] = (
    ("OutOfMemoryError", FailureClass.WORKER_CRASH, "Ray's memory monitor killed the worker (out of memory)"),
    ("NodeDiedError", FailureClass.NODE_LOSS, "the Ray node died"),
    ("WorkerCrashedError", FailureClass.WORKER_CRASH, "the Ray worker process died"),
    ("OwnerDiedError", FailureClass.WORKER_CRASH, "the Ray process that owned the attempt died"),
    ("ObjectLostError", FailureClass.WORKER_CRASH, "Ray lost the attempt's result"),
    ("LocalRayletDiedError", FailureClass.NODE_LOSS, "the Ray node's raylet died"),
)


def _names(exc: BaseException) -> list[str]:
    """The class names of ``exc`` and, for a ``RayTaskError``, of what it wraps."""
    names = [cls.__name__ for cls in type(exc).__mro__]
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        names += [cls.__name__ for cls in type(cause).__mro__]
    return names


def is_cancellation(exc: BaseException) -> bool:
    """Whether Ray raised ``exc`` because the task was cancelled (``ray.cancel``)."""
    return "TaskCancelledError" in _names(exc)


def classify_ray_error(exc: BaseException) -> tuple[FailureClass, str]:
    """(failure class, the words of the evidence) of an error Ray raised for an attempt."""
    names = _names(exc)
    for name, failure, words in _RAY_ERRORS:
        if name in names:
            return failure, words
    cause = getattr(exc, "cause", None)
    inner = cause if isinstance(cause, BaseException) else exc
    lines = [line.strip() for line in _ANSI.sub("", str(inner)).splitlines() if line.strip()]
    return FailureClass.UNKNOWN, f"Ray raised {type(inner).__name__}: {(lines or [''])[-1][:300]}"
