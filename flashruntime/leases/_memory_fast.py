"""The hot transitions of a ``LeaseManager`` over an ``InMemoryLeaseStore``, fused.

``claim``, ``heartbeat`` and ``complete`` are what a worker fleet calls all day, and
over the in-memory store most of their cost was calls and re-checks between layers:
the manager asking the store for the sweep, the queue head and a ``save`` that
rediscovers by comparison what the manager had just changed. Here each transition's
common case (a plain claim with nothing to sweep and no cordon, the renewal of a live
lease, the first commit of a live lease) reads and updates the store's indexes in one
frame, exactly as ``InMemoryLeaseStore.save`` would leave them, and emits its event.
Every other case (errors, refusals, sweeps, cordons, policies, per-job claims, the
winner's retry) goes, with nothing changed, to the manager's general method, so each
rule still has one home.

``fused_claim``, ``fused_heartbeat`` and ``fused_complete`` wrap the manager's general
methods: the wrapper is the class's method, so a subclass override, a patch of the
class, a copied manager and refcount freeing behave as on any store, and the common
case costs no call beyond the method's own. The store's indexes come from the
manager's ``_fast`` tuple (``fast_state``), which is None unless the store is exactly
``InMemoryLeaseStore`` with none of the methods the general path would call replaced
(``plain_store``): a spy or a patched ``save`` sees every call, as it would without
fusing. The lock is taken with ``with``, not ``lock.acquire()`` / ``try``: an exception
that a signal handler raises (KeyboardInterrupt) surfaces at the end of the
``acquire()`` call, outside the ``try``, and would leave the store locked.

The contract suite runs every case against this path (the ``memory`` store) and the
general path over the same store (``memory_general``), and
``tests/unit/test_lease_memory_fast.py`` drives both with the same random operations
and compares every result, exception, event and index.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from datetime import datetime
from heapq import heappush
from typing import TYPE_CHECKING, Any, NamedTuple, TypeGuard, TypeVar

from flashruntime.leases._checks import _node_of
from flashruntime.leases._events import commit_accepted, lease_claimed, lease_renewed
from flashruntime.leases._memory import InMemoryLeaseStore, _Entry, _SeqSet
from flashruntime.leases._models import _DELTAS, UTC, coerce_now, copy_payload, make_lease, renewed, seconds
from flashruntime.protocol.v1alpha1 import Lease, TaskState

if TYPE_CHECKING:
    from flashruntime.leases.manager import LeaseManager
    from flashruntime.leases.store import TaskRecord

__all__ = ["fast_state", "fused_claim", "fused_complete", "fused_heartbeat", "plain_store"]

_PENDING = TaskState.PENDING
_LEASED = TaskState.LEASED
_COMPLETED = TaskState.COMPLETED
_datetime = datetime

Method = TypeVar("Method", bound=Callable[..., Any])


class _TakeGeneralPath(Exception):
    """Raised inside the lock, before any change, when the case is not the common one."""


# The outcome "take the general path": the general method is called once the lock is released
# and outside the ``except`` clause, so its exceptions carry no ``_TakeGeneralPath`` context.
_GENERAL: Any = object()


def plain_store(store: object) -> TypeGuard[InMemoryLeaseStore]:
    """Whether ``store`` is an ``InMemoryLeaseStore`` exactly as this module knows it: the
    class's own methods, and no replacement on the instance of the ones the manager calls."""
    if type(store) is not InMemoryLeaseStore:
        return False
    if any(InMemoryLeaseStore.__dict__.get(name) is not method for name, method in _ORIGINAL_METHODS.items()):
        return False
    own = vars(store)
    if any(name in own for name in _ORIGINAL_METHODS):
        return False
    by_lease, cordons = store._by_lease, store._cordons
    return (
        own.get("has_lease") == by_lease.__contains__
        and own.get("find_lease") == by_lease.get
        and own.get("cordon_for") == cordons.get
    )


class FastState(NamedTuple):
    """What the fused transitions read of a plain ``InMemoryLeaseStore``: the store and its
    indexes. Each method unpacks it in one step; the field order is the unpacking order."""

    store: InMemoryLeaseStore
    lock: threading.RLock
    entries: dict[int, _Entry]
    pending: _SeqSet
    job_pending: dict[str, _SeqSet]
    by_lease: dict[str, TaskRecord]
    by_node: dict[str, dict[int, TaskRecord]]
    heap: list[tuple[datetime, int, str]]  # compaction rewrites it in place: this list stays the heap
    counts: dict[str, dict[TaskState, int]]
    cordons: dict[str, tuple[datetime | None, str]]


