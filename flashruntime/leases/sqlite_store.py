"""``SqliteLeaseStore``: lease state in a SQLite file that survives ``kill -9``.

State lives in SQLite, not in a Python cache: each call reads the rows it
touches through an index and returns fresh ``TaskRecord`` objects. WAL with
``synchronous=FULL``, and ``BEGIN IMMEDIATE`` per transaction, so every
committed transition is durable and several processes may share the file.
Given a ``SqliteDatabase`` instead of a path, the store keeps its tables in that
database and shares its transaction, so other stores' writes made inside it (the
coordinator's events) commit with the transition.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from flashruntime.errors import SchemaVersionError
from flashruntime.leases import _sqlite_sql as sql
from flashruntime.leases._models import (
    coerce_now,
    epoch,
    from_epoch,
    lease_from_json,
    lease_to_json,
    spec_from_json,
    spec_to_json,
)
from flashruntime.leases._sqlite_migrate import migrate_single_document, single_document_layout
from flashruntime.leases._stored_history import StoredHistory, load_history
from flashruntime.leases.store import LeaseStore, TaskRecord
from flashruntime.protocol.v1alpha1 import Lease, TaskState
from flashruntime.db.sqlite import SqliteDatabase, has_table, recorded_version
from flashruntime.db.sqlite_errors import translate_sqlite_errors

__all__ = ["SCHEMA_VERSION", "UNVERSIONED", "UPGRADES_FROM", "SqliteLeaseStore", "stored_schema_version"]

SCHEMA_VERSION = sql.SCHEMA_VERSION
# A ``lease_tasks`` table with no version recorded beside it: the single-document layout,
# which the constructor migrates, or tables made before the version was stamped.
UNVERSIONED = "unversioned"
UPGRADES_FROM = ("2", UNVERSIONED)  # what the constructor brings to SCHEMA_VERSION in place

_STATES = {state.value: state for state in TaskState}
_ALL_COLUMNS = tuple(range(len(sql.MUTABLE)))
_ACTIVE_JSON = sql.MUTABLE.index("active_lease_json")
_ROW_WIDTH = 4 + len(sql.MUTABLE)
_LEASED = TaskState.LEASED
_record_new = TaskRecord.__new__
PAGE_SIZE = 2048


def stored_schema_version(connection: sqlite3.Connection) -> str | None:
    """The lease store's schema version recorded in the database of ``connection`` (read-only
    will do): ``UNVERSIONED`` for lease tables without one, None where there are none. Reads only."""
    version = recorded_version(connection, "lease_meta")
    if version is None and has_table(connection, "lease_tasks"):
        return UNVERSIONED
    return version


@translate_sqlite_errors(lambda store: f"lease store {store.path}")
class SqliteLeaseStore(LeaseStore):
    """A ``LeaseStore`` in a SQLite file; implements every optional accelerator.

    ``path`` is the file (the store opens and owns its connection), or a
    ``SqliteDatabase`` whose connection and transaction the store shares (its owner
    closes it). The constructor creates the parent directory and the schema, or
    migrates the single-document layout; nothing else is read until a call asks for it.
    """

    def __init__(self, path: str | Path | SqliteDatabase, *, busy_timeout_ms: int = 5000) -> None:
        if isinstance(path, SqliteDatabase):
            db, self._owns_db = path, False
        else:
            # A new file gets 2 KiB pages (an existing one keeps its own: SQLite ignores this
            # once the file has content, and WAL fixes it). A transition rewrites a handful
            # of b-tree leaves (the row, four to five index entries, a history row), each a
            # whole page in the WAL, so smaller pages mean fewer bytes per commit and fsync;
            # 2 KiB still holds a typical task row without overflow pages.
            db, self._owns_db = SqliteDatabase(path, busy_timeout_ms=busy_timeout_ms, page_size=PAGE_SIZE), True
        self.database = db
        self.path = db.path
        self._lock = db.lock
        self._conn = db.connection
        self._txn = db.transaction()
        try:
            self._ensure_schema()
        except BaseException:
            if self._owns_db:
                db.close()
            raise

    # --- lifecycle ----------------------------------------------------------

    def close(self) -> None:
        """Close the connection this store opened; one on a shared database is its owner's to close."""
        if self._owns_db:
            self.database.close()

    def __enter__(self) -> SqliteLeaseStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SqliteLeaseStore({str(self.path)!r})"

    def _ensure_schema(self) -> None:
        conn = self._conn
        if self._version() == sql.SCHEMA_VERSION:
            return
        with self._txn:
            version = self._version()
            if version == sql.SCHEMA_VERSION:
                return
            if version == "2":
                conn.execute(sql.UPGRADE_FROM_2)
                conn.execute(sql.PUT_VERSION, (sql.SCHEMA_VERSION,))
                return
            if version is not None:
                raise SchemaVersionError(
                    f"{self.path}: lease schema version {version!r} is not one this flashruntime reads "
                    f"(it reads {sql.SCHEMA_VERSION!r}, and upgrades '2' in place); open it with the version that wrote it"
                )
            if single_document_layout(conn):
                migrate_single_document(conn)
            for statement in sql.SCHEMA:
                conn.execute(statement)
            conn.execute(sql.PUT_VERSION, (sql.SCHEMA_VERSION,))

    def _version(self) -> str | None:
        try:
            row = self._conn.execute(sql.GET_VERSION).fetchone()
        except sqlite3.OperationalError:  # no lease_meta table yet
            return None
        return None if row is None else str(row[0])

    # --- transactions -------------------------------------------------------

    def transaction(self) -> Any:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` around a read-modify-write; re-entrant. On a shared
        ``SqliteDatabase`` it is that database's transaction: what any of its stores writes
        inside it commits together with the transition."""
        return self._txn

    # --- required methods ---------------------------------------------------

    def add(self, record: TaskRecord) -> None:
        spec = record.spec
        with self._txn:
            conn = self._conn
            if conn.execute(sql.EXISTS, (spec.job_id, spec.task_id)).fetchone() is not None:
                raise ValueError(
                    f"duplicate task: job {spec.job_id!r} already has task {spec.task_id!r}; "
                    "task ids must be unique within a job"
                )
            seq = conn.execute(sql.NEXT_SEQ).fetchone()[0]
            lease = record.active_lease
            leased = record.state is _LEASED and lease is not None
            conn.execute(
                sql.INSERT,
                (
                    spec.job_id,
                    spec.task_id,
                    seq,
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
                ),
            )
            self._insert_history(record, record.lease_history.items())
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
        with self._txn:
            conn = self._conn
            if changed is None:
                cursor = conn.execute(sql.UPDATE, (*values, spec.job_id, spec.task_id))
                if cursor.rowcount != 1:
                    raise ValueError(
                        f"task {spec.task_id!r} of job {spec.job_id!r} is not in this store; add() it first"
                    )
            elif changed:
                conn.execute(sql.update(changed), (*[values[i] for i in changed], spec.job_id, spec.task_id))
            if loaded is None:
                self._insert_history(record, history.items(), lease, lease_json)
            else:
                persisted = loaded.persisted
                fresh = [(key, value) for key, value in history.items() if key not in persisted]
                if fresh:
                    self._insert_history(record, fresh, lease, lease_json)
                    persisted.update(key for key, _ in fresh)
                loaded.stored = values
                loaded.stored_lease = lease

    def get(self, job_id: str, task_id: str) -> TaskRecord | None:
        with self._lock:
            row = self._conn.execute(sql.GET, (job_id, task_id)).fetchone()
            return None if row is None else self._record(row)

    def next_pending(self, job_id: str | None = None) -> TaskRecord | None:
        with self._lock:
            if job_id is None:
                row = self._conn.execute(sql.NEXT_PENDING).fetchone()
            else:
                row = self._conn.execute(sql.NEXT_PENDING_JOB, (job_id,)).fetchone()
            return None if row is None else self._record(row)

    def leased(self) -> list[TaskRecord]:
        with self._lock:
            return [self._record(row) for row in self._conn.execute(sql.LEASED).fetchall()]

    def all(self, job_id: str | None = None) -> list[TaskRecord]:
        with self._lock:
            conn = self._conn
            if job_id is None:
                rows = conn.execute(sql.ALL).fetchall()
                history_rows = conn.execute(sql.ALL_HISTORY).fetchall()
            else:
                rows = conn.execute(sql.ALL_JOB, (job_id,)).fetchall()
                history_rows = conn.execute(sql.ALL_HISTORY_JOB, (job_id,)).fetchall()
        histories: dict[tuple[str, str], list[tuple[str, str]]] = {}
        for hist_job, hist_task, lease_id, lease_json in history_rows:
            histories.setdefault((hist_job, hist_task), []).append((lease_id, lease_json))
        return [self._record(row, histories.get((row[0], row[1]), ())) for row in rows]

    records = all

    # --- optional accelerators ----------------------------------------------

    def pending_page(self, job_id: str | None, after_seq: int, limit: int) -> list[TaskRecord]:
        if limit <= 0:
            return []
        with self._lock:
            if job_id is None:
                rows = self._conn.execute(sql.PENDING_PAGE, (after_seq, limit)).fetchall()
            else:
                rows = self._conn.execute(sql.PENDING_PAGE_JOB, (job_id, after_seq, limit)).fetchall()
            return [self._record(row) for row in rows]

    def expired(self, now: datetime) -> list[TaskRecord]:
        """LEASED records whose deadline is at or before ``now``, in ``(deadline, seq)`` order."""
        with self._lock:
            rows = self._conn.execute(sql.EXPIRED, (epoch(coerce_now(now)),)).fetchall()
            return [self._record(row) for row in rows] if rows else []

    def find_lease(self, lease_id: str) -> TaskRecord | None:
        with self._lock:
            rows = self._conn.execute(sql.FIND_LEASE, (lease_id,)).fetchall()
        if not rows:
            return None
        # one row per lease of the task's history (the lease asked for is one of them)
        return self._record(rows[0], [(row[_ROW_WIDTH], row[_ROW_WIDTH + 1]) for row in rows])

    def has_lease(self, lease_id: str) -> bool:
        """Whether a lease with this id was ever issued here (a primary-key probe of
        ``lease_history``; the manager asks it for every fresh lease id)."""
        with self._lock:
            return self._conn.execute(sql.HAS_LEASE, (lease_id,)).fetchone() is not None

    def leased_by_node(self, node_id: str) -> list[TaskRecord]:
        with self._lock:
            return [self._record(row) for row in self._conn.execute(sql.LEASED_BY_NODE, (node_id,)).fetchall()]

    def counts(self, job_id: str | None = None) -> dict[str, int]:
        with self._lock:
            if job_id is None:
                rows = self._conn.execute(sql.COUNTS_ALL).fetchall()
            else:
                rows = self._conn.execute(sql.COUNTS_JOB, (job_id,)).fetchall()
        return {str(state): int(n) for state, n in rows if n}

    def put_cordon(self, node_id: str, until: datetime | None, reason: str) -> None:
        with self._txn:
            self._conn.execute(sql.PUT_CORDON, (node_id, None if until is None else epoch(coerce_now(until)), reason))

    def remove_cordon(self, node_id: str) -> bool:
        with self._txn:
            return self._conn.execute(sql.REMOVE_CORDON, (node_id,)).rowcount > 0

    def cordons(self) -> dict[str, tuple[datetime | None, str]]:
        with self._lock:
            rows = self._conn.execute(sql.CORDONS).fetchall()
        return {node_id: (None if until is None else from_epoch(until), reason) for node_id, until, reason in rows}

    def cordon_for(self, node_id: str) -> tuple[datetime | None, str] | None:
        with self._lock:
            row = self._conn.execute(sql.CORDON_FOR, (node_id,)).fetchone()
        if row is None:
            return None
        until, reason = row
        return (None if until is None else from_epoch(until), reason)

    # --- rows <-> records ---------------------------------------------------

    def _record(self, row: tuple[Any, ...], history_rows: Iterable[tuple[str, str]] | None = None) -> TaskRecord:
        """A fresh record from a row of ``sql.COLUMNS`` and its lease history.

        ``history_rows`` None = read them now; a record never claimed has none.
        """
        job_id, task_id, seq, spec_json, state, attempts_used, failures_seen, expiries_seen = row[:8]
        row = row[:_ROW_WIDTH]
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
        if history_rows is None and (attempts_used or active_json is not None):
            history_rows = self._conn.execute(sql.HISTORY, (job_id, task_id)).fetchall()
        record.lease_history = load_history(row[4:], active, active_json, history_rows or (), payload)
        return record

    def _insert_history(
        self,
        record: TaskRecord,
        items: Iterable[tuple[str, Lease]],
        active: Lease | None = None,
        active_json: str | None = None,
    ) -> None:
        spec = record.spec
        conn = self._conn
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
