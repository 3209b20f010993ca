"""What the manager needs from a store, whatever the store offers (SPEC §2.4).

A store implements the required methods; each optional accelerator it lacks is
derived here from the required ones (a scan: correct, but O(n)), cordons fall
back to memory, and its ``transaction()`` becomes one context manager the manager
can enter for every transition.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from flashruntime.protocol.v1alpha1 import TaskState

if TYPE_CHECKING:
    from flashruntime.leases.store import LeaseStore, TaskRecord

__all__ = ["StoreAdapter"]

_PENDING = TaskState.PENDING
_LEASED = TaskState.LEASED
Cordon = tuple[datetime | None, str]


def _method(store: object, name: str) -> Callable[..., Any] | None:
    method = getattr(store, name, None)
    return method if callable(method) else None


class _PerCall:
    """Adapts a ``transaction()`` that returns a fresh context manager on each call."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self._factory = factory
        self._local = threading.local()

    def __enter__(self) -> Any:
        stack = self._local.__dict__.setdefault("stack", [])
        context = self._factory()
        value = context.__enter__()
        stack.append(context)
        return value

    def __exit__(self, *exc: Any) -> Any:
        return self._local.stack.pop().__exit__(*exc)


def _reusable(transaction: Callable[[], Any]) -> Any:
    """The store's own context manager when ``transaction()`` keeps returning the same
    (re-entrant) object, as both stores here do; else an adapter asking for a fresh one."""
    first = transaction()
    return first if first is transaction() else _PerCall(transaction)


def _found_by(find_lease: Callable[[str], Any]) -> Callable[[str], bool]:
    return lambda lease_id: find_lease(lease_id) is not None


class StoreAdapter:
    """Bound callables for every operation the manager uses, accelerated or derived."""

    def __init__(self, store: LeaseStore) -> None:
        self._store = store
        transaction = _method(store, "transaction")
        self.transaction: Any = None if transaction is None else _reusable(transaction)
        find_lease = _method(store, "find_lease")
        self.find_lease: Callable[[str], TaskRecord | None] = find_lease or self._find_by_scan
        # Whether a fresh lease id is already taken: the store's own cheap test, else its
        # find_lease; None (no check) when only a scan could tell (48 random bits make
        # a clash practically impossible, and the scan would make every claim O(n)).
        has_lease = _method(store, "has_lease")
        if has_lease is None and find_lease is not None:
            has_lease = _found_by(find_lease)
        self.has_lease: Callable[[str], bool] | None = has_lease
        self.expired: Callable[[datetime], list[TaskRecord]] = _method(store, "expired") or self._expired_by_scan
        self.pending_page: Callable[[str | None, int, int], list[TaskRecord]] = (
            _method(store, "pending_page") or self._pending_page_by_scan
        )
        self.leased_by_node: Callable[[str], list[TaskRecord]] = (
            _method(store, "leased_by_node") or self._leased_by_node_by_scan
        )
        self.counts: Callable[[str], dict[str, int]] = _method(store, "counts") or self._counts_by_scan
        if all(_method(store, name) for name in ("put_cordon", "remove_cordon", "cordons")):
            self.put_cordon: Callable[[str, datetime | None, str], None] = store.put_cordon  # type: ignore[attr-defined]
            self.remove_cordon: Callable[[str], bool] = store.remove_cordon  # type: ignore[attr-defined]
            self.cordons: Callable[[], dict[str, Cordon]] = store.cordons  # type: ignore[attr-defined]
            self.cordon_for: Callable[[str], Cordon | None] = (
                _method(store, "cordon_for") or self._cordon_from_list
            )
        else:  # cordons kept in memory, for the manager's lifetime
            memory: dict[str, Cordon] = {}
            self.put_cordon = lambda node_id, until, reason: memory.__setitem__(node_id, (until, reason))
            self.remove_cordon = lambda node_id: memory.pop(node_id, None) is not None
            self.cordons = memory.copy
            self.cordon_for = memory.get

    def _find_by_scan(self, lease_id: str) -> TaskRecord | None:
        for record in self._store.all():
            active = record.active_lease
            if lease_id in record.lease_history or (active is not None and active.lease_id == lease_id):
                return record
        return None

    def _expired_by_scan(self, now: datetime) -> list[TaskRecord]:
        found = [
            record
            for record in self._store.leased()
            if record.state is _LEASED and record.active_lease is not None and record.active_lease.deadline <= now
        ]
        found.sort(key=lambda record: (record.active_lease.deadline, record.seq))  # type: ignore[union-attr]
        return found

    def _pending_page_by_scan(self, job_id: str | None, after_seq: int, limit: int) -> list[TaskRecord]:
        page: list[TaskRecord] = []
        for record in self._store.all(job_id):
            if record.state is _PENDING and record.seq is not None and record.seq > after_seq:
                page.append(record)
                if len(page) >= limit:
                    break
        return page

    def _leased_by_node_by_scan(self, node_id: str) -> list[TaskRecord]:
        return [
            record
            for record in self._store.leased()
            if record.active_lease is not None and record.active_lease.node_id == node_id
        ]

    def _counts_by_scan(self, job_id: str) -> dict[str, int]:
        counts: dict[str, int] = {}
        for record in self._store.all(job_id):
            counts[record.state.value] = counts.get(record.state.value, 0) + 1
        return counts

    def _cordon_from_list(self, node_id: str) -> Cordon | None:
        return self.cordons().get(node_id)
