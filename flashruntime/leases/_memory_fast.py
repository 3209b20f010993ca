"""The hot transitions of a ``LeaseManager`` over an ``InMemoryLeaseStore``, fused.

``claim``, ``heartbeat`` and ``complete`` are what a worker fleet calls all day, and
over the in-memory store most of their cost was calls and re-checks between layers:
the manager asking the store for the sweep, the queue head and a ``save`` that
rediscovers by comparison what the manager had just changed. Here each transition's
common case (a plain claim with nothing to sweep and no cordon, the renewal of a live
lease, the first commit of a live lease) reads and updates the store's indexes in one
frame, exactly as ``InMemoryLeaseStore.save`` would leave them, and emits its event.
For every other case (errors, refusals, sweeps, cordons, policies, per-job claims, the
winner's retry) it returns ``GENERAL`` having changed nothing, and the manager's
method goes on with its general path, so each rule still has one home.

The manager fuses only a store that is exactly ``InMemoryLeaseStore`` with none of the
methods the general path would call replaced (``plain_store``): a spy or a patched
``save`` sees every call, as it would without fusing.

The contract suite runs every case against this path (the ``memory`` store) and the
general path over the same store (``memory_general``), and
``tests/unit/test_lease_memory_fast.py`` drives both with the same random operations
and compares every result, exception, event and index.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from heapq import heappush
from typing import TYPE_CHECKING, Any

from flashruntime.leases._checks import _node_of
from flashruntime.leases._events import commit_accepted, lease_claimed, lease_renewed
from flashruntime.leases._memory import InMemoryLeaseStore
from flashruntime.leases._models import _DELTAS, UTC, coerce_now, copy_payload, make_lease, renewed, seconds
from flashruntime.protocol.v1alpha1 import Lease, TaskState

if TYPE_CHECKING:
    from flashruntime.leases.manager import LeaseManager

__all__ = ["GENERAL", "fused_transitions", "plain_store"]

GENERAL: Any = object()  # "not the common case: take the general path" (nothing was changed)

_PENDING = TaskState.PENDING
_LEASED = TaskState.LEASED
_COMPLETED = TaskState.COMPLETED
_datetime = datetime


def plain_store(store: object) -> bool:
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


def fused_transitions(
    store: InMemoryLeaseStore,
) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    """``(claim, heartbeat, complete)`` over ``store``, each taking the manager first and
    returning the transition's result, or ``GENERAL`` for any case but its common one."""
    lock = store._lock
    entries = store._entries
    pending = store._pending
    job_pending = store._job_pending
    by_lease = store._by_lease
    by_node = store._by_node
    heap = store._expiry  # compaction rewrites it in place: this list stays the heap
    counts_by_job = store._counts
    cordon_for = store._cordons.get
    find_lease = by_lease.get

    def claim(manager: LeaseManager, node_id: str, now: datetime | None) -> Lease | None:
        """A claim without ``job_id`` or ``policy``."""
        if node_id.__class__ is not str or not node_id:
            return GENERAL
        if now is None or now.__class__ is not _datetime or now.tzinfo is not UTC:
            now = coerce_now(now)
        on_event = manager.on_event
        with lock:
            if (heap and heap[0][0] <= now) or cordon_for(node_id) is not None:
                return GENERAL  # a sweep may be due, or the node has a cordon: the general path decides
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
                return GENERAL  # the general path refuses it, with its message
            payload = values["payload"]
            if payload:
                payload = copy_payload(payload)
            attempt = record.attempts_used + 1
            record.attempts_used = attempt
            next_id = manager._ids
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
        if on_event is not None:
            on_event(lease_claimed(spec, node_id, lease_id, attempt, deadline, now))
        return lease

    def heartbeat(manager: LeaseManager, lease_id: str, now: datetime | None) -> Lease:
        if lease_id.__class__ is not str:
            return GENERAL
        if now is None or now.__class__ is not _datetime or now.tzinfo is not UTC:
            now = coerce_now(now)
        on_event = manager.on_event
        with lock:
            record = find_lease(lease_id)
            active = None if record is None else record.active_lease
            if active is None or record.state is not _LEASED or active.lease_id != lease_id or active.deadline <= now:
                return GENERAL  # unknown or not live: refused by the general path
            lease_seconds = record.spec.lease_seconds
            deadline = now + (_DELTAS.get(lease_seconds) or seconds(lease_seconds))
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
        if on_event is not None:
            on_event(lease_renewed(record.spec, renewal.node_id, lease_id, deadline, now))
        return renewal

    def complete(manager: LeaseManager, lease_id: str, output_sha256: str, now: datetime | None) -> bool:
        if lease_id.__class__ is not str or output_sha256.__class__ is not str:
            return GENERAL
        if now is None or now.__class__ is not _datetime or now.tzinfo is not UTC:
            now = coerce_now(now)
        on_event = manager.on_event
        with lock:
            record = find_lease(lease_id)
            active = None if record is None else record.active_lease
            if active is None or record.state is not _LEASED or active.lease_id != lease_id or active.deadline <= now:
                return GENERAL  # unknown, not live, or the winner's retry: the general path answers
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
            held = by_node.get(node_id)  # type: ignore[arg-type]
            if held is not None:
                held.pop(seq, None)
                if not held:
                    del by_node[node_id]  # type: ignore[arg-type]
            if heap:
                last = heap[-1]
                if last[1] == seq and last[2] == lease_id:
                    heap.pop()
            entry.node_id = entry.lease_id = entry.deadline = None
        if on_event is not None:
            on_event(commit_accepted(record.spec, _node_of(record, lease_id), lease_id, output_sha256, now))
        return True

    return claim, heartbeat, complete


# What the manager calls on a store, as this module was written against (see plain_store).
_ORIGINAL_METHODS = {
    name: InMemoryLeaseStore.__dict__[name]
    for name in (
        "transaction", "add", "save", "get", "next_pending", "leased", "all", "pending_page",
        "expired", "leased_by_node", "counts", "put_cordon", "remove_cordon", "cordons",
    )
}
