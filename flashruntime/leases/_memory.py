"""``InMemoryLeaseStore``: records are live objects, kept findable by indexes so
that no claim, heartbeat, commit or sweep looks at more than the records it
touches.

Indexes, all maintained by ``add`` and ``save``: the pending queue (global and
per job, ordered by ``seq``), lease id -> record, node -> its LEASED records,
per-job state counts, and an expiry heap of ``(deadline, seq, lease_id)`` whose
outdated entries are dropped lazily.
"""

from __future__ import annotations

import threading
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Iterator
from datetime import datetime
from heapq import heapify, heappop, heappush

from flashruntime.leases._models import UTC, coerce_now
from flashruntime.leases._record import TaskRecord
from flashruntime.protocol.v1alpha1 import TaskState

__all__ = ["InMemoryLeaseStore"]

_PENDING = TaskState.PENDING
_LEASED = TaskState.LEASED


class _SeqSet:
    """An ordered set of ints (a sorted list of short blocks): O(log n) add and
    discard, O(1) first, ordered iteration from any key. Appends in increasing
    order, the common case, touch only the last block."""

    __slots__ = ("_blocks", "_maxes", "_size")

    _LOAD = 256

    def __init__(self) -> None:
        self._blocks: list[list[int]] = []
        self._maxes: list[int] = []
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def add(self, value: int) -> None:
        blocks = self._blocks
        maxes = self._maxes
        self._size += 1
        if not blocks:
            blocks.append([value])
            maxes.append(value)
            return
        if value > maxes[-1]:
            last = blocks[-1]
            if len(last) < self._LOAD:
                last.append(value)
                maxes[-1] = value
            else:
                blocks.append([value])
                maxes.append(value)
            return
        i = bisect_left(maxes, value)
        block = blocks[i]
        insort(block, value)
        if len(block) > 2 * self._LOAD:
            half = len(block) >> 1
            blocks.insert(i + 1, block[half:])
            maxes.insert(i + 1, block[-1])
            del block[half:]
            maxes[i] = block[-1]

    def discard(self, value: int) -> bool:
        blocks = self._blocks
        if not blocks:
            return False
        maxes = self._maxes
        first = blocks[0]
        if first[0] == value:  # the common case: the head of the queue was claimed
            i, j, block = 0, 0, first
        else:
            i = bisect_left(maxes, value)
            if i == len(maxes):
                return False
            block = blocks[i]
            j = bisect_left(block, value)
            if j == len(block) or block[j] != value:
                return False
        del block[j]
        self._size -= 1
        if not block:
            del blocks[i]
            del maxes[i]
        elif j == len(block):
            maxes[i] = block[-1]
        return True

    def first(self) -> int | None:
        blocks = self._blocks
        return blocks[0][0] if blocks else None

    def after(self, key: int) -> Iterator[int]:
        """Members greater than ``key``, ascending. Do not mutate while iterating."""
        maxes = self._maxes
        i = bisect_right(maxes, key)
        if i == len(maxes):
            return
        blocks = self._blocks
        block = blocks[i]
        yield from block[bisect_right(block, key) :]
        for block in blocks[i + 1 :]:
            yield from block


class _Entry:
    """A record and what the indexes currently say about it."""

    __slots__ = ("record", "state", "node_id", "lease_id", "deadline")

    def __init__(self, record: TaskRecord) -> None:
        self.record = record
        self.state: TaskState | None = None
        self.node_id: str | None = None
        self.lease_id: str | None = None
        self.deadline: datetime | None = None


