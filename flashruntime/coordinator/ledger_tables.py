"""The ledger's tables in one SQL database: what ``Ledger`` reads and writes through.

``SqliteLedgerTables`` and ``PostgresLedgerTables`` hold the same three tables (jobs,
events, attempt evidence) and answer the same calls with plain rows (JSON text, numbers,
timestamp text); ``Ledger`` validates the models that go in and builds the ones that come
out. Each write joins the transaction its thread has open on the database, so it commits
with whatever else that transaction writes.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from flashruntime.db.postgres import PostgresDatabase
from flashruntime.db.sqlite import SqliteDatabase, has_table
from flashruntime.errors import SchemaVersionError

__all__ = ["POSTGRES_SCHEMA_VERSION", "SQLITE_SCHEMA_VERSION", "SQLITE_UPGRADES_FROM", "EventRow", "EvidenceRow",
           "JobRow", "LedgerTables", "PostgresLedgerTables", "SqliteLedgerTables", "stored_schema_version"]

# (job_id, record JSON, state, created_at text)
JobRow = tuple[str, str, str, str]
# (job_id, type, timestamp text, payload JSON)
EventRow = tuple[str, str, str, str]
# (lease_id, job_id, task_id, node_id, evidence JSON or None, observed_elapsed_s or None, recorded_at text)
EvidenceRow = tuple[str, str, str, str, "str | None", "float | None", str]


class LedgerTables(Protocol):
    """The storage ``Ledger`` runs on. ``where`` names the database in messages."""

    where: str

    def close(self) -> None: ...

    def upsert_job(self, job: JobRow, events: Sequence[EventRow]) -> None: ...

    def add_job(self, job: JobRow, events: Sequence[EventRow]) -> bool:
        """Insert ``job`` and ``events`` unless the job id is stored; whether it was inserted."""
        ...

    def job(self, job_id: str, lock: bool) -> str | None: ...

    def jobs(self) -> list[str]: ...

    def jobs_in(self, states: Sequence[str]) -> list[str]: ...

    def append_event(self, event: EventRow) -> int: ...

    def events(self, job_id: str) -> list[str]: ...

    def put_evidence(self, row: EvidenceRow) -> None: ...

    def evidence(self, job_id: str) -> list[tuple[Any, ...]]: ...


# --- SQLite --------------------------------------------------------------------------

# PRAGMA user_version. 0: no attempt_evidence yet (the table is added); 1: jobs, events,
# attempt_evidence; 2: the same tables, in a file that may also hold the coordinator's
# other stores (tasks and leases, nodes, checkpoints), which a reader of 1 would not look for.
SQLITE_SCHEMA_VERSION = 2
SQLITE_UPGRADES_FROM = ("0", "1")  # what the constructor brings to SQLITE_SCHEMA_VERSION in place
_SQLITE_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS jobs (
        job_id TEXT PRIMARY KEY, record TEXT NOT NULL, state TEXT NOT NULL, created_at TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS events (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, type TEXT NOT NULL,
        timestamp TEXT NOT NULL, payload TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS idx_events_job ON events(job_id, seq)",
    """CREATE TABLE IF NOT EXISTS attempt_evidence (
        lease_id TEXT PRIMARY KEY, job_id TEXT NOT NULL, task_id TEXT NOT NULL, node_id TEXT NOT NULL,
        evidence TEXT, observed_elapsed_s REAL, recorded_at TEXT NOT NULL)""",
)
_SQLITE_UPSERT_JOB = (
    "INSERT INTO jobs (job_id, record, state, created_at) VALUES (?, ?, ?, ?) "
    "ON CONFLICT(job_id) DO UPDATE SET record = excluded.record, state = excluded.state, "
    "created_at = excluded.created_at"
)
_SQLITE_INSERT_EVENT = "INSERT INTO events (job_id, type, timestamp, payload) VALUES (?, ?, ?, ?)"
_EVIDENCE_COLUMNS = "lease_id, job_id, task_id, node_id, evidence, observed_elapsed_s, recorded_at"
_EVIDENCE_READ = "task_id, lease_id, node_id, evidence, observed_elapsed_s, recorded_at"


class SqliteLedgerTables:
    """The ledger's tables in a ``SqliteDatabase``; ``owns``: ``close()`` closes it.

    The constructor creates the schema (adding ``attempt_evidence`` to a file from before
    it) and refuses a file whose ``user_version`` is newer than this code reads."""

    def __init__(self, db: SqliteDatabase, *, owns: bool) -> None:
        self._db = db
        self._owns = owns
        self.path: Path = db.path
        self.where = f"ledger {db.path}"
        with self._write() as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SQLITE_SCHEMA_VERSION:
                raise SchemaVersionError(
                    f"{self.path}: ledger schema version {version} is newer than the {SQLITE_SCHEMA_VERSION} this "
                    "flashruntime reads; open it with the version that wrote it"
                )
            for statement in _SQLITE_SCHEMA:
                conn.execute(statement)
            if version != SQLITE_SCHEMA_VERSION:
                conn.execute(f"PRAGMA user_version = {SQLITE_SCHEMA_VERSION}")

    def close(self) -> None:
        if self._owns:
            self._db.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """The connection inside the database's transaction (nested in the caller's when
        there is one, so it commits with it)."""
        with self._db.transaction():
            yield self._db.connection

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._db.lock:
            yield self._db.connection

    def upsert_job(self, job: JobRow, events: Sequence[EventRow]) -> None:
        with self._write() as conn:
            conn.execute(_SQLITE_UPSERT_JOB, job)
            conn.executemany(_SQLITE_INSERT_EVENT, events)

    def add_job(self, job: JobRow, events: Sequence[EventRow]) -> bool:
        with self._write() as conn:
            try:
                conn.execute("INSERT INTO jobs (job_id, record, state, created_at) VALUES (?, ?, ?, ?)", job)
            except sqlite3.IntegrityError:
                return False
            conn.executemany(_SQLITE_INSERT_EVENT, events)
        return True

    def job(self, job_id: str, lock: bool) -> str | None:
        # ``lock`` needs nothing here: a write transaction already excludes every other writer.
        with self._read() as conn:
            row = conn.execute("SELECT record FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        return None if row is None else str(row[0])

    def jobs(self) -> list[str]:
        with self._read() as conn:
            rows = conn.execute("SELECT record FROM jobs ORDER BY created_at DESC, rowid DESC").fetchall()
        return [str(row[0]) for row in rows]

    def jobs_in(self, states: Sequence[str]) -> list[str]:
        marks = ", ".join("?" for _ in states)
        with self._read() as conn:
            rows = conn.execute(f"SELECT record FROM jobs WHERE state IN ({marks})", tuple(states)).fetchall()
        return [str(row[0]) for row in rows]

    def append_event(self, event: EventRow) -> int:
        with self._write() as conn:
            cursor = conn.execute(_SQLITE_INSERT_EVENT, event)
        return int(cursor.lastrowid or 0)  # always set by an INSERT into a rowid table

    def events(self, job_id: str) -> list[str]:
        with self._read() as conn:
            rows = conn.execute("SELECT payload FROM events WHERE job_id = ? ORDER BY seq", (job_id,)).fetchall()
        return [str(row[0]) for row in rows]

    def put_evidence(self, row: EvidenceRow) -> None:
        with self._write() as conn:
            # REPLACE deletes and re-inserts, so a re-recorded lease also becomes the newest row.
            conn.execute(f"INSERT OR REPLACE INTO attempt_evidence ({_EVIDENCE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                         row)

    def evidence(self, job_id: str) -> list[tuple[Any, ...]]:
        with self._read() as conn:
            return conn.execute(f"SELECT {_EVIDENCE_READ} FROM attempt_evidence WHERE job_id = ? ORDER BY rowid",
                                (job_id,)).fetchall()


# --- PostgreSQL -----------------------------------------------------------------------

POSTGRES_SCHEMA_VERSION = "1"
POSTGRES_META_TABLE = "ledger_meta"


def stored_schema_version(database: sqlite3.Connection | PostgresDatabase) -> str | None:
    """The ledger's schema version recorded in ``database`` (a SQLite connection, read-only
    will do, or a ``PostgresDatabase``), or None where it has no ledger tables yet. Reads
    only. On SQLite it is the file's ``user_version``, "0" for a ledger from before it
    was recorded."""
    if isinstance(database, PostgresDatabase):
        return database.recorded_version(POSTGRES_META_TABLE)
    version = int(database.execute("PRAGMA user_version").fetchone()[0])
    if version == 0 and not has_table(database, "jobs"):
        return None
    return str(version)

# The SQLite layout, with an explicit ``seq`` where SQLite orders by rowid. Ids and
# timestamps are ``COLLATE "C"``: byte order, so fixed-width timestamp text sorts as time.
_POSTGRES_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS ledger_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS jobs (
        job_id TEXT COLLATE "C" PRIMARY KEY,
        seq BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
        record TEXT NOT NULL,
        state TEXT NOT NULL,
        created_at TEXT COLLATE "C" NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS jobs_created ON jobs (created_at DESC, seq DESC)",
    """CREATE TABLE IF NOT EXISTS events (
        seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        job_id TEXT COLLATE "C" NOT NULL,
        type TEXT NOT NULL,
        timestamp TEXT COLLATE "C" NOT NULL,
        payload TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS events_job_seq ON events (job_id, seq)",
    """CREATE TABLE IF NOT EXISTS attempt_evidence (
        lease_id TEXT COLLATE "C" PRIMARY KEY,
        seq BIGINT GENERATED BY DEFAULT AS IDENTITY UNIQUE,
        job_id TEXT COLLATE "C" NOT NULL,
        task_id TEXT COLLATE "C" NOT NULL,
        node_id TEXT COLLATE "C" NOT NULL,
        evidence TEXT,
        observed_elapsed_s DOUBLE PRECISION,
        recorded_at TEXT COLLATE "C" NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS attempt_evidence_job_seq ON attempt_evidence (job_id, seq)",
)
_PG_INSERT_JOB = "INSERT INTO jobs (job_id, record, state, created_at) VALUES (%s, %s, %s, %s) "
_PG_INSERT_EVENT = "INSERT INTO events (job_id, type, timestamp, payload) VALUES (%s, %s, %s, %s)"
# ``seq = DEFAULT`` takes the next value: a re-recorded lease becomes the newest row, as in SQLite.
_PG_PUT_EVIDENCE = (
    f"INSERT INTO attempt_evidence ({_EVIDENCE_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s) "
    "ON CONFLICT (lease_id) DO UPDATE SET job_id = EXCLUDED.job_id, task_id = EXCLUDED.task_id, "
    "node_id = EXCLUDED.node_id, evidence = EXCLUDED.evidence, observed_elapsed_s = EXCLUDED.observed_elapsed_s, "
    "recorded_at = EXCLUDED.recorded_at, seq = DEFAULT"
)


def _storable(*values: str) -> bool:
    """Whether PostgreSQL's ``text`` can hold every value (it cannot hold NUL)."""
    return not any("\x00" in value for value in values)


def _require_storable(what: str, *values: str) -> None:
    if not _storable(*values):
        raise ValueError(f"{what}: ids cannot contain NUL characters (PostgreSQL text cannot hold them)")


class PostgresLedgerTables:
    """The ledger's tables in a ``PostgresDatabase``; ``owns``: ``close()`` closes it.

    The constructor creates the schema (one process at a time), or checks the version in
    ``ledger_meta`` and refuses one it does not read (``RuntimeError`` naming the database).
    A write inside a transaction joins it; outside one it commits on its own. ``job(...,
    lock=True)`` inside a transaction holds the job's row (``FOR UPDATE``) until it ends,
    so two transactions deciding a job's next state take turns."""

    def __init__(self, db: PostgresDatabase, *, owns: bool) -> None:
        self._db = db
        self._owns = owns
        self.path = None
        self.where = f"ledger in {db.where}"
        db.ensure_schema(meta_table=POSTGRES_META_TABLE, version=POSTGRES_SCHEMA_VERSION,
                         statements=_POSTGRES_SCHEMA, what="ledger")

    def close(self) -> None:
        if self._owns:
            self._db.close()

    def upsert_job(self, job: JobRow, events: Sequence[EventRow]) -> None:
        _require_storable(f"job {job[0]!r}", job[0], *(event[0] for event in events))
        db = self._db
        with db.transaction(), db.connection() as conn:
            conn.execute(_PG_INSERT_JOB + "ON CONFLICT (job_id) DO UPDATE SET record = EXCLUDED.record, "
                         "state = EXCLUDED.state, created_at = EXCLUDED.created_at", job)
            if events:
                conn.cursor().executemany(_PG_INSERT_EVENT, events)

    def add_job(self, job: JobRow, events: Sequence[EventRow]) -> bool:
        _require_storable(f"job {job[0]!r}", job[0], *(event[0] for event in events))
        db = self._db
        with db.transaction(), db.connection() as conn:
            if conn.execute(_PG_INSERT_JOB + "ON CONFLICT (job_id) DO NOTHING", job).rowcount == 0:
                return False
            if events:
                conn.cursor().executemany(_PG_INSERT_EVENT, events)
        return True

    def job(self, job_id: str, lock: bool) -> str | None:
        if not _storable(job_id):
            return None  # no stored id holds one
        statement = "SELECT record FROM jobs WHERE job_id = %s"
        if lock and self._db.in_transaction():
            statement += " FOR UPDATE"
        row = self._db.fetchone(statement, (job_id,))
        return None if row is None else str(row[0])

    def jobs(self) -> list[str]:
        return [str(row[0]) for row in self._db.fetchall("SELECT record FROM jobs ORDER BY created_at DESC, seq DESC")]

    def jobs_in(self, states: Sequence[str]) -> list[str]:
        return [str(row[0]) for row in self._db.fetchall("SELECT record FROM jobs WHERE state = ANY(%s)",
                                                           (list(states),))]

    def append_event(self, event: EventRow) -> int:
        _require_storable(f"event of job {event[0]!r}", event[0])
        row = self._db.fetchone(_PG_INSERT_EVENT + " RETURNING seq", event)
        return int(row[0])  # type: ignore[index]  # RETURNING always yields the row

    def events(self, job_id: str) -> list[str]:
        if not _storable(job_id):
            return []
        rows = self._db.fetchall("SELECT payload FROM events WHERE job_id = %s ORDER BY seq", (job_id,))
        return [str(row[0]) for row in rows]

    def put_evidence(self, row: EvidenceRow) -> None:
        _require_storable(f"evidence of lease {row[0]!r}", *row[:4])
        self._db.execute(_PG_PUT_EVIDENCE, row)

    def evidence(self, job_id: str) -> list[tuple[Any, ...]]:
        if not _storable(job_id):
            return []
        return self._db.fetchall(
            f"SELECT {_EVIDENCE_READ} FROM attempt_evidence WHERE job_id = %s ORDER BY seq", (job_id,))
