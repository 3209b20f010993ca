"""the coordinator ledger on a real SQLite file."""

from __future__ import annotations

import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from pydantic import ValidationError

from flashruntime.coordinator.ledger import Ledger
from flashruntime.errors import StoreError
from flashruntime.protocol.v1alpha1 import (
    ArtifactRecord,
    Event,
    EventType,
    ExecutionEvidence,
    JobRecord,
    JobSpec,
    JobState,
)
from tests._support import run_core_only

T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=timezone.utc)


def _spec(name: str = "sweep-a") -> JobSpec:
    return JobSpec.model_validate({
        "metadata": {"name": name, "labels": {"team": "ml"}},
        "spec": {
            "execution": {"backend": "leases"},
            "image": {"repository": "python", "tag": "3.11"},
            "workload": {"type": "hyperparameter_search", "parameters": {"grid": {"C": [0.1, 1.0]}}},
        },
    })


def _job(job_id: str, created_at: datetime = T0, **fields: object) -> JobRecord:
    return JobRecord(job_id=job_id, spec=_spec(), backend="leases", created_at=created_at, **fields)


def _event(job_id: str, kind: EventType = EventType.TASK_CREATED, **data: object) -> Event:
    return Event(job_id=job_id, type=kind, source="flashruntime.leases", message=f"{kind} {data}", data=data)


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


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "newer.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(RuntimeError, match="schema version 99 is newer"):
        Ledger(path)


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


def test_job_round_trip_is_exact(ledger: Ledger) -> None:
    record = _job(
        "a1b2c3d4e5f6", state=JobState.SUCCEEDED, finished_at=T0 + timedelta(minutes=3), error=None,
        runtime_execution_id="exec-1",
        artifacts=[ArtifactRecord(uri="artifact://jobs/a1/t/metrics.json", backend="local", bucket="/data/artifacts",
                                  object_key="jobs/a1/t/metrics.json", sha256="ab" * 32, size_bytes=12,
                                  created_at=T0)],
    )
    ledger.upsert_job(record)
    got = ledger.get_job("a1b2c3d4e5f6")
    assert got == record and got is not record
    assert got.model_dump_json() == record.model_dump_json()
    assert ledger.get_job("missing") is None


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


def test_list_jobs_is_newest_first_across_formats(ledger: Ledger) -> None:
    # Whole seconds against fractions, and another offset: text order must still be time order.
    created = {
        "whole": T0 + timedelta(seconds=1),
        "fraction": T0 + timedelta(seconds=0, microseconds=500_000),
        "later-offset": datetime(2025, 3, 1, 14, 0, 2, tzinfo=timezone(timedelta(hours=2))),  # 12:00:02 UTC
        "naive": datetime(2025, 3, 1, 11, 59, 59),  # read as UTC
    }
    for job_id in ("naive", "whole", "later-offset", "fraction"):
        ledger.upsert_job(_job(job_id, created[job_id]))
    assert [job.job_id for job in ledger.list_jobs()] == ["later-offset", "whole", "fraction", "naive"]
    assert ledger.list_jobs()[0].created_at == datetime(2025, 3, 1, 12, 0, 2, tzinfo=timezone.utc)


def test_equal_creation_times_list_the_newest_insert_first(ledger: Ledger) -> None:
    for job_id in ("b", "a", "c"):
        ledger.upsert_job(_job(job_id, T0))
    assert [job.job_id for job in ledger.list_jobs()] == ["c", "a", "b"]
    assert Ledger(ledger.path).list_jobs() == ledger.list_jobs()


# --- events -------------------------------------------------------------------------------------------


def test_events_round_trip_in_seq_order_per_job(ledger: Ledger) -> None:
    first = _event("j1", EventType.JOB_ACCEPTED)
    # A later event with an earlier timestamp: the ledger order is seq, not the timestamp.
    second = Event(job_id="j1", type=EventType.BACKEND_SELECTED, source="flashruntime.service",
                   message="backend: leases (2 independent tasks)", timestamp=T0,
                   data={"nested": {"list": [1, 2.5, None, "x"]}, "ok": True})
    other = _event("j2", EventType.JOB_ACCEPTED)
    node_scoped = _event("", EventType.NODE_CORDONED, node_id="n1")
    seqs = [ledger.append_event(event) for event in (first, other, second, node_scoped)]
    assert seqs == sorted(seqs) and len(set(seqs)) == 4
    assert ledger.events_for("j1") == [first, second]
    assert ledger.events_for("j2") == [other]
    assert ledger.events_for("") == [node_scoped]
    assert ledger.events_for("nobody") == []
    assert ledger.events_for("j1")[1].data == {"nested": {"list": [1, 2.5, None, "x"]}, "ok": True}