class InMemoryLeaseStore:
    """A ``LeaseStore`` (every operation of it): insertion-ordered records keyed by
    ``(job_id, task_id)``, with indexes.

    ``save`` persists nothing (records are live objects) but brings the indexes
    up to date, so the manager's ``save`` after each mutation is what keeps
    claim/heartbeat/complete O(1) or O(log n). Like every store, mutate records
    inside ``transaction()``.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._records: dict[tuple[str, str], TaskRecord] = {}
        self._entries: dict[int, _Entry] = {}
        self._next_seq = 1
        self._job_records: dict[str, list[TaskRecord]] = {}
        self._pending = _SeqSet()
        # Per-job pending queues exist once a per-job query has asked for them.
        self._job_pending: dict[str, _SeqSet] = {}
        self._by_lease: dict[str, TaskRecord] = {}
        # ``has_lease(lease_id) -> bool`` (the optional test the manager runs on each fresh
        # lease id): the lease index's own C-level membership test, no Python frame per claim.
        self.has_lease = self._by_lease.__contains__
        # ``find_lease(lease_id) -> record | None`` (heartbeat, complete): likewise the index's own get.
        self.find_lease: Callable[[str], TaskRecord | None] = self._by_lease.get
        self._by_node: dict[str, dict[int, TaskRecord]] = {}
        self._expiry: list[tuple[datetime, int, str]] = []
        self._compact_at = _COMPACT_SLACK
        self._counts: dict[str, dict[TaskState, int]] = {}
        self._cordons: dict[str, tuple[datetime | None, str]] = {}
        # ``cordon_for(node_id) -> (until, reason) | None``, asked by every claim; the dict is never replaced.
        self.cordon_for: Callable[[str], tuple[datetime | None, str] | None] = self._cordons.get

    # --- transactions -----------------------------------------------------

    def transaction(self) -> threading.RLock:
        """A re-entrant lock serialising read-modify-write sequences (it is its own context manager)."""
        return self._lock

    # --- required methods -------------------------------------------------

    def add(self, record: TaskRecord) -> None:
        spec = record.spec
        job_id = spec.job_id
        key = (job_id, spec.task_id)
        with self._lock:
            if key in self._records:
                raise ValueError(
                    f"duplicate task: job {job_id!r} already has task {spec.task_id!r}; "
                    "task ids must be unique within a job"
                )
            seq = self._next_seq
            self._next_seq = seq + 1
            record.seq = seq
            self._records[key] = record
            job_records = self._job_records.get(job_id)
            if job_records is None:
                job_records = self._job_records[job_id] = []
                self._counts[job_id] = dict.fromkeys(TaskState, 0)
            job_records.append(record)
            for lease_id in record.lease_history:
                self._by_lease[lease_id] = record
            self._entries[seq] = _Entry(record)
            self.save(record)

    def get(self, job_id: str, task_id: str) -> TaskRecord | None:
        return self._records.get((job_id, task_id))

    def next_pending(self, job_id: str | None = None) -> TaskRecord | None:
        queue = self._pending if job_id is None else self._job_queue(job_id)
        if queue is None:
            return None
        blocks = queue._blocks
        return self._entries[blocks[0][0]].record if blocks else None

    def leased(self) -> list[TaskRecord]:
        with self._lock:
            out = [record for records in self._by_node.values() for record in records.values()]
        out.sort(key=_seq_of)
        return out

    def all(self, job_id: str | None = None) -> list[TaskRecord]:
        with self._lock:
            if job_id is None:
                return list(self._records.values())
            return list(self._job_records.get(job_id, ()))

    records = all

    # --- optional accelerators --------------------------------------------

    def pending_page(self, job_id: str | None, after_seq: int, limit: int) -> list[TaskRecord]:
        with self._lock:
            queue = self._pending if job_id is None else self._job_queue(job_id)
            if queue is None or limit <= 0:
                return []
            entries = self._entries
            out: list[TaskRecord] = []
            for seq in queue.after(after_seq):
                out.append(entries[seq].record)
                if len(out) >= limit:
                    break
            return out

    def expired(self, now: datetime) -> list[TaskRecord]:
        """LEASED records whose active deadline is at or before ``now``, in ``(deadline, seq)`` order."""
        if now.tzinfo is not UTC:
            now = coerce_now(now)
        heap = self._expiry
        try:
            if not heap or heap[0][0] > now:  # the common case, decided without the lock
                return []
        except IndexError:  # emptied by a thread that holds the lock
            return []
        with self._lock:
            heap = self._expiry
            out: list[TaskRecord] = []
            keep: list[tuple[datetime, int, str]] = []
            entries = self._entries
            while heap and heap[0][0] <= now:
                entry = heappop(heap)
                record = entries[entry[1]].record
                if _entry_is_current(record, entry):
                    out.append(record)
                    keep.append(entry)
            for entry in keep:  # a query changes nothing: the caller decides what to release
                heappush(heap, entry)
            return out

    def leased_by_node(self, node_id: str) -> list[TaskRecord]:
        with self._lock:
            out = list(self._by_node.get(node_id, {}).values())
        out.sort(key=_seq_of)
        return out

    def counts(self, job_id: str | None = None) -> dict[str, int]:
        with self._lock:
            jobs = self._counts.values() if job_id is None else [self._counts.get(job_id, {})]
            total: dict[str, int] = {}
            for counts in jobs:
                for state, n in counts.items():
                    if n:
                        total[state.value] = total.get(state.value, 0) + n
            return total

    def put_cordon(self, node_id: str, until: datetime | None, reason: str) -> None:
        with self._lock:
            self._cordons[node_id] = (None if until is None else coerce_now(until), reason)

    def remove_cordon(self, node_id: str) -> bool:
        with self._lock:
            return self._cordons.pop(node_id, None) is not None

    def cordons(self) -> dict[str, tuple[datetime | None, str]]:
        with self._lock:
            return dict(self._cordons)

    # The class's own forms of the three lookups each instance answers with its index's
    # C-level method (bound in ``__init__``): what ``issubclass(InMemoryLeaseStore,
    # LeaseStore)`` and a subclass's ``super()`` find.

    def find_lease(self, lease_id: str) -> TaskRecord | None:
        return self._by_lease.get(lease_id)

    def has_lease(self, lease_id: str) -> bool:
        return lease_id in self._by_lease

    def cordon_for(self, node_id: str) -> tuple[datetime | None, str] | None:
        return self._cordons.get(node_id)

    # --- index maintenance ------------------------------------------------

    def _job_queue(self, job_id: str) -> _SeqSet | None:
        queue = self._job_pending.get(job_id)
        if queue is None:
            records = self._job_records.get(job_id)
            if records is None:
                return None
            with self._lock:
                queue = self._job_pending.get(job_id)
                if queue is None:
                    queue = _SeqSet()
                    entries = self._entries
                    for record in records:
                        if entries[record.seq].state is _PENDING:  # type: ignore[index]
                            queue.add(record.seq)  # type: ignore[arg-type]
                    self._job_pending[job_id] = queue
        return queue

    def save(self, record: TaskRecord) -> None:
        """Bring every index up to date with ``record``. Call inside ``transaction()``, as
        the manager does (the records are live objects: mutating them outside it races anyway)."""
        seq = record.seq
        entry = self._entries.get(seq)  # type: ignore[arg-type]
        if entry is None or entry.record is not record:
            raise ValueError(f"record {record.spec.job_id!r}/{record.spec.task_id!r} was not obtained from this store")
        state = record.state
        old = entry.state
        if old is not state:
            job_id = record.spec.job_id
            job_queue = self._job_pending.get(job_id) if self._job_pending else None
            if old is _PENDING:
                head = self._pending._blocks[0]
                if head[0] == seq and len(head) > 1:  # the common case: the queue's head was claimed
                    del head[0]
                    self._pending._size -= 1
                else:
                    self._pending.discard(seq)
                if job_queue is not None:
                    job_queue.discard(seq)
            elif state is _PENDING:
                self._pending.add(seq)
                if job_queue is not None:
                    job_queue.add(seq)
            counts = self._counts[job_id]
            if old is not None:
                counts[old] -= 1
            counts[state] += 1
            entry.state = state
        lease = record.active_lease
        if state is _LEASED and lease is not None:
            values = lease.__dict__  # one lookup instead of three pydantic attribute reads
            node_id = values["node_id"]
            if entry.node_id != node_id:
                if entry.node_id is not None:
                    self._unindex_node(entry.node_id, seq)  # type: ignore[arg-type]
                held = self._by_node.get(node_id)
                if held is None:
                    held = self._by_node[node_id] = {}
                held[seq] = record
                entry.node_id = node_id
            lease_id = values["lease_id"]
            deadline = values["deadline"]
            if entry.deadline != deadline or entry.lease_id != lease_id:
                self._by_lease[lease_id] = record
                heap = self._expiry
                heappush(heap, (deadline, seq, lease_id))  # type: ignore[misc]
                entry.lease_id = lease_id
                entry.deadline = deadline
                if len(heap) > self._compact_at:
                    self._compact_expiry()
        elif entry.node_id is not None:
            held = self._by_node.get(entry.node_id)  # _unindex_node, inlined: every commit comes here
            if held is not None:
                held.pop(seq, None)
                if not held:
                    del self._by_node[entry.node_id]
            heap = self._expiry
            if heap:
                last = heap[-1]
                # The lease ending is usually the newest push, still the heap's last leaf, and
                # dropping a last leaf keeps the heap in order: no outdated entry is left behind.
                if last[1] == seq and last[2] == entry.lease_id:
                    heap.pop()
            entry.node_id = entry.lease_id = entry.deadline = None
        elif entry.lease_id is not None:
            entry.lease_id = entry.deadline = None

    def _unindex_node(self, node_id: str, seq: int) -> None:
        held = self._by_node.get(node_id)
        if held is not None:
            held.pop(seq, None)
            if not held:
                del self._by_node[node_id]

    def _compact_expiry(self) -> None:
        """Drop outdated expiry entries; amortised O(1) per push (the next compaction
        waits until the heap has grown by at least its live size plus a slack)."""
        entries = self._entries
        heap = []
        for item in self._expiry:
            entry = entries[item[1]]  # the index's own view of the record: LEASED iff lease_id is set
            if entry.lease_id == item[2] and entry.deadline == item[0]:
                heap.append(item)
        heapify(heap)
        self._expiry = heap
        self._compact_at = 2 * len(heap) + _COMPACT_SLACK


_COMPACT_SLACK = 1024


def _entry_is_current(record: TaskRecord, entry: tuple[datetime, int, str]) -> bool:
    lease = record.active_lease
    return (
        record.state is _LEASED
        and lease is not None
        and lease.lease_id == entry[2]
        and lease.deadline == entry[0]
    )


def _seq_of(record: TaskRecord) -> int:
    return record.seq  # type: ignore[return-value]
