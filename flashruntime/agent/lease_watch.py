"""A running lease's cancel, learnt within a second or two: a daemon thread long-polls
``GET /v1alpha1/attempts/{id}/watch`` while the task runs, and when its job is cancelled marks
the lease's heartbeat ``cancelled``, which stops the task at once rather than at the next
heartbeat's 410. A coordinator without the route is answered by the heartbeat alone."""

from __future__ import annotations

import logging
import threading

from flashruntime.agent.lease_heartbeat import LOST_STATUSES, LeaseHeartbeat
from flashruntime.client import CoordinatorClient
from flashruntime.errors import CoordinatorHTTPError, CoordinatorUnavailable

__all__ = ["WATCH_WAIT_S", "CancelWatch"]

logger = logging.getLogger("flashruntime.worker")

# Each watch waits this long on the coordinator before asking again: short enough that a
# coordinator shutting down is not held up by its watches for long.
WATCH_WAIT_S = 5.0


class CancelWatch:
    """Watches ``heartbeat``'s lease from ``start`` until ``stop`` (which does not wait for the
    call in flight: its answer is then ignored)."""

    def __init__(self, client: CoordinatorClient, heartbeat: LeaseHeartbeat, *, wait_s: float = WATCH_WAIT_S,
                 retry_s: float = 1.0) -> None:
        self._client = client
        self._heartbeat = heartbeat
        self._wait_s = wait_s
        self._retry_s = retry_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"flashruntime-watch-{heartbeat.lease_id}",
                                        daemon=True)

    def start(self) -> CancelWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        lease_id = self._heartbeat.lease_id
        while not self._stop.is_set() and not self._heartbeat.lost.is_set():
            try:
                answer = self._client.watch_attempt(lease_id, self._wait_s)
            except CoordinatorHTTPError as exc:
                if exc.status in LOST_STATUSES or exc.status in (404, 405):
                    return  # gone (the heartbeat says so), or a coordinator without watches
                self._stop.wait(self._retry_s)
                continue
            except CoordinatorUnavailable:
                self._stop.wait(self._retry_s)
                continue
            standing = answer.get("standing")
            if self._stop.is_set() or standing not in ("live", "cancelled"):
                return  # ended: the worker reported its outcome, or the heartbeat will find it gone
            if standing == "cancelled":
                reason = answer.get("reason")
                self._heartbeat.cancel(reason if isinstance(reason, str) and reason else "the task was cancelled")
                return