def test_add_job_stores_the_job_and_its_first_events_together_or_not_at_all(ledger: Ledger) -> None:
    events = [_event("j1", EventType.JOB_ACCEPTED), _event("j1", EventType.BACKEND_SELECTED), _event("j1", task_id="t")]
    ledger.add_job(_job("j1"), events)
    assert ledger.get_job("j1") == _job("j1") and ledger.events_for("j1") == events
    with pytest.raises(ValueError, match="job 'j1' is already in the ledger; submit it under a new id"):
        ledger.add_job(_job("j1", state=JobState.FAILED), [_event("j1", EventType.JOB_FAILED)])
    assert ledger.get_job("j1") == _job("j1") and ledger.events_for("j1") == events  # nothing changed
    with pytest.raises(TypeError, match="events must be Events, got a str"):
        ledger.add_job(_job("j2"), [_event("j2", EventType.JOB_ACCEPTED), "TASK_CREATED"])  # type: ignore[list-item]
    assert ledger.get_job("j2") is None and ledger.events_for("j2") == []


def test_reopen_from_a_new_instance_sees_everything(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    writer = Ledger(path)
    writer.upsert_job(_job("j1"))
    events = [_event("j1", data_index=i) for i in range(5)]
    for event in events:
        writer.append_event(event)
    writer.record_evidence("lease-1", "j1", "task-000", "node-a", ExecutionEvidence(wall_seconds=3.5), 4.0)
    reader = Ledger(path)
    assert reader.get_job("j1") == _job("j1")
    assert reader.events_for("j1") == events
    assert reader.evidence_for("j1") == writer.evidence_for("j1")
    # seq continues across instances: both append after everything already stored.
    assert [reader.append_event(_event("j1")), writer.append_event(_event("j1"))] == [6, 7]
    assert len(writer.events_for("j1")) == len(reader.events_for("j1")) == 7


def test_concurrent_appends_from_four_threads_lose_nothing_and_keep_order(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    shared = Ledger(path)
    second = Ledger(path)  # two instances: the file, not only the lock, must serialise writers
    per_thread = 40
    start = threading.Barrier(4)

    def append(worker: int) -> list[int]:
        ledger = shared if worker % 2 == 0 else second
        start.wait(timeout=30)
        return [ledger.append_event(_event("j1", worker=worker, i=i)) for i in range(per_thread)]

    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {worker: pool.submit(append, worker) for worker in range(4)}
        returned = {worker: future.result(timeout=120) for worker, future in futures.items()}  # re-raises
    events = shared.events_for("j1")
    assert len(events) == 4 * per_thread
    assert sorted((e.data["worker"], e.data["i"]) for e in events) == [(w, i) for w in range(4) for i in range(per_thread)]
    for worker in range(4):
        mine = [e.data["i"] for e in events if e.data["worker"] == worker]
        assert mine == list(range(per_thread)), f"worker {worker}'s events are out of order"
        assert returned[worker] == sorted(returned[worker])
    all_seqs = sorted(seq for seqs in returned.values() for seq in seqs)
    assert len(set(all_seqs)) == 4 * per_thread
    # events_for is in seq order: the i-th event listed carries the i-th smallest seq handed out.
    by_seq = {seq: (worker, i) for worker, seqs in returned.items() for i, seq in enumerate(seqs)}
    assert [(e.data["worker"], e.data["i"]) for e in events] == [by_seq[seq] for seq in all_seqs]


# --- evidence -----------------------------------------------------------------------------------------


def test_evidence_round_trip_keeps_none_apart_from_zero(ledger: Ledger) -> None:
    measured_zero = ExecutionEvidence(wall_seconds=0.0, cpu_percent_mean=0.0, gpu_util_percent_mean=None,
                                      image_digest="", exit_code=0)
    ledger.record_evidence("l-1", "j1", "task-000", "node-a", measured_zero, 0.0)
    ledger.record_evidence("l-2", "j1", "task-001", "node-b", None, None)
    ledger.record_evidence("l-3", "j1", "task-002", "node-a",
                           {"wall_seconds": -5, "exit_code": "0", "unknown_field": 1}, 12)
    ledger.record_evidence("l-4", "j2", "task-000", "node-c", ExecutionEvidence(), 1.5)
    got = ledger.evidence_for("j1")
    assert list(got) == ["task-000", "task-001", "task-002"]
    assert got["task-000"]["evidence"] == {"wall_seconds": 0.0, "cpu_percent_mean": 0.0,
                                           "gpu_util_percent_mean": None, "image_digest": "", "exit_code": 0}
    assert got["task-000"]["observed_elapsed_s"] == 0.0
    assert got["task-001"] == {**got["task-001"], "lease_id": "l-2", "node_id": "node-b", "evidence": None,
                               "observed_elapsed_s": None}
    # Recorded, never refused: implausible values stay; unknown fields are dropped; coercion as on the wire.
    assert got["task-002"]["evidence"]["wall_seconds"] == -5.0 and got["task-002"]["evidence"]["exit_code"] == 0
    assert "unknown_field" not in got["task-002"]["evidence"]
    assert got["task-002"]["observed_elapsed_s"] == 12.0
    assert ExecutionEvidence.model_validate(got["task-000"]["evidence"]) == measured_zero
    assert ledger.evidence_for("j2")["task-000"]["node_id"] == "node-c"
    assert ledger.evidence_for("nothing") == {}


def test_evidence_for_gives_the_latest_recorded_attempt_per_task(ledger: Ledger) -> None:
    # The clock goes backwards between the two records: insertion order still decides.
    ledger.record_evidence("lease-old", "j1", "t", "node-a", ExecutionEvidence(wall_seconds=1.0), 1.0,
                           recorded_at=T0 + timedelta(hours=1))
    ledger.record_evidence("lease-new", "j1", "t", "node-b", ExecutionEvidence(wall_seconds=2.0), 2.0,
                           recorded_at=T0)
    got = ledger.evidence_for("j1")["t"]
    assert (got["lease_id"], got["node_id"], got["evidence"]["wall_seconds"]) == ("lease-new", "node-b", 2.0)
    assert got["recorded_at"] == "2025-03-01T12:00:00.000000+00:00"
    # Re-recording an existing lease replaces its row and makes it the newest.
    ledger.record_evidence("lease-old", "j1", "t", "node-a", None, 3.0, recorded_at=datetime(2025, 3, 2))
    got = ledger.evidence_for("j1")["t"]
    assert (got["lease_id"], got["evidence"], got["observed_elapsed_s"]) == ("lease-old", None, 3.0)
    assert got["recorded_at"] == "2025-03-02T00:00:00.000000+00:00"  # naive read as UTC
    conn = sqlite3.connect(ledger.path)
    try:
        assert conn.execute("SELECT COUNT(*) FROM attempt_evidence").fetchone()[0] == 2
    finally:
        conn.close()


# --- bad input ----------------------------------------------------------------------------------------


def test_wrong_types_are_type_errors_and_change_nothing(ledger: Ledger) -> None:
    with pytest.raises(TypeError, match="record must be a JobRecord, got dict"):
        ledger.upsert_job(_job("j1").model_dump())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="event must be an Event, got str"):
        ledger.append_event("JOB_ACCEPTED")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="job_id must be a str, got int"):
        ledger.get_job(1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="job_id must be a str"):
        ledger.events_for(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="job_id must be a str"):
        ledger.evidence_for(b"j1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="evidence must be an ExecutionEvidence, a dict or None, got str"):
        ledger.record_evidence("l", "j1", "t", "n", "{}", None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="observed_elapsed_s must be a number"):
        ledger.record_evidence("l", "j1", "t", "n", None, "1.5")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="observed_elapsed_s must be a number"):
        ledger.record_evidence("l", "j1", "t", "n", None, True)
    with pytest.raises(TypeError, match="node_id must be a str"):
        ledger.record_evidence("l", "j1", "t", None, None, None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="recorded_at must be a datetime"):
        ledger.record_evidence("l", "j1", "t", "n", None, None, recorded_at="2025-01-01")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lease_id must be a non-empty string"):
        ledger.record_evidence("", "j1", "t", "n", None, None)
    with pytest.raises(ValueError, match="observed_elapsed_s must be finite"):
        ledger.record_evidence("l", "j1", "t", "n", None, float("nan"))
    with pytest.raises(ValidationError):
        ledger.record_evidence("l", "j1", "t", "n", {"wall_seconds": "fast"}, None)
    assert ledger.list_jobs() == [] and ledger.events_for("j1") == [] and ledger.evidence_for("j1") == {}


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
