"""``Ledger``: the coordinator's durable record of jobs, their events and the
evidence of accepted attempts, in a SQLite database.

Every row stores the pydantic model's JSON, so what comes back is what went in. The
ledger keeps one connection (WAL, ``synchronous=FULL``), used under the database's
lock, so it is safe to share between threads and a committed write survives a crash.
On a ``SqliteDatabase`` shared with the lease store, a write made inside the store's
transaction (the events of a lease transition) commits with the transition.
"""

from __future__ import annotations

import math
import os
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from flashruntime.protocol.v1alpha1 import Event, ExecutionEvidence, JobRecord, utcnow
from flashruntime.sqlite_database import SqliteDatabase
from flashruntime.sqlite_errors import translate_sqlite_errors

__all__ = ["Ledger"]

# PRAGMA user_version. 0: no attempt_evidence yet (the table is added); 1: jobs, events,
# attempt_evidence; 2: the same tables, in a file that may also hold the coordinator's
# other stores (tasks and leases, nodes, checkpoints), which a reader of 1 would not look for.
_SCHEMA_VERSION = 2
_BUSY_TIMEOUT_MS = 5000
_SCHEMA = (
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


def _timestamp(value: datetime) -> str:
    """Fixed-width UTC ISO 8601 (always microseconds, always ``+00:00``), so that text
    order is time order; pydantic's own form drops zero microseconds and would not be."""
    return value.astimezone(timezone.utc).isoformat(timespec="microseconds")


def _require_str(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    return value


def _require_id(name: str, value: object) -> str:
    if not _require_str(name, value):
        raise ValueError(f"{name} must be a non-empty string")
    return value  # type: ignore[return-value]


def _require_events(events: Sequence[Event]) -> None:
    for event in events:
        if not isinstance(event, Event):
            raise TypeError(f"events must be Events, got a {type(event).__name__}")


def _insert_events(conn: sqlite3.Connection, events: Sequence[Event]) -> None:
    conn.executemany(
        "INSERT INTO events (job_id, type, timestamp, payload) VALUES (?, ?, ?, ?)",
        [(e.job_id, e.type.value, _timestamp(e.timestamp), e.model_dump_json()) for e in events],
    )


@translate_sqlite_errors(lambda store: f"ledger {store.path}")
class Ledger:
    """Jobs, events and attempt evidence in the SQLite file at ``path``, or in a
    ``SqliteDatabase`` shared with other stores (whose owner closes it).

    The constructor creates the parent directory and the schema; a file written by
    a newer flashruntime (higher schema version) is refused rather than misread.
    """

    def __init__(self, path: str | os.PathLike[str] | SqliteDatabase) -> None:
        if isinstance(path, SqliteDatabase):
            db, self._owns_db = path, False
        elif isinstance(path, (str, os.PathLike)):
            if str(path) == "":
                raise ValueError("Ledger needs a file path (or ':memory:'), got ''")
            db = SqliteDatabase(path if str(path) == ":memory:" else Path(path).expanduser(),
                                busy_timeout_ms=_BUSY_TIMEOUT_MS)
            self._owns_db = True
        else:
            raise TypeError(f"path must be a str, os.PathLike or SqliteDatabase, got {type(path).__name__}")
        self._db = db
        self.path = db.path
        try:
            with self._connect(write=True) as conn:
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                if version > _SCHEMA_VERSION:
                    raise RuntimeError(
                        f"{self.path}: ledger schema version {version} is newer than the {_SCHEMA_VERSION} this "
                        "flashruntime reads; open it with the version that wrote it"
                    )
                for statement in _SCHEMA:
                    conn.execute(statement)
                if version != _SCHEMA_VERSION:
                    conn.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")
        except BaseException:
            if self._owns_db:
                db.close()
            raise

    def __repr__(self) -> str:
        return f"Ledger({str(self.path)!r})"

    def close(self) -> None:
        """Close the connection this ledger opened; one on a shared database is its owner's to close."""
        if self._owns_db:
            self._db.close()

    @contextmanager
    def _connect(self, *, write: bool) -> Iterator[sqlite3.Connection]:
        """The connection, under the database's lock; a write runs in its transaction (nested in
        the caller's when there is one, so it commits with it)."""
        db = self._db
        if write:
            with db.transaction():
                yield db.connection
        else:
            with db.lock:
                yield db.connection

    # --- jobs -----------------------------------------------------------------

    def upsert_job(self, record: JobRecord, *, events: Sequence[Event] = ()) -> None:
        """Insert ``record``, or replace the stored record with the same ``job_id``; ``events``
        are appended (in order) in the same transaction, so either all of it is committed or
        none of it is."""
        if not isinstance(record, JobRecord):
            raise TypeError(f"record must be a JobRecord, got {type(record).__name__}")
        _require_events(events)
        with self._connect(write=True) as conn:
            conn.execute(
                "INSERT INTO jobs (job_id, record, state, created_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(job_id) DO UPDATE SET record = excluded.record, state = excluded.state, "
                "created_at = excluded.created_at",
                (record.job_id, record.model_dump_json(), record.state.value, _timestamp(record.created_at)),
            )
            _insert_events(conn, events)

    def add_job(self, record: JobRecord, events: Sequence[Event]) -> None:
        """Store a new job together with its first ``events`` (in order) in one transaction:
        either all of it is committed or none of it is. A ``job_id`` already stored raises
        ``ValueError`` and changes nothing."""
        if not isinstance(record, JobRecord):
            raise TypeError(f"record must be a JobRecord, got {type(record).__name__}")
        _require_events(events)
        with self._connect(write=True) as conn:
            try:
                conn.execute(
                    "INSERT INTO jobs (job_id, record, state, created_at) VALUES (?, ?, ?, ?)",
                    (record.job_id, record.model_dump_json(), record.state.value, _timestamp(record.created_at)),
                )
            except sqlite3.IntegrityError:
                raise ValueError(f"job {record.job_id!r} is already in the ledger; submit it under a new id") from None
            _insert_events(conn, events)

    def get_job(self, job_id: str) -> JobRecord | None:
        _require_str("job_id", job_id)
        with self._connect(write=False) as conn:
            row = conn.execute("SELECT record FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        return None if row is None else JobRecord.model_validate_json(row[0])

    def list_jobs(self) -> list[JobRecord]:
        """Every job, newest ``created_at`` first; equal times newest-inserted first."""
        with self._connect(write=False) as conn:
            rows = conn.execute("SELECT record FROM jobs ORDER BY created_at DESC, rowid DESC").fetchall()
        return [JobRecord.model_validate_json(row[0]) for row in rows]

    # --- events ---------------------------------------------------------------

    def append_event(self, event: Event) -> int:
        """Append ``event``; returns its ``seq`` (the ledger order, strictly increasing)."""
        if not isinstance(event, Event):
            raise TypeError(f"event must be an Event, got {type(event).__name__}")
        with self._connect(write=True) as conn:
            cursor = conn.execute(
                "INSERT INTO events (job_id, type, timestamp, payload) VALUES (?, ?, ?, ?)",
                (event.job_id, event.type.value, _timestamp(event.timestamp), event.model_dump_json()),
            )
        return int(cursor.lastrowid or 0)  # always set by an INSERT into a rowid table

    def events_for(self, job_id: str) -> list[Event]:
        """The job's events in ledger (``seq``) order; ``""`` gives the node-scoped events."""
        _require_str("job_id", job_id)
        with self._connect(write=False) as conn:
            rows = conn.execute("SELECT payload FROM events WHERE job_id = ? ORDER BY seq", (job_id,)).fetchall()
        return [Event.model_validate_json(row[0]) for row in rows]

    # --- attempt evidence -----------------------------------------------------

    def record_evidence(
        self,
        lease_id: str,
        job_id: str,
        task_id: str,
        node_id: str,
        evidence: ExecutionEvidence | dict[str, Any] | None,
        observed_elapsed_s: float | None,
        *,
        recorded_at: datetime | None = None,
    ) -> None:
        """Record an attempt's evidence (None = the agent sent none) and the coordinator's
        own claim→commit seconds. Evidence is recorded, never judged: any values the model
        accepts are kept. Recording the same ``lease_id`` again replaces its row."""
        for name, value in (("lease_id", lease_id), ("job_id", job_id), ("task_id", task_id), ("node_id", node_id)):
            _require_id(name, value)
        if isinstance(evidence, dict):
            evidence = ExecutionEvidence.model_validate(evidence)  # a ValidationError stays one
        elif evidence is not None and not isinstance(evidence, ExecutionEvidence):
            raise TypeError(f"evidence must be an ExecutionEvidence, a dict or None, got {type(evidence).__name__}")
        if observed_elapsed_s is not None:
            if isinstance(observed_elapsed_s, bool) or not isinstance(observed_elapsed_s, (int, float)):
                raise TypeError(f"observed_elapsed_s must be a number or None, got {type(observed_elapsed_s).__name__}")
            if not math.isfinite(observed_elapsed_s):
                # SQLite stores NaN as NULL, which would read back as "not observed".
                raise ValueError(f"observed_elapsed_s must be finite, got {observed_elapsed_s!r}")
            observed_elapsed_s = float(observed_elapsed_s)
        if recorded_at is None:
            recorded_at = utcnow()
        elif not isinstance(recorded_at, datetime):
            raise TypeError(f"recorded_at must be a datetime or None, got {type(recorded_at).__name__}")
        elif recorded_at.tzinfo is None:
            recorded_at = recorded_at.replace(tzinfo=timezone.utc)  # naive means UTC
        with self._connect(write=True) as conn:
            # REPLACE deletes and re-inserts, so a re-recorded lease also becomes the newest row.
            conn.execute(
                "INSERT OR REPLACE INTO attempt_evidence (lease_id, job_id, task_id, node_id, evidence, "
                "observed_elapsed_s, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (lease_id, job_id, task_id, node_id, None if evidence is None else evidence.model_dump_json(),
                 observed_elapsed_s, _timestamp(recorded_at)),
            )

    def evidence_for(self, job_id: str) -> dict[str, dict[str, Any]]:
        """``task_id -> {lease_id, node_id, evidence, observed_elapsed_s, recorded_at}`` for
        the task's most recently recorded attempt (insertion order, not clock time, so a
        clock step cannot reorder them). ``evidence`` is the model's JSON-mode dict or None;
        ``recorded_at`` is ISO 8601 UTC text."""
        _require_str("job_id", job_id)
        with self._connect(write=False) as conn:
            rows = conn.execute(
                "SELECT task_id, lease_id, node_id, evidence, observed_elapsed_s, recorded_at "
                "FROM attempt_evidence WHERE job_id = ? ORDER BY rowid",
                (job_id,),
            ).fetchall()
        latest: dict[str, dict[str, Any]] = {}
        for task_id, lease_id, node_id, evidence, elapsed, recorded_at in rows:
            latest[task_id] = {
                "lease_id": lease_id,
                "node_id": node_id,
                "evidence": None if evidence is None
                else ExecutionEvidence.model_validate_json(evidence).model_dump(mode="json"),
                "observed_elapsed_s": elapsed,
                "recorded_at": recorded_at,
            }
        return dict(sorted(latest.items()))