def fast_state(store: object) -> FastState | None:
    """The fused transitions' view of ``store``, or None unless it is a plain ``InMemoryLeaseStore``."""
    if not plain_store(store):
        return None
    return FastState(
        store, store._lock, store._entries, store._pending, store._job_pending, store._by_lease,
        store._by_node, store._expiry, store._counts, store._cordons,
    )


def fused_claim(general: Method) -> Method:
    """``LeaseManager.claim``: the common case fused, anything else by ``general``."""

    def claim(
        self: LeaseManager,
        node_id: str,
        job_id: str | None = None,
        now: datetime | None = None,
        policy: Any = None,
        node: dict[str, Any] | None = None,
    ) -> Lease | None:
        fast = self._fast
        if fast is None or job_id is not None or policy is not None or node_id.__class__ is not str or not node_id:
            return general(self, node_id, job_id, now, policy, node)  # type: ignore[no-any-return]
        if now is None or now.__class__ is not _datetime or now.tzinfo is not UTC:
            now = coerce_now(now)
        store, lock, entries, pending, job_pending, by_lease, by_node, heap, counts_by_job, cordons = fast
        try:
            with lock:
                if (heap and heap[0][0] <= now) or (cordons and node_id in cordons):
                    raise _TakeGeneralPath  # a sweep may be due, or the node has a cordon: the general path decides
                blocks = pending._blocks
                if not blocks:
                    return None
                seq = blocks[0][0]
                entry = entries[seq]
                record = entry.record
                spec = record.spec
                values = spec.__dict__
                lease_seconds = values["lease_seconds"]
                try:
                    deadline = now + (_DELTAS.get(lease_seconds) or seconds(lease_seconds))
                except OverflowError:
                    raise _TakeGeneralPath from None  # the general path refuses it, with its message
                payload = values["payload"]
                payload = copy_payload(payload) if payload else {}
                attempt = record.attempts_used + 1
                record.attempts_used = attempt
                next_id = self._ids
                lease_id = next_id()
                while lease_id in by_lease:
                    lease_id = next_id()
                task_job = values["job_id"]
                lease = make_lease(
                    lease_id, values["task_id"], task_job, node_id, attempt, deadline, payload, lease_seconds
                )
                record.state = _LEASED
                record.active_lease = lease
                record.lease_history[lease_id] = lease
                # The indexes, as InMemoryLeaseStore.save leaves them for PENDING -> LEASED.
                head = blocks[0]
                if len(head) > 1:
                    del head[0]
                    pending._size -= 1
                else:
                    pending.discard(seq)
                if job_pending:
                    job_queue = job_pending.get(task_job)
                    if job_queue is not None:
                        job_queue.discard(seq)
                counts = counts_by_job[task_job]
                counts[_PENDING] -= 1
                counts[_LEASED] += 1
                entry.state = _LEASED
                held = by_node.get(node_id)
                if held is None:
                    held = by_node[node_id] = {}
                held[seq] = record
                entry.node_id = node_id
                by_lease[lease_id] = record
                heappush(heap, (deadline, seq, lease_id))
                entry.lease_id = lease_id
                entry.deadline = deadline
                if len(heap) > store._compact_at:
                    store._compact_expiry()
        except _TakeGeneralPath:
            lease = _GENERAL
        if lease is _GENERAL:
            return general(self, node_id, job_id, now, policy, node)  # type: ignore[no-any-return]
        on_event = self.on_event
        if on_event is not None:
            on_event(lease_claimed(spec, node_id, lease_id, attempt, deadline, now))
        return lease

    return functools.wraps(general)(claim)  # type: ignore[return-value]


