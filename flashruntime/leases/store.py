"""The lease store contract: the ``LeaseStore`` protocol (what each method MUST do, with
defaults for the derived ones), with ``TaskRecord`` and the in-memory implementation
(defined in ``_record`` and ``_memory``, which need nothing of this module, and re-exported
here).

A store keeps task records durable and findable; every decision about them is the
manager's. Six methods are required of any store; the derived ones have defaults here
that a store overrides to avoid scanning every record.
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Protocol, runtime_checkable

from flashruntime.leases._memory import InMemoryLeaseStore
from flashruntime.leases._record import TaskRecord
from flashruntime.protocol.v1alpha1 import TaskState

__all__ = ["REQUIRED_METHODS", "InMemoryLeaseStore", "LeaseStore", "TaskRecord", "with_derived_operations"]


@runtime_checkable
class LeaseStore(Protocol):
    """The contract of a lease store. The manager decides everything; a store keeps task
    records durable and findable. The manager mutates a record it obtained from the
    store and calls ``save`` inside the same ``transaction()``.

    Six methods are required. The rest are derived: each has a default here, built on
    the required ones (a scan: correct, but O(n)); a store overrides any of them to be
    fast, and must then keep the same answers. A store that subclasses ``LeaseStore``
    inherits the defaults; ``LeaseManager`` gives one that does not (any object with the
    six methods) the defaults through ``with_derived_operations``.
    """

    # --- required ---------------------------------------------------------------------

    def add(self, record: TaskRecord) -> None:
        """Store a new record and set its ``seq``, greater than every ``seq`` before it.
        A record with the ``(job_id, task_id)`` of a stored one MUST raise ``ValueError``
        and store nothing."""
        ...

    def save(self, record: TaskRecord) -> None:
        """Persist the mutable state of a record obtained from this store (state, the four counters,
        ``active_lease``, ``accepted_*``, ``lease_history``), so that every later read
        returns it. MUST NOT change ``seq``."""
        ...

    def get(self, job_id: str, task_id: str) -> TaskRecord | None:
        """The record of ``(job_id, task_id)``, or None."""
        ...

    def next_pending(self, job_id: str | None = None) -> TaskRecord | None:
        """The PENDING record with the lowest ``seq`` (of one job, or of all), or None."""
        ...

    def leased(self) -> list[TaskRecord]:
        """Every LEASED record."""
        ...

    def all(self, job_id: str | None = None) -> list[TaskRecord]:
        """Every record (of one job), in ``seq`` order."""
        ...

    # --- derived: defaults built on the required methods ---------------------------------

    def transaction(self) -> AbstractContextManager[object]:
        """A context manager that makes the read-modify-write sequence inside it atomic
        with respect to every other transaction on this store, re-entrant on one thread.
        A store that can MUST undo the sequence's writes when it raises. Default: one
        re-entrant lock per store object (the same object on every call)."""
        lock = self.__dict__.get("_flashruntime_lock")
        if lock is None:
            lock = self.__dict__.setdefault("_flashruntime_lock", threading.RLock())
        return lock  # type: ignore[no-any-return]

    def find_lease(self, lease_id: str) -> TaskRecord | None:
        """The record that holds, or once held, lease ``lease_id``; None if none did."""
        for record in self.all():
            active = record.active_lease
            if lease_id in record.lease_history or (active is not None and active.lease_id == lease_id):
                return record
        return None

    def has_lease(self, lease_id: str) -> bool:
        """Whether any record holds or held lease ``lease_id`` (asked of every fresh id)."""
        return self.find_lease(lease_id) is not None

    def expired(self, now: datetime) -> list[TaskRecord]:
        """The LEASED records whose active lease's deadline is at or before ``now``, by
        ``(deadline, seq)``."""
        found = [record for record in self.leased()
                 if record.state is TaskState.LEASED and record.active_lease is not None
                 and record.active_lease.deadline <= now]
        found.sort(key=lambda record: (record.active_lease.deadline, record.seq))  # type: ignore[union-attr]
        return found

    def pending_page(self, job_id: str | None, after_seq: int, limit: int) -> list[TaskRecord]:
        """Up to ``limit`` PENDING records (of one job, or of all) with ``seq > after_seq``,
        in ``seq`` order."""
        page: list[TaskRecord] = []
        for record in self.all(job_id):
            if record.state is TaskState.PENDING and record.seq is not None and record.seq > after_seq:
                page.append(record)
                if len(page) >= limit:
                    break
        return page

    def leased_by_node(self, node_id: str) -> list[TaskRecord]:
        """The LEASED records whose active lease ``node_id`` holds."""
        return [record for record in self.leased()
                if record.active_lease is not None and record.active_lease.node_id == node_id]

    def counts(self, job_id: str | None = None) -> dict[str, int]:
        """``{state value: number of records}`` (of one job, or of all); absent states are absent."""
        counts: dict[str, int] = {}
        for record in self.all(job_id):
            counts[record.state.value] = counts.get(record.state.value, 0) + 1
        return counts

    def put_cordon(self, node_id: str, until: datetime | None, reason: str) -> None:
        """Record (or replace) the cordon of ``node_id``: no claims until ``until`` (None:
        until removed). Default: kept in memory, for the store object's lifetime."""
        _memory_cordons(self)[node_id] = (until, reason)

    def remove_cordon(self, node_id: str) -> bool:
        """Remove the cordon of ``node_id``; whether there was one."""
        return _memory_cordons(self).pop(node_id, None) is not None

    def cordons(self) -> dict[str, tuple[datetime | None, str]]:
        """Every recorded cordon, ``{node_id: (until, reason)}``, expired ones included."""
        return dict(_memory_cordons(self))

    def cordon_for(self, node_id: str) -> tuple[datetime | None, str] | None:
        """The cordon of one node (asked by every claim), or None."""
        return self.cordons().get(node_id)



