"""One contract for the ``Ledger`` on every database it runs on: a SQLite file of its
own, a ``SqliteDatabase`` shared with other stores, and a ``PostgresDatabase`` (an empty
database of the session's cluster). Jobs, events and attempt evidence go in and come back
exactly; what is written inside a shared transaction commits or rolls back with it; a
second ledger on the same database sees everything; concurrent writers lose nothing; a
newer schema is refused."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from flashruntime.coordinator.ledger import Ledger
from flashruntime.postgres_database import PostgresDatabase
from flashruntime.protocol.v1alpha1 import (
    ArtifactRecord,
    Event,
    EventType,
    ExecutionEvidence,
    JobRecord,
    JobSpec,
    JobState,
)
from flashruntime.sqlite_database import SqliteDatabase

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


def job(job_id: str, created_at: datetime = T0, **fields: object) -> JobRecord:
    return JobRecord(job_id=job_id, spec=_spec(), backend="leases", created_at=created_at, **fields)


def event(job_id: str, kind: EventType = EventType.TASK_CREATED, **data: object) -> Event:
    return Event(job_id=job_id, type=kind, source="flashruntime.leases", message=f"{kind} {data}", data=data)


class Harness:
    """A ledger on one kind of database, and more ledgers on the same one."""

    def __init__(self, kind: str, tmp_path: Path, url: str | None) -> None:
        self.kind = kind
        self.path = tmp_path / "state" / "flashruntime.db"
        self.url = url
        self._opened: list[Any] = []  # ledgers and databases, closed in reverse at the end
        self.database = self._database() if kind != "sqlite-file" else None
        self.last_database = self.database
        self.ledger = self.another()

    def _database(self) -> SqliteDatabase | PostgresDatabase:
        database: SqliteDatabase | PostgresDatabase
        database = SqliteDatabase(self.path) if self.kind == "sqlite-shared" else PostgresDatabase(self.url or "")
        self._opened.append(database)
        return database

    def another(self, *, own_database: bool = False) -> Ledger:
        """A ledger on the same database: on the harness's shared database, or (``own_database``,
        and always for the file kind) on a connection or pool of its own, as another process has;
        ``last_database`` is the database it was given."""
        if self.kind == "sqlite-file":
            ledger = Ledger(self.path)
        else:
            self.last_database = self._database() if own_database else self.database
            ledger = Ledger(self.last_database)  # type: ignore[arg-type]
        self._opened.append(ledger)
        return ledger

    def transaction(self) -> Any:
        assert self.database is not None, "only a shared database has a transaction to join"
        return self.database.transaction()

    def close(self) -> None:
        for opened in reversed(self._opened):
            opened.close()


KINDS = ["sqlite-file", "sqlite-shared", "postgres"]
SHARED_KINDS = ["sqlite-shared", "postgres"]


def _harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    # Only the postgres kind asks for a database, so the other kinds never start the cluster.
    url = request.getfixturevalue("postgres_url") if request.param == "postgres" else None
    harness = Harness(request.param, tmp_path, url)
    yield harness
    harness.close()


@pytest.fixture(params=KINDS)
def h(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    yield from _harness(request, tmp_path)


@pytest.fixture(params=SHARED_KINDS)
def hs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    yield from _harness(request, tmp_path)


# --- jobs ---------------------------------------------------------------------------------------------


def test_job_round_trip_is_exact(h: Harness) -> None:
    record = job(
        "a1b2c3d4e5f6", state=JobState.SUCCEEDED, finished_at=T0 + timedelta(minutes=3), error=None,
        runtime_execution_id="exec-1",
        artifacts=[ArtifactRecord(uri="artifact://jobs/a1/t/metrics.json", backend="local", bucket="/data/artifacts",
                                  object_key="jobs/a1/t/metrics.json", sha256="ab" * 32, size_bytes=12,
                                  created_at=T0)],
    )
    h.ledger.upsert_job(record)
    got = h.ledger.get_job("a1b2c3d4e5f6")
    assert got == record and got is not record
    assert got.model_dump_json() == record.model_dump_json()
    assert h.ledger.get_job("missing") is None and h.ledger.get_job("") is None


def test_upsert_replaces_the_record(h: Harness) -> None:
    h.ledger.upsert_job(job("j1", state=JobState.RUNNING))
    h.ledger.upsert_job(job("j1", state=JobState.FAILED, error="2 of 3 tasks exhausted"))
    assert [record.job_id for record in h.ledger.list_jobs()] == ["j1"]
    got = h.ledger.get_job("j1")
    assert got is not None and got.state is JobState.FAILED and got.error == "2 of 3 tasks exhausted"


def test_upsert_with_events_stores_both_and_bad_events_store_neither(h: Harness) -> None:
    h.ledger.upsert_job(job("j1", state=JobState.RUNNING), events=[event("j1", EventType.JOB_ACCEPTED)])
    failed = job("j1", state=JobState.FAILED, finished_at=T0)
    with pytest.raises(TypeError, match="events must be Events, got a str"):
        h.ledger.upsert_job(failed, events=[event("j1", EventType.TASK_EXHAUSTED), "JOB_FAILED"])  # type: ignore[list-item]
    assert h.ledger.get_job("j1") == job("j1", state=JobState.RUNNING)
    assert [e.type for e in h.ledger.events_for("j1")] == [EventType.JOB_ACCEPTED]
    h.ledger.upsert_job(failed, events=[event("j1", EventType.TASK_EXHAUSTED), event("j1", EventType.JOB_FAILED)])
    assert h.ledger.get_job("j1") == failed
    assert [e.type for e in h.ledger.events_for("j1")] == [
        EventType.JOB_ACCEPTED, EventType.TASK_EXHAUSTED, EventType.JOB_FAILED]


def test_add_job_stores_the_job_and_its_first_events_together_or_not_at_all(h: Harness) -> None:
    events = [event("j1", EventType.JOB_ACCEPTED), event("j1", EventType.BACKEND_SELECTED), event("j1", task_id="t")]
    h.ledger.add_job(job("j1"), events)
    assert h.ledger.get_job("j1") == job("j1") and h.ledger.events_for("j1") == events
    with pytest.raises(ValueError, match="job 'j1' is already in the ledger; submit it under a new id"):
        h.ledger.add_job(job("j1", state=JobState.FAILED), [event("j1", EventType.JOB_FAILED)])
    assert h.ledger.get_job("j1") == job("j1") and h.ledger.events_for("j1") == events  # nothing changed
    with pytest.raises(TypeError, match="events must be Events, got a str"):
        h.ledger.add_job(job("j2"), [event("j2", EventType.JOB_ACCEPTED), "TASK_CREATED"])  # type: ignore[list-item]
    assert h.ledger.get_job("j2") is None and h.ledger.events_for("j2") == []


def test_list_jobs_is_newest_first_across_formats(h: Harness) -> None:
    # Whole seconds against fractions, and another offset: the stored order must still be time order.
    created = {
        "whole": T0 + timedelta(seconds=1),
        "fraction": T0 + timedelta(seconds=0, microseconds=500_000),
        "later-offset": datetime(2025, 3, 1, 14, 0, 2, tzinfo=timezone(timedelta(hours=2))),  # 12:00:02 UTC
        "naive": datetime(2025, 3, 1, 11, 59, 59),  # read as UTC
    }
    for job_id in ("naive", "whole", "later-offset", "fraction"):
        h.ledger.upsert_job(job(job_id, created[job_id]))
    assert [record.job_id for record in h.ledger.list_jobs()] == ["later-offset", "whole", "fraction", "naive"]
    assert h.ledger.list_jobs()[0].created_at == datetime(2025, 3, 1, 12, 0, 2, tzinfo=timezone.utc)


def test_equal_creation_times_list_the_newest_insert_first(h: Harness) -> None:
    for job_id in ("b", "a", "c"):
        h.ledger.upsert_job(job(job_id, T0))
    h.ledger.upsert_job(job("b", T0, state=JobState.RUNNING))  # a replaced record keeps its place
    assert [record.job_id for record in h.ledger.list_jobs()] == ["c", "a", "b"]
    assert h.another(own_database=True).list_jobs() == h.ledger.list_jobs()


# --- events -------------------------------------------------------------------------------------------


def test_events_round_trip_in_seq_order_per_job(h: Harness) -> None:
    first = event("j1", EventType.JOB_ACCEPTED)
    # A later event with an earlier timestamp: the ledger order is seq, not the timestamp.
    second = Event(job_id="j1", type=EventType.BACKEND_SELECTED, source="flashruntime.service",
                   message="backend: leases (2 independent tasks)", timestamp=T0,
                   data={"nested": {"list": [1, 2.5, None, "x"]}, "ok": True, "nul": "a\x00b"})
    other = event("j2", EventType.JOB_ACCEPTED)
    node_scoped = event("", EventType.NODE_CORDONED, node_id="n1")
    seqs = [h.ledger.append_event(e) for e in (first, other, second, node_scoped)]
    assert seqs == sorted(seqs) and len(set(seqs)) == 4
    assert h.ledger.events_for("j1") == [first, second]
    assert h.ledger.events_for("j2") == [other]
    assert h.ledger.events_for("") == [node_scoped]
    assert h.ledger.events_for("nobody") == []
    assert h.ledger.events_for("j1")[1].data == {"nested": {"list": [1, 2.5, None, "x"]}, "ok": True, "nul": "a\x00b"}


def test_another_ledger_on_the_database_sees_everything_and_seq_keeps_growing(h: Harness) -> None:
    writer = h.ledger
    writer.upsert_job(job("j1"))
    events = [event("j1", index=i) for i in range(5)]
    seqs = [writer.append_event(e) for e in events]
    writer.record_evidence("lease-1", "j1", "task-000", "node-a", ExecutionEvidence(wall_seconds=3.5), 4.0)
    reader = h.another(own_database=True)
    assert reader.get_job("j1") == job("j1")
    assert reader.events_for("j1") == events
    assert reader.evidence_for("j1") == writer.evidence_for("j1")
    # Both append after everything already stored, whichever wrote it.
    later = [reader.append_event(event("j1")), writer.append_event(event("j1"))]
    assert max(seqs) < later[0] < later[1]
    assert len(writer.events_for("j1")) == len(reader.events_for("j1")) == 7


def test_concurrent_appends_from_four_threads_lose_nothing_and_keep_order(h: Harness) -> None:
    ledgers = [h.ledger, h.another(own_database=True)]  # two connections: the database must serialise them
    per_thread = 40
    start = threading.Barrier(4)

    def append(worker: int) -> list[int]:
        ledger = ledgers[worker % 2]
        start.wait(timeout=30)
        return [ledger.append_event(event("j1", worker=worker, i=i)) for i in range(per_thread)]

    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {worker: pool.submit(append, worker) for worker in range(4)}
        returned = {worker: future.result(timeout=120) for worker, future in futures.items()}  # re-raises
    events = h.ledger.events_for("j1")
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


def test_evidence_round_trip_keeps_none_apart_from_zero(h: Harness) -> None:
    measured_zero = ExecutionEvidence(wall_seconds=0.0, cpu_percent_mean=0.0, gpu_util_percent_mean=None,
                                      image_digest="", exit_code=0)
    h.ledger.record_evidence("l-1", "j1", "task-000", "node-a", measured_zero, 0.0)
    h.ledger.record_evidence("l-2", "j1", "task-001", "node-b", None, None)
    h.ledger.record_evidence("l-3", "j1", "task-002", "node-a",
                             {"wall_seconds": -5, "exit_code": "0", "unknown_field": 1}, 12)
    h.ledger.record_evidence("l-4", "j2", "task-000", "node-c", ExecutionEvidence(), 1.5)
    on_ray = ExecutionEvidence(exit_code=0, ray_node_id="9d06e8e1", node_ip="10.0.0.7", hostname="gpu-7",
                               worker_pid=4242, gpu_ids=["0", "3"])
    h.ledger.record_evidence("l-5", "j3", "task-000", "ray", on_ray, 2.0)
    assert ExecutionEvidence.model_validate(h.ledger.evidence_for("j3")["task-000"]["evidence"]) == on_ray
    got = h.ledger.evidence_for("j1")
    assert list(got) == ["task-000", "task-001", "task-002"]
    assert got["task-000"]["evidence"] == {"wall_seconds": 0.0, "cpu_percent_mean": 0.0,
                                           "gpu_util_percent_mean": None, "image_digest": "", "exit_code": 0,
                                           "ray_node_id": None, "node_ip": None, "hostname": None,
                                           "worker_pid": None, "gpu_ids": None}
    assert got["task-000"]["observed_elapsed_s"] == 0.0
    assert got["task-001"] == {**got["task-001"], "lease_id": "l-2", "node_id": "node-b", "evidence": None,
                               "observed_elapsed_s": None}
    # Recorded, never refused: implausible values stay; unknown fields are dropped; coercion as on the wire.
    assert got["task-002"]["evidence"]["wall_seconds"] == -5.0 and got["task-002"]["evidence"]["exit_code"] == 0
    assert "unknown_field" not in got["task-002"]["evidence"]
    assert got["task-002"]["observed_elapsed_s"] == 12.0 and isinstance(got["task-002"]["observed_elapsed_s"], float)
    assert ExecutionEvidence.model_validate(got["task-000"]["evidence"]) == measured_zero
    assert h.ledger.evidence_for("j2")["task-000"]["node_id"] == "node-c"
    assert h.ledger.evidence_for("nothing") == {}


def test_evidence_for_gives_the_latest_recorded_attempt_per_task(h: Harness) -> None:
    # The clock goes backwards between the two records: insertion order still decides.
    h.ledger.record_evidence("lease-old", "j1", "t", "node-a", ExecutionEvidence(wall_seconds=1.0), 1.0,
                             recorded_at=T0 + timedelta(hours=1))
    h.ledger.record_evidence("lease-new", "j1", "t", "node-b", ExecutionEvidence(wall_seconds=2.0), 2.0,
                             recorded_at=T0)
    got = h.ledger.evidence_for("j1")["t"]
    assert (got["lease_id"], got["node_id"], got["evidence"]["wall_seconds"]) == ("lease-new", "node-b", 2.0)
    assert got["recorded_at"] == "2025-03-01T12:00:00.000000+00:00"
    # Re-recording an existing lease replaces its row and makes it the newest.
    h.ledger.record_evidence("lease-old", "j1", "t", "node-a", None, 3.0, recorded_at=datetime(2025, 3, 2))
    got = h.ledger.evidence_for("j1")["t"]
    assert (got["lease_id"], got["evidence"], got["observed_elapsed_s"]) == ("lease-old", None, 3.0)
    assert got["recorded_at"] == "2025-03-02T00:00:00.000000+00:00"  # naive read as UTC
    h.ledger.record_evidence("lease-new", "j1", "t", "node-b", None, 4.0)
    assert h.ledger.evidence_for("j1")["t"]["lease_id"] == "lease-new"


# --- bad input ----------------------------------------------------------------------------------------


def test_wrong_types_are_type_errors_and_change_nothing(h: Harness) -> None:
    ledger = h.ledger
    with pytest.raises(TypeError, match="record must be a JobRecord, got dict"):
        ledger.upsert_job(job("j1").model_dump())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="record must be a JobRecord, got dict"):
        ledger.add_job(job("j1").model_dump(), [])  # type: ignore[arg-type]
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


# --- shared transactions ------------------------------------------------------------------------------


def test_writes_inside_a_shared_transaction_that_raises_are_rolled_back(hs: Harness) -> None:
    hs.ledger.upsert_job(job("j1", state=JobState.RUNNING))
    with pytest.raises(RuntimeError, match="after the writes"), hs.transaction():
        hs.ledger.upsert_job(job("j1", state=JobState.SUCCEEDED), events=[event("j1", EventType.JOB_SUCCEEDED)])
        hs.ledger.add_job(job("j2"), [event("j2", EventType.JOB_ACCEPTED)])
        hs.ledger.append_event(event("j1", EventType.TASK_COMMIT_ACCEPTED))
        hs.ledger.record_evidence("lease-1", "j1", "t", "n", None, 1.0)
        assert hs.ledger.get_job("j1").state is JobState.SUCCEEDED  # type: ignore[union-attr]  # seen inside it
        raise RuntimeError("after the writes")
    assert hs.ledger.get_job("j1") == job("j1", state=JobState.RUNNING)
    assert hs.ledger.get_job("j2") is None
    assert hs.ledger.events_for("j1") == [] and hs.ledger.evidence_for("j1") == {}


def test_writes_inside_a_shared_transaction_commit_with_it(hs: Harness) -> None:
    other = hs.another(own_database=True)
    with hs.transaction():
        hs.ledger.add_job(job("j1"), [event("j1", EventType.JOB_ACCEPTED)])
        hs.ledger.append_event(event("j1"))
        if hs.kind == "postgres":  # SQLite's writer holds the file: another connection would wait, not look
            assert other.get_job("j1") is None and other.events_for("j1") == []  # not committed yet
    assert other.get_job("j1") == job("j1") and len(other.events_for("j1")) == 2


def test_a_locked_read_waits_for_the_transaction_that_locked_the_job(hs: Harness) -> None:
    """What deciding a job's next state relies on: the second transaction to read the job
    with ``lock=True`` reads what the first one wrote, never the state before it."""
    hs.ledger.upsert_job(job("j1", state=JobState.RUNNING))
    second = hs.another(own_database=True)  # another connection, as another replica has
    second_database = hs.last_database
    locked, seen = threading.Event(), []

    def first() -> None:
        with hs.transaction():
            assert hs.ledger.get_job("j1", lock=True).state is JobState.RUNNING  # type: ignore[union-attr]
            locked.set()
            time.sleep(0.3)
            hs.ledger.upsert_job(job("j1", state=JobState.SUCCEEDED))

    thread = threading.Thread(target=first)
    thread.start()
    assert locked.wait(10)
    with second_database.transaction():  # type: ignore[union-attr]
        seen.append(second.get_job("j1", lock=True))
    thread.join(10)
    assert seen[0] is not None and seen[0].state is JobState.SUCCEEDED


# --- schema -------------------------------------------------------------------------------------------


def test_a_newer_schema_is_refused_naming_the_database(h: Harness) -> None:
    h.ledger.upsert_job(job("j1"))
    if h.kind == "postgres":
        h.database.execute("UPDATE ledger_meta SET value = '2' WHERE key = 'schema_version'")  # type: ignore[union-attr]
        with pytest.raises(RuntimeError, match=r"PostgreSQL database .* ledger schema version '2' is not one"):
            h.another(own_database=True)
        h.database.execute("UPDATE ledger_meta SET value = '1' WHERE key = 'schema_version'")  # type: ignore[union-attr]
    else:
        conn = sqlite3.connect(h.path)
        conn.execute("PRAGMA user_version = 99")
        conn.close()
        with pytest.raises(RuntimeError, match=f"{h.path}: ledger schema version 99 is newer"):
            h.another(own_database=True)
        conn = sqlite3.connect(h.path)
        conn.execute("PRAGMA user_version = 2")
        conn.close()
    assert h.another(own_database=True).get_job("j1") == job("j1")


def test_postgres_ids_with_nul_are_refused_on_write_and_found_nowhere_on_read(postgres_url: str) -> None:
    database = PostgresDatabase(postgres_url)
    try:
        ledger = Ledger(database)
        with pytest.raises(ValueError, match="cannot contain NUL"):
            ledger.upsert_job(job("j\x00"))
        with pytest.raises(ValueError, match="cannot contain NUL"):
            ledger.append_event(event("j\x00"))
        with pytest.raises(ValueError, match="cannot contain NUL"):
            ledger.record_evidence("lease\x00", "j1", "t", "n", None, None)
        assert ledger.get_job("j\x00") is None and ledger.events_for("j\x00") == []
        assert ledger.evidence_for("j\x00") == {} and ledger.list_jobs() == []
    finally:
        database.close()