def fused_heartbeat(general: Method) -> Method:
    """``LeaseManager.heartbeat``: the renewal of a live lease fused, anything else by ``general``."""

    def heartbeat(self: LeaseManager, lease_id: str, now: datetime | None = None) -> Lease:
        fast = self._fast
        if fast is None or lease_id.__class__ is not str:
            return general(self, lease_id, now)  # type: ignore[no-any-return]
        if now is None or now.__class__ is not _datetime or now.tzinfo is not UTC:
            now = coerce_now(now)
        store, lock, entries, _, _, by_lease, _, heap, _, _ = fast
        try:
            with lock:
                record = by_lease.get(lease_id)
                active = None if record is None else record.active_lease
                if (
                    active is None or record.state is not _LEASED or active.lease_id != lease_id
                    or active.deadline <= now
                ):
                    raise _TakeGeneralPath  # unknown or not live: refused by the general path
                lease_seconds = record.spec.lease_seconds
                try:
                    deadline = now + (_DELTAS.get(lease_seconds) or seconds(lease_seconds))
                except OverflowError:
                    raise _TakeGeneralPath from None  # the general path refuses it, with its message
                renewal = renewed(active, deadline)
                record.active_lease = renewal
                # The indexes, as InMemoryLeaseStore.save leaves them for a renewal.
                seq = record.seq
                entry = entries[seq]
                if entry.deadline != deadline:
                    heappush(heap, (deadline, seq, lease_id))
                    entry.deadline = deadline
                    if len(heap) > store._compact_at:
                        store._compact_expiry()
        except _TakeGeneralPath:
            renewal = _GENERAL
        if renewal is _GENERAL:
            return general(self, lease_id, now)  # type: ignore[no-any-return]
        on_event = self.on_event
        if on_event is not None:
            on_event(lease_renewed(record.spec, renewal.node_id, lease_id, deadline, now))
        return renewal

    return functools.wraps(general)(heartbeat)  # type: ignore[return-value]


def fused_complete(general: Method) -> Method:
    """``LeaseManager.complete``: the first commit of a live lease fused, anything else by ``general``."""

    def complete(self: LeaseManager, lease_id: str, output_sha256: str, now: datetime | None = None) -> bool:
        fast = self._fast
        if fast is None or lease_id.__class__ is not str or output_sha256.__class__ is not str:
            return general(self, lease_id, output_sha256, now)  # type: ignore[no-any-return]
        if now is None or now.__class__ is not _datetime or now.tzinfo is not UTC:
            now = coerce_now(now)
        _, lock, entries, _, _, by_lease, by_node, heap, counts_by_job, _ = fast
        try:
            with lock:
                record = by_lease.get(lease_id)
                active = None if record is None else record.active_lease
                if (
                    active is None or record.state is not _LEASED or active.lease_id != lease_id
                    or active.deadline <= now
                ):
                    raise _TakeGeneralPath  # unknown, not live, or the winner's retry: the general path answers
                record.state = _COMPLETED
                record.accepted_attempt_id = lease_id
                record.accepted_output_sha256 = output_sha256
                record.active_lease = None
                # The indexes, as InMemoryLeaseStore.save leaves them for LEASED -> COMPLETED.
                seq = record.seq
                entry = entries[seq]
                counts = counts_by_job[record.spec.job_id]
                counts[_LEASED] -= 1
                counts[_COMPLETED] += 1
                entry.state = _COMPLETED
                node_id = entry.node_id
                held = by_node.get(node_id)
                if held is not None:
                    held.pop(seq, None)
                    if not held:
                        del by_node[node_id]
                if heap:
                    last = heap[-1]
                    if last[1] == seq and last[2] == lease_id:
                        heap.pop()
                entry.node_id = entry.lease_id = entry.deadline = None
        except _TakeGeneralPath:
            record = _GENERAL
        if record is _GENERAL:
            return general(self, lease_id, output_sha256, now)  # type: ignore[no-any-return]
        on_event = self.on_event
        if on_event is not None:
            on_event(commit_accepted(record.spec, _node_of(record, lease_id), lease_id, output_sha256, now))
        return True

    return functools.wraps(general)(complete)  # type: ignore[return-value]


# What the manager calls on a store, as this module was written against (see plain_store).
_ORIGINAL_METHODS = {
    name: InMemoryLeaseStore.__dict__[name]
    for name in (
        "transaction", "add", "save", "get", "next_pending", "leased", "all", "pending_page",
        "expired", "leased_by_node", "counts", "put_cordon", "remove_cordon", "cordons",
    )
}
