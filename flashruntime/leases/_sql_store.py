"""``SqlLeaseStore``: what the SQLite and PostgreSQL lease stores share. Both keep one row
per task (``_sql.COLUMNS``) and a lease history table, and return fresh ``TaskRecord``
objects from every read; this base holds the database's lifecycle, the transaction, the
encoding of a record into its row, ``save``'s change detection (only what changed since the
record was read is written) and every call whose SQL reads the same in both. A dialect
gives its statements (``_sql``) and how it reaches a connection.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager
from datetime import datetime
from types import ModuleType
from typing import Any, ClassVar

from flashruntime.db.owned import DatabaseStore
from flashruntime.leases._models import (
    coerce_now,
    epoch,
    from_epoch,
    lease_from_json,
    lease_to_json,
    spec_from_json,
    spec_to_json,
)
from flashruntime.leases._sql import MUTABLE
from flashruntime.leases._stored_history import StoredHistory, load_history
from flashruntime.leases.store import LeaseStore, TaskRecord
from flashruntime.protocol.v1alpha1 import Lease, TaskSpec, TaskState

__all__ = ["SqlLeaseStore"]

_STATES = {state.value: state for state in TaskState}
_ALL_COLUMNS = tuple(range(len(MUTABLE)))
_ACTIVE_JSON = MUTABLE.index("active_lease_json")
_ROW_WIDTH = 4 + len(MUTABLE)  # the key, seq, spec, then MUTABLE
_LEASED = TaskState.LEASED
_record_new = TaskRecord.__new__
HistoryRows = list[tuple[str, str]]


class SqlLeaseStore(DatabaseStore[Any], LeaseStore):
    """A ``LeaseStore`` in a SQL database; implements every optional operation.

    A dialect sets ``_sql`` (its statements module: the names of ``_sql`` and its own) and
    implements ``_reading``, ``_writing``, ``_insert``, ``_histories_of`` and
    ``find_lease``; it overrides ``_locking`` where reads inside a transaction lock rows and
    ``_storable`` where some text cannot be stored.
    """

    _sql: ClassVar[ModuleType]
    _txn: Any

    # --- what a dialect gives ---------------------------------------------------

    def _reading(self) -> AbstractContextManager[Any]:
        """``with``: a connection to read on (the transaction's, inside one)."""
        raise NotImplementedError

    def _writing(self) -> AbstractContextManager[Any]:
        """``with``: a connection inside the store's transaction (joining an open one)."""
        raise NotImplementedError

    def _locking(self) -> bool:
        """Whether reads should take the ``_LOCKED`` statements (inside a transaction that
        locks the rows it acts on)."""
        return False

    def _storable(self, value: str) -> bool:
        """Whether the database can hold the text ``value``: a lookup by one it cannot hold
        finds nothing, and storing one is refused."""
        return True

    def _insert(self, conn: Any, spec: TaskSpec, values: tuple[Any, ...]) -> int | None:
        """Insert the task row of ``spec`` with ``values`` (``_sql.INSERTED``); its ``seq``, or
        None when the task is stored already (nothing is inserted then)."""
        raise NotImplementedError

    def _histories_of(self, conn: Any, keys: list[tuple[str, str]]) -> dict[tuple[str, str], HistoryRows]:
        """The lease history rows of several tasks, by ``(job_id, task_id)``, in issue order."""
        raise NotImplementedError

    # --- transactions -------------------------------------------------------------

    def transaction(self) -> Any:
        """The database's transaction, re-entrant: what any store on the same database writes
        inside it commits together with the transition (see the dialect for how transactions
        of several threads and processes meet)."""
        return self._txn

    # --- required methods ---------------------------------------------------------

    def add(self, record: TaskRecord) -> None:
        spec = record.spec
        if not (self._storable(spec.job_id) and self._storable(spec.task_id)):
            raise ValueError(f"task {spec.task_id!r} of job {spec.job_id!r}: ids cannot contain NUL characters")
        lease = record.active_lease
        leased = record.state is _LEASED and lease is not None
        values = (
            spec_to_json(spec),
            record.state.value,
            record.attempts_used,
            record.failures_seen,
            record.expiries_seen,
            lease.lease_id if lease is not None else None,
            lease.node_id if lease is not None else None,
            epoch(lease.deadline) if leased else None,  # type: ignore[union-attr]
            lease_to_json(lease) if lease is not None else None,
            record.accepted_attempt_id,
            record.accepted_output_sha256,
            record.releases_seen,
        )
        with self._writing() as conn:
            seq = self._insert(conn, spec, values)
            if seq is None:
                raise ValueError(
                    f"duplicate task: job {spec.job_id!r} already has task {spec.task_id!r}; "
                    "task ids must be unique within a job"
                )
            self._insert_history(conn, record, record.lease_history.items())
            record.seq = seq

    def save(self, record: TaskRecord) -> None:
        spec = record.spec
        state = record.state
        lease = record.active_lease
        history = record.lease_history
        loaded = history if history.__class__ is StoredHistory else None
        stored = None if loaded is None else loaded.stored
        if lease is None:
            lease_id = node_id = deadline = lease_json = None
        else:
            lease_id = lease.lease_id
            node_id = lease.node_id
            if not self._storable(node_id):
                raise ValueError(f"node id {node_id!r} cannot contain NUL characters")
            deadline = epoch(lease.deadline) if state is _LEASED else None
            stored_lease = None if stored is None else loaded.stored_lease  # type: ignore[union-attr]
            if stored_lease is not None and (lease is stored_lease or lease.__dict__ == stored_lease.__dict__):
                lease_json = stored[_ACTIVE_JSON]  # unchanged since it was read: no need to encode it
            else:
                lease_json = lease_to_json(lease)
        values = (
            state.value,
            record.attempts_used,
            record.failures_seen,
            record.expiries_seen,
            lease_id,
            node_id,
            deadline,
            lease_json,
            record.accepted_attempt_id,
            record.accepted_output_sha256,
            record.releases_seen,
        )
        if stored is None:
            changed: tuple[int, ...] | None = None
        elif values == stored:
            changed = ()
        else:
            changed = tuple([i for i in _ALL_COLUMNS if values[i] != stored[i]])
        sql = self._sql
        with self._writing() as conn:
            if changed is None:
                cursor = conn.execute(sql.UPDATE, (*values, spec.job_id, spec.task_id))
                if cursor.rowcount != 1:
                    raise ValueError(
                        f"task {spec.task_id!r} of job {spec.job_id!r} is not in this store; add() it first"
                    )
            elif changed:
                conn.execute(sql.update(changed), (*[values[i] for i in changed], spec.job_id, spec.task_id))
            if loaded is None:
                self._insert_history(conn, record, history.items(), lease, lease_json)
            else:
                persisted = loaded.persisted
                fresh = [(key, value) for key, value in history.items() if key not in persisted]
                if fresh:
                    self._insert_history(conn, record, fresh, lease, lease_json)
                    persisted.update(key for key, _ in fresh)
                loaded.stored = values
                loaded.stored_lease = lease

    def get(self, job_id: str, task_id: str) -> TaskRecord | None:
        if not (self._storable(job_id) and self._storable(task_id)):
            return None
        sql = self._sql
        with self._reading() as conn:
            row = conn.execute(sql.GET_LOCKED if self._locking() else sql.GET, (job_id, task_id)).fetchone()
            return None if row is None else self._records(conn, [row])[0]

    def next_pending(self, job_id: str | None = None) -> TaskRecord | None:
        sql = self._sql
        locked = self._locking()
        with self._reading() as conn:
            if job_id is None:
                row = conn.execute(sql.NEXT_PENDING_LOCKED if locked else sql.NEXT_PENDING).fetchone()
            elif self._storable(job_id):
                row = conn.execute(sql.NEXT_PENDING_JOB_LOCKED if locked else sql.NEXT_PENDING_JOB,
                                   (job_id,)).fetchone()
            else:
                row = None
            return None if row is None else self._records(conn, [row])[0]

    def leased(self) -> list[TaskRecord]:
        with self._reading() as conn:
            return self._records(conn, conn.execute(self._sql.LEASED).fetchall())

    def all(self, job_id: str | None = None) -> list[TaskRecord]:
        if job_id is not None and not self._storable(job_id):
            return []
        sql = self._sql
        with self._reading() as conn:
            # Rows first, then histories: a history only grows, so it holds every lease the rows name.
            if job_id is None:
                rows = conn.execute(sql.ALL).fetchall()
                history_rows = conn.execute(sql.ALL_HISTORY).fetchall()
            else:
                rows = conn.execute(sql.ALL_JOB, (job_id,)).fetchall()
                history_rows = conn.execute(sql.ALL_HISTORY_JOB, (job_id,)).fetchall()
        histories: dict[tuple[str, str], HistoryRows] = {}
        for hist_job, hist_task, lease_id, lease_json in history_rows:
            histories.setdefault((hist_job, hist_task), []).append((lease_id, lease_json))
        return [self._record(row, histories.get((row[0], row[1]), ())) for row in rows]

    records = all

    # --- optional operations ------------------------------------------------------

    def pending_page(self, job_id: str | None, after_seq: int, limit: int) -> list[TaskRecord]:
        """Up to ``limit`` PENDING records after ``after_seq``, in ``seq`` order, read without
        locks: a claim locks only the task it chose, so claimers running at once never hide
        the rest of the queue from one another."""
        if limit <= 0 or (job_id is not None and not self._storable(job_id)):
            return []
        sql = self._sql
        with self._reading() as conn:
            if job_id is None:
                rows = conn.execute(sql.PENDING_PAGE, (after_seq, limit)).fetchall()
            else:
                rows = conn.execute(sql.PENDING_PAGE_JOB, (job_id, after_seq, limit)).fetchall()
            return self._records(conn, rows)

    def expired(self, now: datetime) -> list[TaskRecord]:
        """LEASED records whose deadline is at or before ``now``, in ``(deadline, seq)`` order."""
        sql = self._sql
        with self._reading() as conn:
            statement = sql.EXPIRED_LOCKED if self._locking() else sql.EXPIRED
            rows = conn.execute(statement, (epoch(coerce_now(now)),)).fetchall()
            return self._records(conn, rows) if rows else []

    def has_lease(self, lease_id: str) -> bool:
        """Whether a lease with this id was ever issued here (a primary-key probe of
        ``lease_history``; the manager asks it for every fresh lease id)."""
        if not self._storable(lease_id):
            return False
        with self._reading() as conn:
            return conn.execute(self._sql.HAS_LEASE, (lease_id,)).fetchone() is not None

    def leased_by_node(self, node_id: str) -> list[TaskRecord]:
        if not self._storable(node_id):
            return []
        with self._reading() as conn:
            return self._records(conn, conn.execute(self._sql.LEASED_BY_NODE, (node_id,)).fetchall())

    def counts(self, job_id: str | None = None) -> dict[str, int]:
        if job_id is not None and not self._storable(job_id):
            return {}
        sql = self._sql
        with self._reading() as conn:
            if job_id is None:
                rows = conn.execute(sql.COUNTS_ALL).fetchall()
            else:
                rows = conn.execute(sql.COUNTS_JOB, (job_id,)).fetchall()
        return {str(state): int(n) for state, n in rows if n}

    def put_cordon(self, node_id: str, until: datetime | None, reason: str) -> None:
        if not (self._storable(node_id) and self._storable(reason)):
            raise ValueError(f"cordon of {node_id!r}: the node id and reason cannot contain NUL characters")
        with self._writing() as conn:
            conn.execute(self._sql.PUT_CORDON, (node_id, None if until is None else epoch(coerce_now(until)), reason))

    def remove_cordon(self, node_id: str) -> bool:
        if not self._storable(node_id):
            return False
        with self._writing() as conn:
            return int(conn.execute(self._sql.REMOVE_CORDON, (node_id,)).rowcount) > 0

    def cordons(self) -> dict[str, tuple[datetime | None, str]]:
        with self._reading() as conn:
            rows = conn.execute(self._sql.CORDONS).fetchall()
        return {node_id: (None if until is None else from_epoch(until), reason) for node_id, until, reason in rows}

    def cordon_for(self, node_id: str) -> tuple[datetime | None, str] | None:
        if not self._storable(node_id):
            return None
        with self._reading() as conn:
            row = conn.execute(self._sql.CORDON_FOR, (node_id,)).fetchone()
        if row is None:
            return None
        until, reason = row
        return (None if until is None else from_epoch(until), reason)

    # --- rows <-> records ---------------------------------------------------------

    def _records(self, conn: Any, rows: list[tuple[Any, ...]]) -> list[TaskRecord]:
        """Fresh records from rows of ``COLUMNS``, their lease histories read on ``conn`` after
        the rows (so they hold every lease the rows name)."""
        # A record never claimed has no history: only the others are looked up.
        keyed = [(row[0], row[1]) for row in rows if row[5] or row[11] is not None]
        if len(keyed) == 1:
            histories = {keyed[0]: conn.execute(self._sql.HISTORY, keyed[0]).fetchall()}
        else:
            histories = self._histories_of(conn, keyed) if keyed else {}
        return [self._record(row, histories.get((row[0], row[1]), ())) for row in rows]

    def _record(self, row: tuple[Any, ...], history_rows: Iterable[tuple[str, str]]) -> TaskRecord:
        """A fresh record from a row of ``COLUMNS`` (columns after them are ignored) and its
        lease history."""
        _, _, seq, spec_json, state, attempts_used, failures_seen, expiries_seen = row[:8]
        spec = spec_from_json(spec_json)
        payload = spec.payload
        record = _record_new(TaskRecord)
        record.spec = spec
        record.state = _STATES[state]
        record.attempts_used = attempts_used
        record.failures_seen = failures_seen
        record.expiries_seen = expiries_seen
        active_json = row[11]
        active = None if active_json is None else lease_from_json(active_json, payload)
        record.active_lease = active
        record.accepted_attempt_id = row[12]
        record.accepted_output_sha256 = row[13]
        record.releases_seen = row[14]
        record.seq = seq
        record.lease_history = load_history(tuple(row[4:_ROW_WIDTH]), active, active_json, history_rows, payload)
        return record

    def _insert_history(
        self,
        conn: Any,
        record: TaskRecord,
        items: Iterable[tuple[str, Lease]],
        active: Lease | None = None,
        active_json: str | None = None,
    ) -> None:
        spec = record.spec
        sql = self._sql
        for lease_id, lease in items:
            lease_json = active_json if lease is active and active_json is not None else lease_to_json(lease)
            cursor = conn.execute(sql.INSERT_HISTORY, (lease_id, spec.job_id, spec.task_id, lease_json))
            if cursor.rowcount == 0:
                owner = conn.execute(sql.HISTORY_OWNER, (lease_id,)).fetchone()
                if owner is not None and tuple(owner) != (spec.job_id, spec.task_id):
                    raise ValueError(
                        f"lease id {lease_id!r} already belongs to task {owner[1]!r} of job {owner[0]!r}; "
                        "lease ids must be unique"
                    )
