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
from pathlib import Path
from typing import Any

from flashruntime.db.sqlite import SqliteDatabase, has_table, recorded_version
from flashruntime.db.sqlite_errors import translate_sqlite_errors
from flashruntime.leases import _sqlite_sql as sql
from flashruntime.leases._sql_store import _ROW_WIDTH, HistoryRows, SqlLeaseStore
from flashruntime.leases._sqlite_migrate import migrate_single_document, single_document_layout
from flashruntime.leases.store import TaskRecord
from flashruntime.protocol.v1alpha1 import TaskSpec

__all__ = ["SCHEMA_VERSION", "UNVERSIONED", "UPGRADES_FROM", "SqliteLeaseStore", "stored_schema_version"]

SCHEMA_VERSION = sql.SCHEMA_VERSION
# A ``lease_tasks`` table with no version recorded beside it: the single-document layout,
# which the constructor migrates, or tables made before the version was stamped.
UNVERSIONED = "unversioned"
UPGRADES_FROM = (*sql.UPGRADES, UNVERSIONED)  # what the constructor brings to SCHEMA_VERSION in place
# A new file gets 2 KiB pages (an existing one keeps its own: SQLite ignores this once the
# file has content, and WAL fixes it). A transition rewrites a handful of b-tree leaves (the
# row, four to five index entries, a history row), each a whole page in the WAL, so smaller
# pages mean fewer bytes per commit and fsync; 2 KiB still holds a typical task row without
# overflow pages.
PAGE_SIZE = 2048


def stored_schema_version(connection: sqlite3.Connection) -> str | None:
    """The lease store's schema version recorded in the database of ``connection`` (read-only
    will do): ``UNVERSIONED`` for lease tables without one, None where there are none. Reads only."""
    version = recorded_version(connection, sql.META_TABLE)
    if version is None and has_table(connection, "lease_tasks"):
        return UNVERSIONED
    return version


def _migrate(conn: sqlite3.Connection) -> None:
    if single_document_layout(conn):
        migrate_single_document(conn)


class _Using:
    """``with``: the store's connection (read when entered), under ``guard``: its database's
    lock for a read, its transaction for a write."""

    __slots__ = ("_guard", "_store")

    def __init__(self, store: SqliteLeaseStore, guard: Any) -> None:
        self._store = store
        self._guard = guard

    def __enter__(self) -> sqlite3.Connection:
        self._guard.__enter__()
        return self._store._conn

    def __exit__(self, *exc: object) -> None:
        self._guard.__exit__(*exc)


@translate_sqlite_errors(lambda store: f"lease store {store.path}")
class SqliteLeaseStore(SqlLeaseStore):
    """A ``LeaseStore`` in a SQLite file; implements every optional accelerator.

    ``path`` is the file (the store opens and owns its connection), or a
    ``SqliteDatabase`` whose connection and transaction the store shares (its owner
    closes it). The constructor creates the parent directory and the schema, or
    migrates the single-document layout; nothing else is read until a call asks for it.
    """

    _sql = sql

    def __init__(self, path: str | Path | SqliteDatabase, *, busy_timeout_ms: int = 5000) -> None:
        db = self._open_database(
            path, SqliteDatabase, lambda: SqliteDatabase(path, busy_timeout_ms=busy_timeout_ms, page_size=PAGE_SIZE),
            lambda db: db.ensure_schema(meta_table=sql.META_TABLE, version=sql.SCHEMA_VERSION, statements=sql.SCHEMA,
                                        what="lease", upgrades=sql.UPGRADES, unversioned=_migrate))
        self.path = db.path
        self._lock = db.lock
        self._conn = db.connection
        self._txn = db.transaction()
        self._read = _Using(self, self._lock)
        self._write = _Using(self, self._txn)

    def _reading(self) -> _Using:
        return self._read

    def _writing(self) -> _Using:
        return self._write

    def _insert(self, conn: sqlite3.Connection, spec: TaskSpec, values: tuple[Any, ...]) -> int | None:
        if conn.execute(sql.EXISTS, (spec.job_id, spec.task_id)).fetchone() is not None:
            return None
        seq = int(conn.execute(sql.NEXT_SEQ).fetchone()[0])
        conn.execute(sql.INSERT, (spec.job_id, spec.task_id, seq, *values))
        return seq

    def _histories_of(self, conn: sqlite3.Connection, keys: list[tuple[str, str]]) -> dict[tuple[str, str], HistoryRows]:
        return {key: conn.execute(sql.HISTORY, key).fetchall() for key in keys}

    def find_lease(self, lease_id: str) -> TaskRecord | None:
        with self._lock:
            rows = self._conn.execute(sql.FIND_LEASE, (lease_id,)).fetchall()
        if not rows:
            return None
        # one row per lease of the task's history (the lease asked for is one of them)
        return self._record(rows[0], [(row[_ROW_WIDTH], row[_ROW_WIDTH + 1]) for row in rows])