def _memory_cordons(store: object) -> dict[str, tuple[datetime | None, str]]:
    """The default cordon table: a dict on the store object itself."""
    return store.__dict__.setdefault("_flashruntime_cordons", {})  # type: ignore[no-any-return]


REQUIRED_METHODS = ("add", "save", "get", "next_pending", "leased", "all")
_DERIVED = ("transaction", "find_lease", "has_lease", "expired", "pending_page", "leased_by_node", "counts")
_CORDONS = ("put_cordon", "remove_cordon", "cordons")


class _WithDerived(LeaseStore):
    """A store that implements the required methods only (or some derived ones too), with
    the defaults of ``LeaseStore`` for the rest."""

    def __init__(self, store: object) -> None:
        self.wrapped = store
        for name in (*REQUIRED_METHODS, *_DERIVED):
            method = getattr(store, name, None)
            if callable(method):
                setattr(self, name, method)
        if all(callable(getattr(store, name, None)) for name in _CORDONS):
            for name in (*_CORDONS, "cordon_for"):
                method = getattr(store, name, None)
                if callable(method):
                    setattr(self, name, method)
        if not callable(getattr(store, "has_lease", None)) and not callable(getattr(store, "find_lease", None)):
            # Only a scan could tell whether a fresh id is taken, which would make every claim
            # O(n); 48 random bits make a clash practically impossible, so nothing is checked.
            self.has_lease = _never  # type: ignore[method-assign]


def _never(lease_id: str) -> bool:
    return False


def with_derived_operations(store: object) -> LeaseStore:
    """``store`` itself when it offers every operation of ``LeaseStore`` (a subclass does),
    else a view of it with the defaults for what it lacks. ``TypeError`` naming what is
    missing when it lacks a required method."""
    missing = [name for name in REQUIRED_METHODS if not callable(getattr(store, name, None))]
    if missing:
        raise TypeError(f"store {type(store).__name__} is not a LeaseStore: it lacks "
                        + ", ".join(f"{name}()" for name in missing))
    if all(callable(getattr(store, name, None)) for name in (*_DERIVED, *_CORDONS, "cordon_for")):
        return store  # type: ignore[return-value]
    return _WithDerived(store)
