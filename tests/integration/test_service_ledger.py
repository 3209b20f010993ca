"""The ledger on a SQLite file: its schema and migration, its file paths, a fault SQLite
itself raises. What every database must do is in tests/contract/test_ledger_contract.py."""

from __future__ import annotations

import sqlite3
from datetime import datetime
from pathlib import Path

import pytest

from flashruntime.coordinator.ledger import Ledger
from flashruntime.errors import StoreError
from flashruntime.protocol.v1alpha1 import (
    EventType,
    ExecutionEvidence,
    JobState,
)
from tests._support import run_core_only
from tests.contract.test_ledger_contract import T0
from tests.contract.test_ledger_contract import event as _event
from tests.contract.test_ledger_contract import job as _job


@pytest.fixture()
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger.db")


# --- file and schema --------------------------------------------------------------------------------


def test_creates_parent_directory_wal_file_and_the_spec_schema(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "flashruntime.db"
    Ledger(path)
    assert path.is_file()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        columns = {
            table: [(name, kind, bool(notnull), bool(pk)) for _, name, kind, notnull, _, pk in
                    conn.execute(f"PRAGMA table_info({table})")]
            for table in ("jobs", "events", "attempt_evidence")
        }
        index = [row[2] for row in conn.execute("PRAGMA index_info(idx_events_job)")]
        autoincrement = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'events'").fetchone()[0]
    finally:
        conn.close()
    assert columns["jobs"] == [("job_id", "TEXT", False, True), ("record", "TEXT", True, False),
                               ("state", "TEXT", True, False), ("created_at", "TEXT", True, False)]
    assert columns["events"] == [("seq", "INTEGER", False, True), ("job_id", "TEXT", True, False),
                                 ("type", "TEXT", True, False), ("timestamp", "TEXT", True, False),
                                 ("payload", "TEXT", True, False)]
    assert columns["attempt_evidence"] == [
        ("lease_id", "TEXT", False, True), ("job_id", "TEXT", True, False), ("task_id", "TEXT", True, False),
        ("node_id", "TEXT", True, False), ("evidence", "TEXT", False, False),
        ("observed_elapsed_s", "REAL", False, False), ("recorded_at", "TEXT", True, False),
    ]
    assert index == ["job_id", "seq"]
    assert "AUTOINCREMENT" in autoincrement.upper()


def test_a_ledger_from_before_attempt_evidence_gains_the_table(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE jobs (job_id TEXT PRIMARY KEY, record TEXT NOT NULL, state TEXT NOT NULL, "
                 "created_at TEXT NOT NULL)")
    conn.execute("INSERT INTO jobs VALUES (?, ?, ?, ?)",
                 ("old1", _job("old1").model_dump_json(), "RUNNING", "2025-03-01T12:00:00.000000+00:00"))
    conn.commit()
    conn.close()
    ledger = Ledger(path)
    assert ledger.get_job("old1") == _job("old1")
    ledger.record_evidence("lease-1", "old1", "t", "n", None, 1.0)
    assert ledger.evidence_for("old1")["t"]["evidence"] is None


def test_bad_paths(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="path must be"):
        Ledger(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs a file path"):
        Ledger("")
    in_memory = Ledger(":memory:")  # one connection for its whole life, so a private database works
    in_memory.upsert_job(_job("m1"))
    assert in_memory.get_job("m1") == _job("m1")
    in_memory.close()


# --- jobs ---------------------------------------------------------------------------------------------


def test_upsert_replaces_the_record_and_its_state_column(ledger: Ledger) -> None:
    ledger.upsert_job(_job("j1", state=JobState.RUNNING))
    ledger.upsert_job(_job("j1", state=JobState.FAILED, error="2 of 3 tasks exhausted"))
    assert [job.job_id for job in ledger.list_jobs()] == ["j1"]
    got = ledger.get_job("j1")
    assert got is not None and got.state is JobState.FAILED and got.error == "2 of 3 tasks exhausted"
    conn = sqlite3.connect(ledger.path)
    try:
        assert conn.execute("SELECT state FROM jobs WHERE job_id = 'j1'").fetchall() == [("FAILED",)]
    finally:
        conn.close()


def test_upsert_with_events_stores_the_record_and_its_events_together_or_not_at_all(ledger: Ledger) -> None:
    """What the coordinator's refresh relies on: a terminal record is never stored without
    its JOB_SUCCEEDED / JOB_FAILED."""
    ledger.upsert_job(_job("j1", state=JobState.RUNNING), events=[_event("j1", EventType.JOB_ACCEPTED)])
    conn = sqlite3.connect(ledger.path)
    try:
        conn.execute("CREATE TRIGGER refuse BEFORE INSERT ON events WHEN NEW.type = 'JOB_FAILED' "
                     "BEGIN SELECT RAISE(ABORT, 'injected fault'); END")
        conn.commit()
    finally:
        conn.close()
    failed = _job("j1", state=JobState.FAILED, finished_at=T0)
    with pytest.raises(StoreError, match=r"ledger .*IntegrityError: injected fault") as refused:
        ledger.upsert_job(failed, events=[_event("j1", EventType.TASK_EXHAUSTED), _event("j1", EventType.JOB_FAILED)])
    assert isinstance(refused.value.__cause__, sqlite3.IntegrityError)  # SQLite's own error, kept as the cause
    assert ledger.get_job("j1") == _job("j1", state=JobState.RUNNING)  # neither half was stored
    assert [e.type for e in ledger.events_for("j1")] == [EventType.JOB_ACCEPTED]
    with pytest.raises(TypeError, match="events must be Events, got a str"):
        ledger.upsert_job(failed, events=["JOB_FAILED"])  # type: ignore[list-item]
    assert ledger.get_job("j1") == _job("j1", state=JobState.RUNNING)
    ledger.upsert_job(failed, events=[_event("j1", EventType.TASK_EXHAUSTED)])
    assert ledger.get_job("j1") == failed
    assert [e.type for e in ledger.events_for("j1")] == [EventType.JOB_ACCEPTED, EventType.TASK_EXHAUSTED]


# --- evidence -----------------------------------------------------------------------------------------


def test_re_recording_a_lease_replaces_its_evidence_row(ledger: Ledger) -> None:
    ledger.record_evidence("lease-old", "j1", "t", "node-a", ExecutionEvidence(wall_seconds=1.0), 1.0)
    ledger.record_evidence("lease-new", "j1", "t", "node-b", ExecutionEvidence(wall_seconds=2.0), 2.0)
    ledger.record_evidence("lease-old", "j1", "t", "node-a", None, 3.0, recorded_at=datetime(2025, 3, 2))
    assert ledger.evidence_for("j1")["t"]["lease_id"] == "lease-old"
    conn = sqlite3.connect(ledger.path)  # type: ignore[arg-type]
    try:
        assert conn.execute("SELECT COUNT(*) FROM attempt_evidence").fetchone()[0] == 2
    finally:
        conn.close()


# --- import hygiene -----------------------------------------------------------------------------------


def test_auth_and_ledger_import_with_only_the_core(tmp_path: Path) -> None:
    result = run_core_only(
        "import sys\n"
        "import flashruntime.coordinator.auth as auth, flashruntime.coordinator.ledger as ledger\n"
        f"led = ledger.Ledger({str(tmp_path / 'core.db')!r})\n"
        "print(led.list_jobs(), type(auth.authenticator_from_env({})).__name__)\n"
        "print(sorted(m for m in ('fastapi', 'uvicorn', 'httpx', 'starlette', 'yaml', 'psutil') if m in sys.modules))\n",
        refuse=("fastapi", "uvicorn", "httpx", "starlette"),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[] OpenAuthenticator", "[]"]
