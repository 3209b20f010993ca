"""``PostgresLeaseStore``: lease state in PostgreSQL, shared by every coordinator replica.

The SQLite store's layout and contract on a server: each call reads the rows it touches
and returns fresh ``TaskRecord`` objects; nothing is cached. Inside a transaction the
reads a transition acts on lock their rows (``FOR UPDATE``), and the reads that pick
tasks — ``next_pending``, ``expired``, and ``lock_pending`` for a placement policy's
choice from unlocked ``pending_page`` reads — skip rows another transaction has locked
(``SKIP LOCKED``): two replicas claiming at once never hand out the same task, and
neither waits for the other. Given a ``PostgresDatabase`` instead of a URL,
the store shares its transactions, so other stores' writes made inside one commit with
the transition.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from flashruntime.db.postgres import PostgresDatabase
from flashruntime.leases import _postgres_sql as sql
from flashruntime.leases._sql_store import HistoryRows, SqlLeaseStore
from flashruntime.leases.store import TaskRecord
from flashruntime.protocol.v1alpha1 import TaskSpec

__all__ = ["SCHEMA_VERSION", "PostgresLeaseStore", "stored_schema_version"]

SCHEMA_VERSION = sql.SCHEMA_VERSION


def stored_schema_version(database: PostgresDatabase) -> str | None:
    """The lease store's schema version recorded in ``database``, or None where it has no
    lease tables yet. Reads only."""
    return database.recorded_version(sql.META_TABLE)


class PostgresLeaseStore(SqlLeaseStore):
    """A ``LeaseStore`` in PostgreSQL; implements every optional operation.

    ``database`` is a URL (the store opens and owns a ``PostgresDatabase``) or a
    ``PostgresDatabase`` whose pool and transactions the store shares (its owner closes
    it). The constructor creates the schema, or checks the stored schema version and
    refuses one it does not read (``RuntimeError`` naming the database). Transactions of
    other threads and processes run at the same time as this thread's.
    """

    _sql = sql
    # Pages offered to a placement policy per read: a claim usually takes the first eligible
    # task, and every row read is a round of decoding in the driver.
    pending_page_size = 32

    def __init__(self, database: str | PostgresDatabase, **options: Any) -> None:
        db = self._open_database(
            database, PostgresDatabase, lambda: PostgresDatabase(database, **options),  # type: ignore[arg-type]
            lambda db: db.ensure_schema(meta_table=sql.META_TABLE, version=sql.SCHEMA_VERSION,
                                        statements=sql.SCHEMA, what="lease"))
        self.where = db.where
        self._txn = db.transaction()
        self._connection = db.connection

    def _locking(self) -> bool:
        return bool(self.database.in_transaction())

    def _reading(self) -> Any:
        return self._connection()

    @contextmanager
    def _writing(self) -> Iterator[Any]:
        with self._txn, self._connection() as conn:
            yield conn

    def _storable(self, value: str) -> bool:
        """PostgreSQL's ``text`` cannot hold NUL: nothing stored has such a key, so a lookup
        by one finds nothing."""
        return "\x00" not in value

    def _insert(self, conn: Any, spec: TaskSpec, values: tuple[Any, ...]) -> int | None:
        row = conn.execute(sql.INSERT, (spec.job_id, spec.task_id, *values)).fetchone()
        return None if row is None else int(row[0])

    def _histories_of(self, conn: Any, keys: list[tuple[str, str]]) -> dict[tuple[str, str], HistoryRows]:
        histories: dict[tuple[str, str], HistoryRows] = {}
        jobs, tasks = [key[0] for key in keys], [key[1] for key in keys]
        for hist_job, hist_task, lease_id, lease_json in conn.execute(sql.HISTORY_OF, (jobs, tasks)).fetchall():
            histories.setdefault((hist_job, hist_task), []).append((lease_id, lease_json))
        return histories

    def lock_pending(self, job_id: str, task_id: str) -> TaskRecord | None:
        """Inside a transaction: the record of ``(job_id, task_id)``, locked until the
        transaction ends, when it is still PENDING and no other transaction holds it; else None
        (another claimer took it, or is taking it)."""
        if not (self._storable(job_id) and self._storable(task_id)):
            return None
        with self._connection() as conn:
            row = conn.execute(sql.LOCK_PENDING, (job_id, task_id)).fetchone()
            return None if row is None else self._records(conn, [row])[0]

    def find_lease(self, lease_id: str) -> TaskRecord | None:
        if not self._storable(lease_id):
            return None
        with self._connection() as conn:
            statement = sql.FIND_LEASE_LOCKED if self._locking() else sql.FIND_LEASE
            row = conn.execute(statement, (lease_id,)).fetchone()
            return None if row is None else self._records(conn, [row])[0]
