"""A running task's log on its way to the coordinator (``task.log`` under the task's output
prefix): every ``log_upload_s`` while it grows, and once more before the outcome is
reported. A log is the user's aid, never the task's outcome: failures are logged and dropped."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from flashruntime.agent.lease_heartbeat import LOST_STATUSES
from flashruntime.client import CoordinatorClient
from flashruntime.errors import CoordinatorHTTPError, CoordinatorUnavailable
from flashruntime.periodic import Periodic
from flashruntime.protocol.task_logs import TASK_LOG_MAX_BYTES, bounded_log

__all__ = ["TaskLogShipper", "read_task_log"]

logger = logging.getLogger("flashruntime.worker")


def read_task_log(path: Path, max_bytes: int = TASK_LOG_MAX_BYTES) -> bytes | None:
    """The log as it is uploaded (``bounded_log`` of it), reading only its tail; None when unreadable."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - (max_bytes + 1)))
            return bounded_log(handle.read(), max_bytes)
    except OSError:
        return None


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_size, info.st_mtime_ns


class TaskLogShipper:
    """Uploads a task's log to ``key``: from a daemon thread every ``interval_s`` while the log
    changes (tried once each time: the next one is the retry), and by ``ship(final=True)`` after
    ``stop``."""

    def __init__(self, client: CoordinatorClient, key: str, log: Path, interval_s: float) -> None:
        self._client = client
        self.key = key
        self.log = log
        self.interval_s = interval_s
        self._sent: tuple[int, int] | None = None  # (size, mtime) of the log last uploaded
        # No last upload on stop: the runner ships the final one itself, with retries.
        self._periodic = Periodic(lambda: self.ship(final=False), interval_s, f"flashruntime-log-{key}",
                                  last_tick=False)

    def start(self) -> None:
        self._periodic.start()

    def stop(self) -> None:
        self._periodic.stop()

    def ship(self, *, final: bool) -> bool:
        """Upload the log if it changed since the last upload; False when the lease is gone
        (the heartbeat thread says so to the runner)."""
        stamp = _stamp(self.log)
        if stamp is None or stamp == self._sent:
            return True
        data = read_task_log(self.log)
        if not data:  # none, or nothing written yet: the coordinator keeps no empty artifact
            return True
        try:
            self._client.put_artifact(self.key, data, "text/plain; charset=utf-8", retry=final)
        except CoordinatorHTTPError as exc:
            logger.warning("log upload to %s refused: %s", self.key, exc)
            return exc.status not in LOST_STATUSES
        except CoordinatorUnavailable as exc:
            logger.warning("log upload to %s failed: %s", self.key, exc)
            return True
        self._sent = stamp
        return True
