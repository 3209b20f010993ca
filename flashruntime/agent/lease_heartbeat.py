"""A lease's heartbeats: renewed on a daemon thread from claim until the outcome is
reported; a 410 or 403 says the lease is no longer the agent's (``lost``)."""

from __future__ import annotations

import logging
import threading
from typing import Any

from flashruntime.client import CoordinatorClient
from flashruntime.errors import CoordinatorHTTPError, CoordinatorUnavailable
from flashruntime.periodic import Periodic
from flashruntime.protocol.lease_rules import DEFAULT_LEASE_SECONDS  # for a Lease that states no length (0)
from flashruntime.protocol.v1alpha1 import Lease

__all__ = ["LOST_STATUSES", "LeaseHeartbeat", "heartbeat_interval"]

logger = logging.getLogger("flashruntime.worker")

_MAX_REPORTS = 16  # what one heartbeat may carry (AttemptHeartbeat)
LOST_STATUSES = (403, 410)  # the lease is no longer ours: stop and walk away without further calls


def heartbeat_interval(lease: Lease, floor_s: float = 1.0) -> float:
    """A third of the lease's length (a lease that states none: the default), at least ``floor_s``."""
    seconds = lease.lease_seconds if lease.lease_seconds > 0 else DEFAULT_LEASE_SECONDS
    return max(floor_s, seconds / 3.0)


class LeaseHeartbeat:
    """Renews one lease every ``interval_s`` on a daemon thread; ``lost`` is set on 410/403,
    and by ``cancel`` (the lease's job was cancelled: ``cancelled`` then says why)."""

    def __init__(self, client: CoordinatorClient, lease_id: str, interval_s: float) -> None:
        self._client = client
        self.lease_id = lease_id
        self.interval_s = interval_s
        self.lost = threading.Event()
        self.cancelled: str | None = None
        self._reports: list[dict[str, Any]] = []  # stragglers to send with the next beat
        self._reports_lock = threading.Lock()
        self._periodic = Periodic(self._beat, interval_s, f"flashruntime-lease-{lease_id}", last_tick=False)

    def start(self) -> None:
        self._periodic.start()

    def stop(self) -> None:
        self._periodic.stop()

    def cancel(self, reason: str) -> None:
        """The coordinator cancelled the lease: no more beats, and the runner stops the task."""
        self.cancelled = reason
        self.lost.set()
        logger.info("lease %s cancelled on the coordinator (%s): stopping its processes", self.lease_id, reason)

    def report_straggler(self, report: dict[str, Any]) -> None:
        """Send ``report`` (a ``StragglerReport``) to the coordinator with the next heartbeat."""
        with self._reports_lock:
            self._reports = [*self._reports, report][-_MAX_REPORTS:]

    def flush(self) -> None:
        """Send the reports not sent yet now, with a heartbeat (before the outcome is reported)."""
        with self._reports_lock:
            pending = bool(self._reports)
        if pending and not self.lost.is_set():
            self._beat()

    def _beat(self) -> bool:
        if self.lost.is_set():
            return False  # cancelled: a beat would only be refused
        with self._reports_lock:
            reports, self._reports = self._reports, []
        try:
            # The next beat is the retry; reports that did not go go with it.
            self._client.attempt_heartbeat(self.lease_id, retry=False, stragglers=reports)
            reports = []
        except CoordinatorHTTPError as exc:
            if exc.status in LOST_STATUSES:
                logger.warning("lease %s lost (HTTP %s): stopping its processes", self.lease_id, exc.status)
                self.lost.set()
                return False
            logger.warning("lease %s heartbeat refused: %s", self.lease_id, exc)
        except CoordinatorUnavailable as exc:
            logger.warning("lease %s heartbeat failed: %s", self.lease_id, exc)
        finally:
            if reports:
                with self._reports_lock:
                    self._reports = [*reports, *self._reports][-_MAX_REPORTS:]
        return True
