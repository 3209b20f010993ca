"""Leases: how machines outside any cluster take work safely.

Pull a task, prove liveness, lose it when silent, commit exactly once.
``LeaseManager`` is the state machine; a ``LeaseStore`` keeps it durable
(``InMemoryLeaseStore``, or ``SqliteLeaseStore``, which survives ``kill -9``).
"""

from flashruntime.errors import LeaseError
from flashruntime.leases.manager import MAX_LEASE_SECONDS, LeaseManager, bounded_lease_seconds
from flashruntime.leases.sqlite_store import SqliteLeaseStore
from flashruntime.leases.store import InMemoryLeaseStore, LeaseStore, TaskRecord

__all__ = [
    "LeaseManager",
    "LeaseError",
    "TaskRecord",
    "LeaseStore",
    "InMemoryLeaseStore",
    "SqliteLeaseStore",
    "MAX_LEASE_SECONDS",
    "bounded_lease_seconds",
]
