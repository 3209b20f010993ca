"""A lease's heartbeats: renewed on a daemon thread from claim until the outcome is
reported; a 410 or 403 says the lease is no longer the agent's (``lost``)."""

from __future__ import annotations

import logging
import threading

from flashruntime.client import CoordinatorClient
from flashruntime.errors import CoordinatorHTTPError, CoordinatorUnavailable
from flashruntime.periodic import Periodic
from flashruntime.protocol.lease_rules import DEFAULT_LEASE_SECONDS  # for a Lease that states no length (0)
from flashruntime.protocol.v1alpha1 import Lease

__all__ = ["LOST_STATUSES", "LeaseHeartbeat", "heartbeat_interval"]

logger = logging.getLogger("flashruntime.worker")

LOST_STATUSES = (403, 410)  # the lease is no longer ours: stop and walk away without further calls


def heartbeat_interval(lease: Lease, floor_s: float = 1.0) -> float:
    """A third of the lease's length (a lease that states none: the default), at least ``floor_s``."""
    seconds = lease.lease_seconds if lease.lease_seconds > 0 else DEFAULT_LEASE_SECONDS
    return max(floor_s, seconds / 3.0)


class LeaseHeartbeat:
    """Renews one lease every ``interval_s`` on a daemon thread; ``lost`` is set on 410/403."""

    def __init__(self, client: CoordinatorClient, lease_id: str, interval_s: float) -> None:
        self._client = client
        self.lease_id = lease_id
        self.interval_s = interval_s
        self.lost = threading.Event()
        self._periodic = Periodic(self._beat, interval_s, f"flashruntime-lease-{lease_id}", last_tick=False)

    def start(self) -> None:
        self._periodic.start()

    def stop(self) -> None:
        self._periodic.stop()

    def _beat(self) -> bool:
        try:
            self._client.attempt_heartbeat(self.lease_id, retry=False)  # the next beat is the retry
        except CoordinatorHTTPError as exc:
            if exc.status in LOST_STATUSES:
                logger.warning("lease %s lost (HTTP %s): stopping its processes", self.lease_id, exc.status)
                self.lost.set()
                return False
            logger.warning("lease %s heartbeat refused: %s", self.lease_id, exc)
        except CoordinatorUnavailable as exc:
            logger.warning("lease %s heartbeat failed: %s", self.lease_id, exc)
        return True
