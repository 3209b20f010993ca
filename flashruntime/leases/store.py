"""The lease store contract: ``TaskRecord``, the ``LeaseStore`` protocol, and the
in-memory implementation (defined in ``_memory`` and re-exported here).

A store keeps task records durable and findable; every decision about them is
the manager's. The required methods are what any user store implements; the
optional accelerators let the manager avoid scanning all records (SPEC §2.4).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import datetime
from typing import Protocol, runtime_checkable

from flashruntime.leases._memory import InMemoryLeaseStore  # defined beside, exported here
from flashruntime.protocol.v1alpha1 import Lease, TaskSpec, TaskState

__all__ = ["InMemoryLeaseStore", "LeaseStore", "OptionalLeaseStore", "TaskRecord"]


class TaskRecord:
    """One task's durable state: its spec, lifecycle state, counters and leases.

    ``attempts_used`` counts claims (and numbers attempts); the two budgets are
    ``failures_seen`` against ``spec.max_attempts`` and ``expiries_seen`` against
    ``spec.max_expiries``. ``lease_history`` keeps every lease as first issued;
    ``active_lease`` is the current one, with its latest deadline.
    """

    __slots__ = (
        "spec",
        "state",
        "attempts_used",
        "failures_seen",
        "expiries_seen",
        "active_lease",
        "accepted_attempt_id",
        "accepted_output_sha256",
        "lease_history",
        "seq",
    )

    def __init__(self, spec: TaskSpec) -> None:
        self.spec = spec
        self.state: TaskState = TaskState.PENDING
        self.attempts_used = 0
        self.failures_seen = 0
        self.expiries_seen = 0
        self.active_lease: Lease | None = None
        self.accepted_attempt_id: str | None = None
        self.accepted_output_sha256: str | None = None
        self.lease_history: dict[str, Lease] = {}
        self.seq: int | None = None

    def __repr__(self) -> str:
        lease = self.active_lease.lease_id if self.active_lease is not None else None
        return (
            f"TaskRecord(job_id={self.spec.job_id!r}, task_id={self.spec.task_id!r}, state={self.state.value}, "
            f"seq={self.seq}, attempts_used={self.attempts_used}, failures_seen={self.failures_seen}, "
            f"expiries_seen={self.expiries_seen}, active_lease={lease!r}, "
            f"accepted_attempt_id={self.accepted_attempt_id!r})"
        )


@runtime_checkable
class LeaseStore(Protocol):
    """What every lease store implements. The manager mutates a record it obtained
    from the store and calls ``save`` inside the same transaction."""

    def add(self, record: TaskRecord) -> None:
        """Store a new record and assign its ``seq``; a duplicate ``(job_id, task_id)`` raises ``ValueError``."""

    def save(self, record: TaskRecord) -> None:
        """Persist the mutable state of a record obtained from this store."""

    def get(self, job_id: str, task_id: str) -> TaskRecord | None: ...

    def next_pending(self, job_id: str | None = None) -> TaskRecord | None:
        """The first PENDING record (of one job, or of all) in insertion order."""

    def leased(self) -> list[TaskRecord]: ...

    def all(self, job_id: str | None = None) -> list[TaskRecord]:
        """Every record (of one job) in insertion order."""


class OptionalLeaseStore(LeaseStore, Protocol):
    """The optional accelerators the manager uses when a store has them (SPEC §2.4).

    Documentation of their shapes only; a store may implement any subset.
    ``cordon_for`` is this package's own addition: one node's cordon without
    listing all of them.
    """

    def transaction(self) -> AbstractContextManager[object]: ...

    def pending_page(self, job_id: str | None, after_seq: int, limit: int) -> list[TaskRecord]: ...

    def expired(self, now: datetime) -> list[TaskRecord]: ...

    def find_lease(self, lease_id: str) -> TaskRecord | None: ...

    def leased_by_node(self, node_id: str) -> list[TaskRecord]: ...

    def counts(self, job_id: str | None) -> dict[str, int]: ...

    def put_cordon(self, node_id: str, until: datetime | None, reason: str) -> None: ...

    def remove_cordon(self, node_id: str) -> bool: ...

    def cordons(self) -> dict[str, tuple[datetime | None, str]]: ...

    def cordon_for(self, node_id: str) -> tuple[datetime | None, str] | None: ...
