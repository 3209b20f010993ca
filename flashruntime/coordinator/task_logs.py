"""The logs of a lease job's tasks, as ``GET /v1alpha1/jobs/{id}/logs`` answers them.

A worker uploads each task's log as the artifact ``task.log`` under the task's output
prefix (at most ``TASK_LOG_MAX_BYTES``, cut to its last lines). This reads those files,
never more than ``JOB_LOGS_MAX_BYTES`` for one answer and only from the end of each file,
and joins them into the one text the ``logs`` key has always held.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flashruntime.coordinator.artifacts import ArtifactStore, BadArtifactKey
from flashruntime.protocol.task_logs import (
    JOB_LOGS_MAX_BYTES,
    TASK_LOG_CUT_LINE,
    TASK_LOG_MAX_BYTES,
    attempt_log_key,
    last_lines,
    task_log_key,
    was_cut,
    whole_lines_tail,
)

__all__ = ["TaskLog", "attempt_log_key_of", "job_logs_text", "keep_attempt_log", "log_share", "own_prefix", "read_log",
           "task_log_path", "with_tail"]


@dataclass(frozen=True)
class TaskLog:
    task_id: str
    state: str
    node_id: str | None
    log: str
    truncated: bool
    attempt: int | None = None  # an earlier, failed attempt; None: the task's latest log

    def as_json(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "state": self.state, "node_id": self.node_id, "log": self.log,
                "truncated": self.truncated, "attempt": self.attempt}


def log_share(tasks: int) -> int:
    """Bytes of each task's log one answer may hold when it shows ``tasks`` tasks."""
    return min(TASK_LOG_MAX_BYTES, JOB_LOGS_MAX_BYTES // max(1, tasks))


def read_log(path: Path, max_bytes: int) -> tuple[str, bool]:
    """(the text of the log at ``path``, whether any of it is left out): its last
    ``max_bytes`` at most, from a whole line on. A missing file is an empty log."""
    try:
        with open(path, "rb") as handle:
            cut = was_cut(handle.read(len(TASK_LOG_CUT_LINE.encode("utf-8")) + 1))
            size = handle.seek(0, os.SEEK_END)
            if size <= max_bytes:
                handle.seek(0)
                return handle.read().decode("utf-8", "replace"), cut
            handle.seek(size - max_bytes - 1)
            data = whole_lines_tail(handle.read(max_bytes + 1), max_bytes)
    except OSError:  # missing, or no file at all (a directory where the log should be)
        return "", False
    note = (f"[flashruntime: earlier output not shown; this answer keeps the last {max_bytes} bytes of each "
            "task's log: ask for one task (?task=) to see up to all of it]\n")
    return note + data.decode("utf-8", "replace"), True


def own_prefix(job_id: str, task_id: str, payload: dict[str, Any]) -> str:
    """The task's output prefix, only under ``jobs/<job>/``: what a job's reader may see, and
    where its nodes may write."""
    prefix = payload.get("output_prefix")
    own = f"jobs/{job_id}/"
    if not (isinstance(prefix, str) and prefix.startswith(own) and len(prefix) > len(own)):
        prefix = f"{own}{task_id}/"
    return prefix


def attempt_log_key_of(job_id: str, task_id: str, payload: dict[str, Any], attempt: int) -> str:
    """The artifact key under which the log of the task's earlier ``attempt`` is kept."""
    return attempt_log_key(own_prefix(job_id, task_id, payload), attempt)


def keep_attempt_log(artifacts: ArtifactStore, job_id: str, task_id: str, payload: dict[str, Any],
                     attempt: int) -> None:
    """Keep the log of the task's failed ``attempt`` (the end of ``task.log``, at most
    ``TASK_LOG_MAX_BYTES``) under ``attempts/<n>/``, so the next attempt's log, which replaces
    ``task.log``, does not erase it. Nothing is kept when there is no log to read; a store
    that cannot write raises (``OSError`` or the store's own error)."""
    current = task_log_path(artifacts, job_id, task_id, payload)
    if current is None:
        return
    try:
        with open(current, "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - TASK_LOG_MAX_BYTES))
            data = handle.read(TASK_LOG_MAX_BYTES)
    except OSError:
        return
    artifacts.write_bytes(attempt_log_key_of(job_id, task_id, payload, attempt), data)


def task_log_path(artifacts: ArtifactStore, job_id: str, task_id: str, payload: dict[str, Any],
                  attempt: int | None = None) -> Path | None:
    """Where the task's log lies on the coordinator (``attempt``: the kept log of that earlier
    attempt), or None when the key cannot be a file."""
    prefix = own_prefix(job_id, task_id, payload)
    try:
        return artifacts.path_of(task_log_key(prefix) if attempt is None else attempt_log_key(prefix, attempt))
    except BadArtifactKey:
        return None


def with_tail(text: str, truncated: bool, tail: int | None) -> tuple[str, bool]:
    if tail is None:
        return text, truncated
    shown = last_lines(text, tail)
    return shown, truncated or len(shown) < len(text)


def job_logs_text(logs: Iterable[TaskLog]) -> str:
    """Every task's log under a ``--- <task_id> (<state>) ---`` header, each ending in a newline."""
    parts = []
    for entry in logs:
        body = entry.log if not entry.log or entry.log.endswith("\n") else entry.log + "\n"
        which = entry.task_id if entry.attempt is None else f"{entry.task_id} attempt {entry.attempt}"
        parts.append(f"--- {which} ({entry.state}) ---\n{body}")
    return "".join(parts)
