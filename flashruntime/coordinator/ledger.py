"""``Ledger``: the coordinator's durable record of jobs, their events and the
evidence of accepted attempts, in SQLite or PostgreSQL.

Every row stores the pydantic model's JSON, so what comes back is what went in. On a
``SqliteDatabase`` or ``PostgresDatabase`` shared with the other stores, a write made
inside their transaction (the events of a lease transition) commits with it. SQLite: one
connection (WAL, ``synchronous=FULL``) used under the database's lock, so a committed
write survives a crash. PostgreSQL: the connection of the transaction the calling thread
has open, or one from the pool; several coordinator replicas may share the database.
The SQL of each lives in ``ledger_tables``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from flashruntime.coordinator.ledger_tables import (
    EventRow,
    JobRow,
    LedgerTables,
    PostgresLedgerTables,
    SqliteLedgerTables,
)
from flashruntime.db.postgres import PostgresDatabase
from flashruntime.db.sqlite import SqliteDatabase
from flashruntime.db.sqlite_errors import translate_sqlite_errors
from flashruntime.protocol.v1alpha1 import Event, ExecutionEvidence, JobRecord, JobState, utcnow

__all__ = ["Ledger"]

_BUSY_TIMEOUT_MS = 5000


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


def _job_row(record: JobRecord) -> JobRow:
    return (record.job_id, record.model_dump_json(), record.state.value, _timestamp(record.created_at))


def _event_rows(events: Sequence[Event]) -> list[EventRow]:
    for event in events:
        if not isinstance(event, Event):
            raise TypeError(f"events must be Events, got a {type(event).__name__}")
    return [(e.job_id, e.type.value, _timestamp(e.timestamp), e.model_dump_json()) for e in events]


@translate_sqlite_errors(lambda ledger: ledger.where)
class Ledger:
    """Jobs, events and attempt evidence in the SQLite file at ``path`` (``":memory:"``: a
    private database), or in a ``SqliteDatabase`` or ``PostgresDatabase`` shared with other
    stores (whose owner closes it).

    The constructor creates the schema (and a file's parent directory); a database written
    by a newer flashruntime (a schema version this one does not read) is refused with
    ``RuntimeError`` rather than misread. The database's failures raise ``StoreError``.
    """

    def __init__(self, path: str | os.PathLike[str] | SqliteDatabase | PostgresDatabase) -> None:
        if isinstance(path, PostgresDatabase):
            self.where, self.path = f"ledger in {path.where}", None
            self._tables: LedgerTables = PostgresLedgerTables(path, owns=False)
            return
        if isinstance(path, SqliteDatabase):
            db, owns = path, False
        elif isinstance(path, (str, os.PathLike)):
            if str(path) == "":
                raise ValueError("Ledger needs a file path (or ':memory:'), got ''")
            db = SqliteDatabase(path if str(path) == ":memory:" else Path(path).expanduser(),
                                busy_timeout_ms=_BUSY_TIMEOUT_MS)
            owns = True
        else:
            raise TypeError(f"path must be a str, os.PathLike, SqliteDatabase or PostgresDatabase, "
                            f"got {type(path).__name__}")
        # Named before the tables are made: a SQLite failure making them is reported naming the file.
        self.where = f"ledger {db.path}"
        self.path: Path | None = db.path  # the SQLite file (None on PostgreSQL)
        try:
            self._tables = SqliteLedgerTables(db, owns=owns)
        except BaseException:
            if owns:
                db.close()
            raise

    def __repr__(self) -> str:
        return f"Ledger({str(self.path) if self.path is not None else self.where!r})"

    def close(self) -> None:
        """Close the database this ledger opened; a shared one is its owner's to close."""
        self._tables.close()

    # --- jobs -----------------------------------------------------------------

    def upsert_job(self, record: JobRecord, *, events: Sequence[Event] = ()) -> None:
        """Insert ``record``, or replace the stored record with the same ``job_id``; ``events``
        are appended (in order) in the same transaction, so either all of it is committed or
        none of it is."""
        if not isinstance(record, JobRecord):
            raise TypeError(f"record must be a JobRecord, got {type(record).__name__}")
        self._tables.upsert_job(_job_row(record), _event_rows(events))

    def add_job(self, record: JobRecord, events: Sequence[Event]) -> None:
        """Store a new job together with its first ``events`` (in order) in one transaction:
        either all of it is committed or none of it is. A ``job_id`` already stored raises
        ``ValueError`` and changes nothing."""
        if not isinstance(record, JobRecord):
            raise TypeError(f"record must be a JobRecord, got {type(record).__name__}")
        if not self._tables.add_job(_job_row(record), _event_rows(events)):
            raise ValueError(f"job {record.job_id!r} is already in the ledger; submit it under a new id")

    def get_job(self, job_id: str, *, lock: bool = False) -> JobRecord | None:
        """The stored record, or None. ``lock=True`` inside a transaction: no other transaction
        may change the job until this one ends (PostgreSQL locks the row; a SQLite transaction
        already excludes every other writer), so a read-decide-write of its state is safe
        against replicas doing the same."""
        _require_str("job_id", job_id)
        text = self._tables.job(job_id, lock)
        return None if text is None else JobRecord.model_validate_json(text)

    def list_jobs(self) -> list[JobRecord]:
        """Every job, newest ``created_at`` first; equal times newest-inserted first."""
        return [JobRecord.model_validate_json(text) for text in self._tables.jobs()]

    def jobs_in(self, states: Iterable[JobState]) -> list[JobRecord]:
        """The jobs whose stored state is one of ``states``, in no particular order."""
        return [JobRecord.model_validate_json(text) for text in self._tables.jobs_in([str(s) for s in states])]

    # --- events ---------------------------------------------------------------

    def append_event(self, event: Event) -> int:
        """Append ``event``; returns its ``seq``: larger than that of every event appended
        before it (by any process on the database), so ``seq`` is the ledger order."""
        if not isinstance(event, Event):
            raise TypeError(f"event must be an Event, got {type(event).__name__}")
        return self._tables.append_event(_event_rows([event])[0])

    def events_for(self, job_id: str) -> list[Event]:
        """The job's events in ledger (``seq``) order; ``""`` gives the node-scoped events."""
        _require_str("job_id", job_id)
        return [Event.model_validate_json(text) for text in self._tables.events(job_id)]

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
        self._tables.put_evidence((lease_id, job_id, task_id, node_id,
                                   None if evidence is None else evidence.model_dump_json(),
                                   observed_elapsed_s, _timestamp(recorded_at)))

    def evidence_for(self, job_id: str) -> dict[str, dict[str, Any]]:
        """``task_id -> {lease_id, node_id, evidence, observed_elapsed_s, recorded_at}`` for
        the task's most recently recorded attempt (insertion order, not clock time, so a
        clock step cannot reorder them). ``evidence`` is the model's JSON-mode dict or None;
        ``recorded_at`` is ISO 8601 UTC text."""
        _require_str("job_id", job_id)
        rows = self._tables.evidence(job_id)
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
