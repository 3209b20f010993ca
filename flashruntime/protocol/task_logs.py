"""A task's log as a worker uploads it and the coordinator serves it: one artifact named
``task.log`` under the task's output prefix, holding the last ``TASK_LOG_MAX_BYTES`` of the
task process's combined stdout and stderr. The worker (which cuts it) and the coordinator
(which says whether it was cut) both need these facts, so they live here. Pure.
"""

from __future__ import annotations

__all__ = [
    "JOB_LOGS_MAX_BYTES",
    "MAX_TAIL_LINES",
    "TASK_LOG_CUT_LINE",
    "TASK_LOG_MAX_BYTES",
    "TASK_LOG_NAME",
    "attempt_log_key",
    "bounded_log",
    "last_lines",
    "task_log_key",
    "was_cut",
    "whole_lines_tail",
]

TASK_LOG_NAME = "task.log"
# A log is read by people, a screenful at a time: the last MiB holds the failure and what led
# to it, and keeps every upload of a chatty task cheap.
TASK_LOG_MAX_BYTES = 1024 * 1024
# What one answer of GET /v1alpha1/jobs/{id}/logs holds at most: a grid of 10,000 tasks must
# not make the coordinator read and send gigabytes. Shared evenly among the tasks shown.
JOB_LOGS_MAX_BYTES = 8 * 1024 * 1024
MAX_TAIL_LINES = 100_000
# The first line of a log the worker cut, so a reader (and the coordinator) can tell.
TASK_LOG_CUT_LINE = f"[flashruntime: earlier output dropped; a task's log keeps its last {TASK_LOG_MAX_BYTES} bytes]"
_CUT_PREFIX = (TASK_LOG_CUT_LINE + "\n").encode("utf-8")


def attempt_log_key(output_prefix: str, attempt_number: int) -> str:
    """Where the coordinator keeps the log of an earlier, failed attempt of a task, so a retry's
    log does not replace it: ``<prefix>attempts/<n>/task.log``."""
    base = output_prefix if output_prefix.endswith("/") else output_prefix + "/"
    return f"{base}attempts/{attempt_number}/{TASK_LOG_NAME}"


def task_log_key(output_prefix: str) -> str:
    """The artifact key of a task's log, given its output prefix (``jobs/<job>/<task>/``)."""
    return output_prefix + TASK_LOG_NAME if output_prefix.endswith("/") else f"{output_prefix}/{TASK_LOG_NAME}"


def bounded_log(data: bytes, max_bytes: int = TASK_LOG_MAX_BYTES) -> bytes:
    """``data`` when it fits in ``max_bytes``; else ``TASK_LOG_CUT_LINE`` and the whole lines
    of its tail, together at most ``max_bytes`` (a single line longer than that is kept cut).
    A caller may pass just the last ``max_bytes + 1`` bytes of a longer log: the answer is the same."""
    if len(data) <= max_bytes:
        return data
    room = max_bytes - len(_CUT_PREFIX)
    if room <= 0:
        return _CUT_PREFIX[:max_bytes]
    return _CUT_PREFIX + whole_lines_tail(data, room)


def whole_lines_tail(data: bytes, size: int) -> bytes:
    """The last ``size`` bytes of ``data`` from the first line that starts within them (all of
    them when no line does: one line longer than ``size`` is kept cut)."""
    if len(data) <= size:
        return data
    window = data[-(size + 1):]  # one byte more: whether the window starts a line
    newline = window.find(b"\n")
    return window[newline + 1:] if 0 <= newline < len(window) - 1 else window[1:]


def was_cut(data: bytes) -> bool:
    """Whether ``data`` is a log the worker cut to its tail (``bounded_log`` did)."""
    return data.startswith(_CUT_PREFIX)


def last_lines(text: str, count: int) -> str:
    """The last ``count`` lines of ``text`` (a final newline kept; 0 → "")."""
    if count <= 0:
        return ""
    lines = text.splitlines(keepends=True)
    return "".join(lines[-count:])
