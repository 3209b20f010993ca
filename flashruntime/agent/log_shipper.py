"""A running task's live files on their way to the coordinator: its log (``task.log``) and its
step records (``metrics.jsonl``, which the dashboard draws as curves) under the task's output
prefix, every ``log_upload_s`` while they grow, and once more before the outcome is reported.
They are the user's aid, never the task's outcome: failures are logged and dropped."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from flashruntime.agent.lease_heartbeat import LOST_STATUSES
from flashruntime.client import CoordinatorClient
from flashruntime.errors import CoordinatorHTTPError, CoordinatorUnavailable
from flashruntime.periodic import Periodic
from flashruntime.protocol.task_logs import TASK_LOG_MAX_BYTES, bounded_log, whole_lines_tail
from flashruntime.protocol.task_metrics import TASK_METRICS_MAX_BYTES

__all__ = ["LiveFile", "TaskLogShipper", "read_step_records", "read_task_log"]

logger = logging.getLogger("flashruntime.worker")
# The task writes its step records itself: never follow a link it left there, never block on a FIFO.
_TASK_FILE_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def read_task_log(path: Path, max_bytes: int = TASK_LOG_MAX_BYTES) -> bytes | None:
    """The log as it is uploaded (``bounded_log`` of it), reading only its tail; None when unreadable."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - (max_bytes + 1)))
            return bounded_log(handle.read(), max_bytes)
    except OSError:
        return None


def read_step_records(path: Path, max_bytes: int = TASK_METRICS_MAX_BYTES) -> bytes | None:
    """The whole lines of the last ``max_bytes`` of the task's ``metrics.jsonl``; None when it is
    missing, unreadable, or not a regular file (a link, a FIFO, a directory)."""
    try:
        fd = os.open(path, _TASK_FILE_FLAGS)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - (max_bytes + 1)))
            return whole_lines_tail(handle.read(max_bytes + 1), max_bytes)
        except OSError:
            return None


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return info.st_size, info.st_mtime_ns


@dataclass
class LiveFile:
    """One file a running task grows, and where it goes: ``read`` gives the bytes to upload."""

    key: str
    path: Path
    content_type: str
    read: Callable[[Path], bytes | None]
    sent: tuple[int, int] | None = None  # (size, mtime) of the file last uploaded


class TaskLogShipper:
    """Uploads a task's log to ``key`` (and its step records to ``metrics_key``, when given):
    from a daemon thread every ``interval_s`` while they change (tried once each time: the next
    one is the retry), and by ``ship(final=True)`` after ``stop``. Nothing is sent once
    ``lease_gone()`` says the lease is no longer the worker's."""

    def __init__(self, client: CoordinatorClient, key: str, log: Path, interval_s: float, *,
                 metrics_key: str | None = None, metrics: Path | None = None,
                 lease_gone: Callable[[], bool] = lambda: False) -> None:
        self._client = client
        self.key = key
        self.log = log
        self.interval_s = interval_s
        self._lease_gone = lease_gone
        self._files = [LiveFile(key, log, "text/plain; charset=utf-8", read_task_log)]
        if metrics_key is not None and metrics is not None:
            self._files.append(LiveFile(metrics_key, metrics, "application/x-ndjson", read_step_records))
        # No last upload on stop: the runner ships the final one itself, with retries.
        self._periodic = Periodic(lambda: self.ship(final=False), interval_s, f"flashruntime-log-{key}",
                                  last_tick=False)

    def start(self) -> None:
        self._periodic.start()

    def stop(self) -> None:
        self._periodic.stop()

    def ship(self, *, final: bool) -> bool:
        """Upload each file that changed since its last upload; False when the lease is gone
        (the heartbeat thread says so to the runner)."""
        return all(self._ship_one(live, final) for live in self._files)

    def _ship_one(self, live: LiveFile, final: bool) -> bool:
        if self._lease_gone():
            return False
        stamp = _stamp(live.path)
        if stamp is None or stamp == live.sent:
            return True
        data = live.read(live.path)
        if not data:  # none, or nothing written yet: the coordinator keeps no empty artifact
            return True
        try:
            self._client.put_artifact(live.key, data, live.content_type, retry=final)
        except CoordinatorHTTPError as exc:
            if exc.status in LOST_STATUSES:
                return False
            logger.warning("upload of %s refused: %s", live.key, exc)
            return True
        except CoordinatorUnavailable as exc:
            logger.warning("upload of %s failed: %s", live.key, exc)
            return True
        live.sent = stamp
        return True
