"""One contract for every lease store: each test runs against
``InMemoryLeaseStore``, ``SqliteLeaseStore`` on a temp file, ``SqliteLeaseStore``
reopened from disk before every step, and ``PostgresLeaseStore`` on a fresh database of
the session's PostgreSQL cluster. Manager-level tests also run against a user store that
implements only the required methods (the manager's fallbacks).

``memory_general`` runs every test over a subclass of ``InMemoryLeaseStore``, as a
store that extends the in-memory one would be.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from flashruntime.errors import FlashRuntimeError
from flashruntime.leases import (
    InMemoryLeaseStore,
    LeaseError,
    LeaseManager,
    LeaseStore,
    SqliteLeaseStore,
    TaskRecord,
)
from flashruntime.leases._offer import PAGE_SIZE
from flashruntime.leases.postgres_store import PostgresLeaseStore
from flashruntime.protocol.v1alpha1 import Event, EventType, TaskSpec, TaskState
from flashruntime.scheduler import FifoPlacement, IsolationAwarePlacement, PlacementPolicy

T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)
SHA = "ab" * 32
LEASE_ID = re.compile(r"ls-[0-9a-f]{12}")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def spec(task_id: str = "task-000", job_id: str = "job-a", **fields: Any) -> TaskSpec:
    fields.setdefault("commit_key", f"{job_id}/{task_id}")
    return TaskSpec(task_id=task_id, job_id=job_id, **fields)


class MinimalStore:
    """A user store with only the required LeaseStore methods."""

    def __init__(self) -> None:
        self._records: dict[tuple[str, str], TaskRecord] = {}
        self._seq = 0

    def add(self, record: TaskRecord) -> None:
        key = (record.spec.job_id, record.spec.task_id)
        if key in self._records:
            raise ValueError(f"duplicate task {key}")
        self._seq += 1
        record.seq = self._seq
        self._records[key] = record

    def save(self, record: TaskRecord) -> None:
        pass

    def get(self, job_id: str, task_id: str) -> TaskRecord | None:
        return self._records.get((job_id, task_id))

    def next_pending(self, job_id: str | None = None) -> TaskRecord | None:
        return next(
            (
                r
                for r in self._records.values()
                if r.state is TaskState.PENDING and (job_id is None or r.spec.job_id == job_id)
            ),
            None,
        )

    def leased(self) -> list[TaskRecord]:
        return [r for r in self._records.values() if r.state is TaskState.LEASED]

    def all(self, job_id: str | None = None) -> list[TaskRecord]:
        return [r for r in self._records.values() if job_id is None or r.spec.job_id == job_id]


class GeneralPathMemoryStore(InMemoryLeaseStore):
    """The in-memory store, extended by a subclass that adds nothing."""


class Harness:
    """A store of one kind, a manager over it, and the events it emitted."""

    def __init__(self, kind: str, tmp_path: Path, url: str | None = None) -> None:
        self.kind = kind
        self.path = tmp_path / "state" / "leases.db"
        self.url = url  # the database of the postgres kind
        self.events: list[Event] = []
        self._store: Any = self._open()
        self._manager = LeaseManager(self._store, on_event=self.events.append)

    def _open(self) -> Any:
        if self.kind == "memory":
            return InMemoryLeaseStore()
        if self.kind == "memory_general":
            return GeneralPathMemoryStore()
        if self.kind == "minimal":
            return MinimalStore()
        if self.kind == "postgres":
            return PostgresLeaseStore(self.url)  # type: ignore[arg-type]
        return SqliteLeaseStore(self.path)

    def independent_store(self) -> Any:
        """A second store on the same database, with connections of its own (another process's view)."""
        if self.kind == "postgres":
            return PostgresLeaseStore(self.url)  # type: ignore[arg-type]
        return SqliteLeaseStore(self.path)

    def store(self) -> Any:
        """The store for the next step: under ``sqlite_reopen``, a fresh one from disk."""
        if self.kind == "sqlite_reopen":
            self._store.close()
            self._store = SqliteLeaseStore(self.path)
        return self._store

    @property
    def mgr(self) -> LeaseManager:
        if self.kind != "sqlite_reopen":
            return self._manager
        return _ReopeningManager(self)  # type: ignore[return-value]

    def take(self) -> list[str]:
        """Event types emitted since the last call."""
        types = [event.type.value for event in self.events]
        self.taken = list(self.events)
        self.events.clear()
        return types

    def close(self) -> None:
        if hasattr(self._store, "close"):
            self._store.close()


class _ReopeningManager:
    """Every call goes to a new LeaseManager over a store freshly reopened from disk."""

    def __init__(self, harness: Harness) -> None:
        self._harness = harness

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            manager = LeaseManager(self._harness.store(), on_event=self._harness.events.append)
            return getattr(manager, name)(*args, **kwargs)

        return call


STORE_KINDS = ["memory", "memory_general", "sqlite", "sqlite_reopen", "postgres"]
IN_MEMORY = ("memory", "memory_general")


def _harness(request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    # Only the postgres kind asks for a database, so the other kinds never start the cluster.
    url = request.getfixturevalue("postgres_url") if request.param == "postgres" else None
    return Harness(request.param, tmp_path, url)


@pytest.fixture(params=STORE_KINDS)
def h(request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    harness = _harness(request, tmp_path)
    yield harness  # type: ignore[misc]
    harness.close()


@pytest.fixture(params=[*STORE_KINDS, "minimal"])
def hm(request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    """Manager-level tests: the stores plus a store with only the required methods."""
    harness = _harness(request, tmp_path)
    yield harness  # type: ignore[misc]
    harness.close()


def bulk_add(h: Harness, specs: list[TaskSpec]) -> None:
    """Queue many tasks in one store transaction (one fsync instead of one per task)."""
    store = h.store()
    manager = LeaseManager(store)
    transaction = getattr(store, "transaction", None)
    if transaction is None:
        for task in specs:
            manager.add_task(task, now=at(0))
        return
    with transaction():
        for task in specs:
            manager.add_task(task, now=at(0))


def state_of(h: Harness, job_id: str = "job-a", task_id: str = "task-000") -> TaskRecord:
    record = h.store().get(job_id, task_id)
    assert record is not None
    return record


# --- add / claim ------------------------------------------------------------


def test_add_task_queues_pending_and_emits_task_created(hm: Harness) -> None:
    hm.mgr.add_task(spec(), now=at(0))
    record = state_of(hm)
    assert record.state is TaskState.PENDING
    assert (record.attempts_used, record.failures_seen, record.expiries_seen, record.releases_seen) == (0, 0, 0, 0)
    assert record.active_lease is None and record.lease_history == {}
    assert record.accepted_attempt_id is None and record.accepted_output_sha256 is None
    assert record.seq == 1
    assert hm.take() == ["TASK_CREATED"]
    event = hm.taken[0]
    assert event.job_id == "job-a" and event.source == "flashruntime.leases"
    assert event.timestamp == at(0) and event.data["task_id"] == "task-000"


def test_duplicate_task_raises_value_error_and_changes_nothing(hm: Harness) -> None:
    hm.mgr.add_task(spec(payload={"v": 1}), now=at(0))
    hm.take()
    with pytest.raises(ValueError, match="duplicate"):
        hm.mgr.add_task(spec(payload={"v": 2}), now=at(1))
    assert hm.take() == []
    records = hm.mgr.records()
    assert len(records) == 1 and records[0].spec.payload == {"v": 1}


def test_same_task_id_in_two_jobs_is_two_tasks(hm: Harness) -> None:
    hm.mgr.add_task(spec("task-000", "job-a"), now=at(0))
    hm.mgr.add_task(spec("task-000", "job-b"), now=at(0))
    assert [(r.spec.job_id, r.seq) for r in hm.mgr.records()] == [("job-a", 1), ("job-b", 2)]
    assert [r.spec.job_id for r in hm.mgr.records("job-b")] == ["job-b"]


def test_claim_leases_first_pending_and_emits_lease_claimed(hm: Harness) -> None:
    hm.mgr.add_task(spec("t1", payload={"lr": 0.1}, lease_seconds=30), now=at(0))
    hm.mgr.add_task(spec("t2"), now=at(0))
    hm.take()
    lease = hm.mgr.claim("node-1", now=at(5))
    assert lease is not None
    assert LEASE_ID.fullmatch(lease.lease_id)
    assert (lease.task_id, lease.job_id, lease.node_id) == ("t1", "job-a", "node-1")
    assert lease.attempt_number == 1
    assert lease.deadline == at(35) and lease.lease_seconds == 30.0
    assert lease.payload == {"lr": 0.1}
    record = state_of(hm, task_id="t1")
    assert record.state is TaskState.LEASED and record.attempts_used == 1
    assert record.active_lease == lease
    assert record.lease_history == {lease.lease_id: lease}
    assert hm.take() == ["LEASE_CLAIMED"]
    event = hm.taken[0]
    assert "attempt 1" in event.message and at(35).isoformat() in event.message
    assert event.data["task_id"] == "t1" and event.data["node_id"] == "node-1"
    assert event.data["lease_id"] == lease.lease_id
    assert hm.mgr.lease_info(lease.lease_id) == lease


def test_claim_on_empty_queue_returns_none(hm: Harness) -> None:
    assert hm.mgr.claim("node-1", now=at(0)) is None
    hm.mgr.add_task(spec(), now=at(0))
    assert hm.mgr.claim("node-1", now=at(0)) is not None
    assert hm.mgr.claim("node-2", now=at(0)) is None


def test_claim_order_is_insertion_order_across_jobs_and_job_scope(hm: Harness) -> None:
    for task_id, job_id in [("a", "j1"), ("b", "j2"), ("c", "j1"), ("d", "j2")]:
        hm.mgr.add_task(spec(task_id, job_id), now=at(0))
    first = hm.mgr.claim("n", job_id="j2", now=at(1))
    assert first is not None and first.task_id == "b"
    order = [hm.mgr.claim("n", now=at(1)) for _ in range(3)]
    assert [lease.task_id for lease in order] == ["a", "c", "d"]  # type: ignore[union-attr]
    assert hm.mgr.claim("n", job_id="unknown-job", now=at(1)) is None


def test_requeued_task_keeps_its_queue_position(hm: Harness) -> None:
    for i in range(3):
        hm.mgr.add_task(spec(f"t{i}"), now=at(0))
    lease = hm.mgr.claim("n", now=at(1))
    assert lease is not None and lease.task_id == "t0"
    hm.mgr.fail(lease.lease_id, "boom", now=at(2))
    again = hm.mgr.claim("n", now=at(3))
    assert again is not None and again.task_id == "t0" and again.attempt_number == 2


# --- heartbeat ----------------------------------------------------------------


def test_heartbeat_extends_deadline_history_keeps_first_issue(hm: Harness) -> None:
    hm.mgr.add_task(spec(lease_seconds=10), now=at(0))
    lease = hm.mgr.claim("n", now=at(0))
    assert lease is not None
    hm.take()
    renewed = hm.mgr.heartbeat(lease.lease_id, now=at(8))
    assert renewed.deadline == at(18)
    assert renewed.lease_id == lease.lease_id and renewed.attempt_number == 1
    assert renewed.model_dump(exclude={"deadline"}) == lease.model_dump(exclude={"deadline"})
    assert hm.take() == ["LEASE_RENEWED"]
    assert hm.taken[0].data["lease_id"] == lease.lease_id
    record = state_of(hm)
    assert record.active_lease is not None and record.active_lease.deadline == at(18)
    assert record.lease_history[lease.lease_id].deadline == at(10)
    assert hm.mgr.lease_info(lease.lease_id).deadline == at(10)  # type: ignore[union-attr]
    assert hm.mgr.lease_is_live(lease.lease_id, now=at(17.5))
    assert hm.mgr.sweep(now=at(12)) == 0


def test_heartbeat_unknown_lease_raises_without_event(hm: Harness) -> None:
    hm.mgr.add_task(spec(), now=at(0))
    hm.take()
    with pytest.raises(LeaseError, match="unknown lease"):
        hm.mgr.heartbeat("ls-000000000000", now=at(0))
    assert hm.take() == []


def test_heartbeat_at_deadline_is_refused_inclusive_expiry(hm: Harness) -> None:
    hm.mgr.add_task(spec(lease_seconds=10), now=at(0))
    lease = hm.mgr.claim("n", now=at(0))
    assert lease is not None
    hm.take()
    with pytest.raises(LeaseError, match="no longer live"):
        hm.mgr.heartbeat(lease.lease_id, now=at(10))  # deadline reached, no sweep has run
    assert hm.take() == ["LEASE_RENEWAL_REFUSED"]
    assert hm.taken[0].data["lease_id"] == lease.lease_id
    record = state_of(hm)
    assert record.state is TaskState.LEASED and record.active_lease.deadline == at(10)  # type: ignore[union-attr]


def test_heartbeat_of_released_lease_is_refused(hm: Harness) -> None:
    hm.mgr.add_task(spec(), now=at(0))
    lease = hm.mgr.claim("n", now=at(0))
    assert lease is not None
    hm.mgr.fail(lease.lease_id, "oops", now=at(1))
    hm.take()
    with pytest.raises(LeaseError, match="no longer live"):
        hm.mgr.heartbeat(lease.lease_id, now=at(2))
    assert hm.take() == ["LEASE_RENEWAL_REFUSED"]


# --- complete -------------------------------------------------------------------


def test_complete_accepts_first_valid_commit(hm: Harness) -> None:
    hm.mgr.add_task(spec(), now=at(0))
    lease = hm.mgr.claim("n", now=at(0))
    assert lease is not None
    hm.take()
    assert hm.mgr.complete(lease.lease_id, SHA, now=at(1)) is True
    record = state_of(hm)
    assert record.state is TaskState.COMPLETED
    assert record.accepted_attempt_id == lease.lease_id and record.accepted_output_sha256 == SHA
    assert record.active_lease is None
    assert hm.take() == ["TASK_COMMIT_ACCEPTED"]
    assert SHA[:12] in hm.taken[0].message
    assert not hm.mgr.lease_is_live(lease.lease_id, now=at(1))
    assert hm.mgr.job_state("job-a") == {"COMPLETED": 1}


def test_winner_recommit_is_idempotent_without_event(hm: Harness) -> None:
    hm.mgr.add_task(spec(), now=at(0))
    lease = hm.mgr.claim("n", now=at(0))
    assert lease is not None
    assert hm.mgr.complete(lease.lease_id, SHA, now=at(1))
    hm.take()
    assert hm.mgr.complete(lease.lease_id, SHA, now=at(500)) is True  # even long after the deadline
    assert hm.mgr.complete(lease.lease_id, "cd" * 32, now=at(2)) is True  # the accepted output stays
    assert hm.take() == []
    assert state_of(hm).accepted_output_sha256 == SHA


def test_late_commit_of_expired_lease_is_rejected_after_another_wins(hm: Harness) -> None:
    hm.mgr.add_task(spec(lease_seconds=10), now=at(0))
    first = hm.mgr.claim("slow-node", now=at(0))
    assert first is not None
    second = hm.mgr.claim("fast-node", now=at(11))  # the claim sweeps first: attempt 1 expired
    assert second is not None and second.attempt_number == 2
    assert hm.mgr.complete(second.lease_id, SHA, now=at(12)) is True
    hm.take()
    assert hm.mgr.complete(first.lease_id, "cd" * 32, now=at(13)) is False
    assert hm.take() == ["TASK_COMMIT_REJECTED"]
    assert hm.taken[0].data["lease_id"] == first.lease_id
    assert "rejected as a late/duplicate commit: the task was already committed by" in hm.taken[0].message
    record = state_of(hm)
    assert record.accepted_attempt_id == second.lease_id and record.accepted_output_sha256 == SHA


def test_commit_at_deadline_is_rejected_even_before_a_sweep(hm: Harness) -> None:
    hm.mgr.add_task(spec(lease_seconds=10), now=at(0))
    lease = hm.mgr.claim("n", now=at(0))
    assert lease is not None
    hm.take()
    assert hm.mgr.complete(lease.lease_id, SHA, now=at(10)) is False
    assert hm.take() == ["TASK_COMMIT_REJECTED"]
    assert state_of(hm).state is TaskState.LEASED
    assert hm.mgr.sweep(now=at(10)) == 1


def test_complete_unknown_lease_raises(hm: Harness) -> None:
    with pytest.raises(LeaseError, match="unknown lease"):
        hm.mgr.complete("ls-ffffffffffff", SHA, now=at(0))


# --- fail and the max_attempts budget ---------------------------------------------


def test_fail_requeues_until_max_attempts_then_exhausts(hm: Harness) -> None:
    hm.mgr.add_task(spec(max_attempts=3), now=at(0))
    hm.take()
    for attempt in (1, 2):
        lease = hm.mgr.claim("n", now=at(attempt))
        assert lease is not None and lease.attempt_number == attempt
        hm.mgr.fail(lease.lease_id, f"crash {attempt}", now=at(attempt))
        assert hm.take() == ["LEASE_CLAIMED", "TASK_ATTEMPT_FAILED", "TASK_REQUEUED"]
        assert hm.taken[1].message == f"crash {attempt}"
        record = state_of(hm)
        assert record.state is TaskState.PENDING and record.failures_seen == attempt
        assert record.active_lease is None
    lease = hm.mgr.claim("n", now=at(3))
    assert lease is not None
    hm.mgr.fail(lease.lease_id, "crash 3", now=at(3))
    assert hm.take() == ["LEASE_CLAIMED", "TASK_ATTEMPT_FAILED", "TASK_EXHAUSTED"]
    exhausted = hm.taken[2]
    assert exhausted.message == "all 3 failures used (max_attempts)"
    assert exhausted.data["budget"] == "max_attempts"
    record = state_of(hm)
    assert record.state is TaskState.FAILED and record.failures_seen == 3 and record.expiries_seen == 0
    assert record.attempts_used == 3 and len(record.lease_history) == 3
    assert hm.mgr.claim("n", now=at(4)) is None


def test_a_fail_without_retry_exhausts_at_once_and_is_stored_so(hm: Harness) -> None:
    hm.mgr.add_task(spec(max_attempts=3), now=at(0))
    hm.take()
    lease = hm.mgr.claim("n", now=at(1))
    assert lease is not None
    hm.mgr.fail(lease.lease_id, "ModuleNotFoundError", now=at(1), retry=False)
    assert hm.take() == ["LEASE_CLAIMED", "TASK_ATTEMPT_FAILED", "TASK_EXHAUSTED"]
    assert hm.taken[2].message.startswith("failed without a retry")
    record = state_of(hm)
    assert record.state is TaskState.FAILED and record.failures_seen == 1 and record.active_lease is None
    assert hm.mgr.claim("n", now=at(2)) is None


def test_fail_of_unknown_or_dead_lease_raises_and_changes_nothing(hm: Harness) -> None:
    hm.mgr.add_task(spec(lease_seconds=10), now=at(0))
    with pytest.raises(LeaseError, match="unknown lease"):
        hm.mgr.fail("ls-123456789abc", "x", now=at(0))
    lease = hm.mgr.claim("n", now=at(0))
    assert lease is not None
    hm.take()
    with pytest.raises(LeaseError, match="no longer live"):
        hm.mgr.fail(lease.lease_id, "late", now=at(10))
    assert hm.take() == []
    record = state_of(hm)
    assert record.state is TaskState.LEASED and record.failures_seen == 0


# --- release (a drain) and abandon (a worker that died) ----------------------------


def test_release_requeues_at_once_and_spends_no_budget(hm: Harness) -> None:
    hm.mgr.add_task(spec(max_attempts=1, max_expiries=1, lease_seconds=10), now=at(0))
    hm.take()
    for attempt in (1, 2, 3):  # more releases than either budget allows: none is spent
        lease = hm.mgr.claim("n", now=at(attempt))
        assert lease is not None and lease.attempt_number == attempt
        assert hm.mgr.release(lease.lease_id, "agent shutdown", now=at(attempt)) is None
        assert hm.take() == ["LEASE_CLAIMED", "LEASE_RELEASED", "TASK_REQUEUED"]
        released, requeued = hm.taken[1:]
        assert released.message == (f"lease {lease.lease_id} (attempt {attempt}) of task task-000 on n released by "
                                    "its worker: agent shutdown")
        assert released.data == {"task_id": "task-000", "node_id": "n", "lease_id": lease.lease_id,
                                 "attempt_number": attempt, "reason": "agent shutdown"}
        assert requeued.message == f"task task-000 requeued after a release (no budget spent; {attempt} released)"
        assert requeued.data["released"] == attempt
        record = state_of(hm)
        assert record.state is TaskState.PENDING and record.active_lease is None
        assert (record.failures_seen, record.expiries_seen, record.releases_seen) == (0, 0, attempt)
        assert hm.mgr.lease_is_live(lease.lease_id, now=at(attempt)) is False
    lease = hm.mgr.claim("n2", now=at(4))
    assert lease is not None and lease.attempt_number == 4
    assert hm.mgr.complete(lease.lease_id, SHA, now=at(5)) is True
    record = state_of(hm)
    assert record.state is TaskState.COMPLETED and record.releases_seen == 3 and record.attempts_used == 4
    assert len(record.lease_history) == 4


def test_a_released_lease_is_dead_and_a_repeat_is_refused(hm: Harness) -> None:
    hm.mgr.add_task(spec(lease_seconds=10), now=at(0))
    lease = hm.mgr.claim("n", now=at(0))
    assert lease is not None
    hm.mgr.release(lease.lease_id, now=at(1))
    assert hm.take() == ["TASK_CREATED", "LEASE_CLAIMED", "LEASE_RELEASED", "TASK_REQUEUED"]
    assert hm.taken[2].message.endswith("released by its worker")  # no reason given: none appended
    with pytest.raises(LeaseError, match="no longer live"):
        hm.mgr.release(lease.lease_id, "again", now=at(1))  # a repeat of an applied release
    with pytest.raises(LeaseError, match="no longer live"):
        hm.mgr.abandon(lease.lease_id, now=at(1))
    with pytest.raises(LeaseError, match="no longer live"):
        hm.mgr.fail(lease.lease_id, "late", now=at(1))
    with pytest.raises(LeaseError, match="no longer live"):
        hm.mgr.heartbeat(lease.lease_id, now=at(2))
    assert hm.mgr.complete(lease.lease_id, SHA, now=at(2)) is False
    assert hm.take() == ["LEASE_RENEWAL_REFUSED", "TASK_COMMIT_REJECTED"]
    record = state_of(hm)
    assert record.state is TaskState.PENDING and record.releases_seen == 1 and record.failures_seen == 0


def test_release_and_abandon_of_unknown_expired_or_ended_leases_raise_and_change_nothing(hm: Harness) -> None:
    hm.mgr.add_task(spec("done", lease_seconds=10), now=at(0))
    hm.mgr.add_task(spec("late", lease_seconds=10), now=at(0))
    done = hm.mgr.claim("n", now=at(0))
    late = hm.mgr.claim("n", now=at(0))
    assert done is not None and late is not None
    assert hm.mgr.complete(done.lease_id, SHA, now=at(1)) is True
    hm.take()
    before = _snapshot(hm)
    for operation in (hm.mgr.release, hm.mgr.abandon):
        with pytest.raises(LeaseError, match="unknown lease"):
            operation("ls-123456789abc", "x", now=at(1))
        with pytest.raises(LeaseError, match="no longer live"):
            operation(done.lease_id, "x", now=at(2))  # committed
        with pytest.raises(LeaseError, match="no longer live"):
            operation(late.lease_id, "x", now=at(10))  # its deadline passed, no sweep has run
        with pytest.raises(TypeError):
            operation(late.lease_id, None, now=at(1))  # type: ignore[arg-type]
    assert hm.take() == []
    assert _snapshot(hm) == before


def test_abandon_is_an_early_expiry_and_spends_max_expiries(hm: Harness) -> None:
    hm.mgr.add_task(spec(max_attempts=1, max_expiries=2, lease_seconds=10), now=at(0))
    lease = hm.mgr.claim("n", now=at(0))
    assert lease is not None
    hm.take()
    reason = "its worker restarted"
    assert hm.mgr.abandon(lease.lease_id, reason, now=at(1)) is TaskState.PENDING
    assert hm.take() == ["LEASE_EXPIRED", "TASK_REQUEUED"]
    expired, requeued = hm.taken
    assert expired.message == (f"lease {lease.lease_id} (attempt 1) of task task-000 on n abandoned before its "
                               f"deadline ({at(10).isoformat()}): {reason}")
    assert expired.data == {"task_id": "task-000", "node_id": "n", "lease_id": lease.lease_id, "attempt_number": 1,
                            "deadline": at(10).isoformat(), "abandoned": True, "reason": reason}
    assert requeued.message == "task task-000 requeued after an expiry (1 of 2 expiries used, max_expiries)"
    record = state_of(hm)
    assert record.state is TaskState.PENDING and (record.failures_seen, record.expiries_seen) == (0, 1)
    assert record.releases_seen == 0 and record.active_lease is None
    lease = hm.mgr.claim("n", now=at(2))
    assert lease is not None and lease.attempt_number == 2
    hm.take()
    assert hm.mgr.abandon(lease.lease_id, now=at(3)) is TaskState.FAILED
    assert hm.take() == ["LEASE_EXPIRED", "TASK_EXHAUSTED"]
    assert hm.taken[1].message == "all 2 expiries used (max_expiries)"
    record = state_of(hm)
    assert record.state is TaskState.FAILED and (record.failures_seen, record.expiries_seen) == (0, 2)
    assert hm.mgr.claim("n", now=at(4)) is None


def test_releases_abandons_failures_and_expiries_count_apart(hm: Harness) -> None:
    hm.mgr.add_task(spec(max_attempts=2, max_expiries=3, lease_seconds=5), now=at(0))
    steps = [
        lambda lease_id, t: hm.mgr.release(lease_id, "drain", now=at(t)),
        lambda lease_id, t: hm.mgr.abandon(lease_id, "restart", now=at(t)),
        lambda lease_id, t: hm.mgr.fail(lease_id, "exit 1", now=at(t)),
        lambda lease_id, t: hm.mgr.sweep(now=at(t + 5)),
        lambda lease_id, t: hm.mgr.release(lease_id, "drain", now=at(t)),
    ]
    for number, step in enumerate(steps):
        t = 10 * number
        lease = hm.mgr.claim("n", now=at(t))
        assert lease is not None and lease.attempt_number == number + 1
        step(lease.lease_id, t)
    record = state_of(hm)
    assert record.state is TaskState.PENDING and record.attempts_used == 5
    assert (record.failures_seen, record.expiries_seen, record.releases_seen) == (1, 2, 2)


# --- sweep and the max_expiries budget --------------------------------------------


def test_sweep_expires_in_deadline_then_seq_order(hm: Harness) -> None:
    hm.mgr.add_task(spec("long", lease_seconds=20), now=at(0))
    hm.mgr.add_task(spec("short-b", lease_seconds=10), now=at(0))
    hm.mgr.add_task(spec("short-c", lease_seconds=10), now=at(0))
    hm.mgr.add_task(spec("alive", lease_seconds=100), now=at(0))
    leases = [hm.mgr.claim(f"n{i}", now=at(0)) for i in range(4)]
    assert all(leases)
    hm.take()
    assert hm.mgr.sweep(now=at(9.999)) == 0
    assert hm.mgr.sweep(now=at(20)) == 3
    types = hm.take()
    assert types == ["LEASE_EXPIRED", "TASK_REQUEUED"] * 3
    assert [e.data["task_id"] for e in hm.taken if e.type is EventType.LEASE_EXPIRED] == [
        "short-b",
        "short-c",
        "long",
    ]
    record = state_of(hm, task_id="long")
    assert record.state is TaskState.PENDING and record.expiries_seen == 1 and record.failures_seen == 0
    assert state_of(hm, task_id="alive").state is TaskState.LEASED


def test_expiries_exhaust_max_expiries(hm: Harness) -> None:
    hm.mgr.add_task(spec(max_expiries=2, lease_seconds=5), now=at(0))
    lease = hm.mgr.claim("n", now=at(0))
    assert lease is not None
    assert hm.mgr.sweep(now=at(5)) == 1
    lease = hm.mgr.claim("n", now=at(6))
    assert lease is not None and lease.attempt_number == 2
    hm.take()
    assert hm.mgr.sweep(now=at(11)) == 1
    assert hm.take() == ["LEASE_EXPIRED", "TASK_EXHAUSTED"]
    assert hm.taken[1].message == "all 2 expiries used (max_expiries)"
    assert hm.taken[1].data["budget"] == "max_expiries"
    record = state_of(hm)
    assert record.state is TaskState.FAILED and record.expiries_seen == 2 and record.failures_seen == 0
    assert not hm.mgr.lease_is_live(lease.lease_id, now=at(7))


def test_the_two_budgets_are_independent(hm: Harness) -> None:
    hm.mgr.add_task(spec(max_attempts=1, max_expiries=3, lease_seconds=5), now=at(0))
    for i in range(2):  # two lost workers spend only max_expiries
        assert hm.mgr.claim("n", now=at(10 * i)) is not None
        assert hm.mgr.sweep(now=at(10 * i + 5)) == 1
    record = state_of(hm)
    assert record.state is TaskState.PENDING and (record.failures_seen, record.expiries_seen) == (0, 2)
    lease = hm.mgr.claim("n", now=at(30))
    assert lease is not None and lease.attempt_number == 3
    hm.take()
    hm.mgr.fail(lease.lease_id, "bad input", now=at(31))  # one failure exhausts max_attempts=1
    assert hm.take() == ["TASK_ATTEMPT_FAILED", "TASK_EXHAUSTED"]
    assert hm.taken[1].message == "all 1 failures used (max_attempts)"
    record = state_of(hm)
    assert record.state is TaskState.FAILED and (record.failures_seen, record.expiries_seen) == (1, 2)
    assert record.attempts_used == 3


def test_claim_sweeps_first_and_events_come_in_transition_order(hm: Harness) -> None:
    hm.mgr.add_task(spec("t0", lease_seconds=5), now=at(0))
    assert hm.mgr.claim("n1", now=at(0)) is not None
    hm.take()
    lease = hm.mgr.claim("n2", now=at(5))
    assert lease is not None and lease.task_id == "t0" and lease.attempt_number == 2
    assert hm.take() == ["LEASE_EXPIRED", "TASK_REQUEUED", "LEASE_CLAIMED"]


# --- cancel -------------------------------------------------------------------------


def test_cancel_pending_and_leased_tasks(hm: Harness) -> None:
    hm.mgr.add_task(spec("p"), now=at(0))
    hm.mgr.add_task(spec("l"), now=at(0))
    lease = hm.mgr.claim("n", job_id="job-a", now=at(0))
    assert lease is not None and lease.task_id == "p"
    hm.mgr.cancel_task("job-a", "l", now=at(1))
    hm.mgr.cancel_task("job-a", "p", now=at(1))
    assert hm.take()[-2:] == ["TASK_CANCELLED", "TASK_CANCELLED"]
    assert hm.taken[-1].data["lease_id"] == lease.lease_id and hm.taken[-1].data["node_id"] == "n"
    record = state_of(hm, task_id="p")
    assert record.state is TaskState.CANCELLED and record.active_lease is None
    assert not hm.mgr.lease_is_live(lease.lease_id, now=at(1))
    assert hm.mgr.complete(lease.lease_id, SHA, now=at(2)) is False
    with pytest.raises(LeaseError):
        hm.mgr.heartbeat(lease.lease_id, now=at(2))
    assert hm.mgr.claim("n", now=at(3)) is None
    assert hm.mgr.live_leases_for_node("n", now=at(2)) == set()
    assert hm.mgr.job_state("job-a") == {"CANCELLED": 2}


def test_lease_standing_says_live_cancelled_or_ended_and_changes_nothing(hm: Harness) -> None:
    hm.mgr.add_task(spec("c"), now=at(0))
    hm.mgr.add_task(spec("d"), now=at(0))
    hm.mgr.add_task(spec("e", lease_seconds=10), now=at(0))
    cancelled, done, expired = (hm.mgr.claim("n", job_id="job-a", now=at(0)) for _ in range(3))
    assert cancelled is not None and done is not None and expired is not None
    hm.take()
    assert hm.mgr.lease_standing(cancelled.lease_id, now=at(1)) == ("live", None)
    assert hm.take() == []  # a read
    hm.mgr.cancel_task("job-a", "c", now=at(1))
    assert hm.mgr.lease_standing(cancelled.lease_id, now=at(2)) == ("cancelled", "the task was cancelled")
    assert hm.mgr.complete(done.lease_id, SHA, now=at(1))
    standing, why = hm.mgr.lease_standing(done.lease_id, now=at(2)) or ("", "")
    assert standing == "ended" and why is not None and "already committed" in why
    standing, why = hm.mgr.lease_standing(expired.lease_id, now=at(11)) or ("", "")
    assert standing == "ended" and why is not None and "expired" in why
    assert hm.mgr.lease_standing("ls-never-issued", now=at(2)) is None


def test_cancel_terminal_is_silent_noop_and_unknown_raises(hm: Harness) -> None:
    hm.mgr.add_task(spec(), now=at(0))
    lease = hm.mgr.claim("n", now=at(0))
    assert lease is not None and hm.mgr.complete(lease.lease_id, SHA, now=at(1))
    hm.take()
    hm.mgr.cancel_task("job-a", "task-000", now=at(2))
    assert hm.take() == []
    assert state_of(hm).state is TaskState.COMPLETED
    with pytest.raises(LeaseError, match="unknown task"):
        hm.mgr.cancel_task("job-a", "nope", now=at(2))


# --- cordons -------------------------------------------------------------------------


def test_cordoned_node_gets_nothing_until_uncordon(hm: Harness) -> None:
    hm.mgr.add_task(spec(), now=at(0))
    hm.take()
    hm.mgr.cordon("bad-node", reason="flaky GPU", now=at(0))
    assert hm.take() == ["NODE_CORDONED"]
    event = hm.taken[0]
    assert event.job_id == "" and event.data == {"node_id": "bad-node", "until": None, "reason": "flaky GPU"}
    assert hm.mgr.claim("bad-node", now=at(1)) is None
    assert hm.mgr.cordoned(now=at(1)) == {"bad-node": (None, "flaky GPU")}
    assert hm.mgr.uncordon("bad-node") is True
    assert hm.mgr.uncordon("bad-node") is False
    assert hm.mgr.claim("bad-node", now=at(2)) is not None


def test_cordon_with_until_lapses_and_is_dropped(hm: Harness) -> None:
    hm.mgr.add_task(spec(), now=at(0))
    hm.mgr.cordon("n", until=at(60), now=at(0))
    assert hm.mgr.claim("n", now=at(59)) is None
    assert hm.mgr.cordoned(now=at(30)) == {"n": (at(60), "")}
    assert hm.mgr.claim("n", now=at(60)) is not None  # the cordon ends at `until`
    assert hm.mgr.cordoned(now=at(61)) == {}
    assert hm.mgr.uncordon("n") is False  # the lapsed cordon was dropped


def test_uncordon_is_true_only_for_a_cordon_in_effect(hm: Harness) -> None:
    """A cordon whose ``until`` has passed no longer kept the node from claiming: uncordon removes
    it but says False, although no claim or ``cordoned()`` dropped it first."""
    hm.mgr.cordon("n", until=at(60), now=at(0))
    assert hm.mgr.uncordon("n", now=at(61)) is False
    assert hm.mgr.cordoned(now=at(0)) == {}  # removed all the same
    hm.mgr.cordon("n", until=at(60), now=at(0))
    assert hm.mgr.uncordon("n", now=at(59)) is True
    assert hm.mgr.uncordon("n", now=at(59)) is False
    hm.mgr.cordon("n", reason="until uncordoned", now=at(0))
    assert hm.mgr.uncordon("n", now=datetime.max) is True


def test_cordon_replaces_previous_and_spares_held_leases(hm: Harness) -> None:
    hm.mgr.add_task(spec("t0"), now=at(0))
    hm.mgr.add_task(spec("t1"), now=at(0))
    held = hm.mgr.claim("n", now=at(0))
    assert held is not None
    hm.mgr.cordon("n", until=at(100), reason="first", now=at(1))
    hm.mgr.cordon("n", reason="second", now=at(2))
    assert hm.mgr.cordoned(now=at(200)) == {"n": (None, "second")}
    assert hm.mgr.heartbeat(held.lease_id, now=at(3)).deadline == at(63)
    assert hm.mgr.live_leases_for_node("n", now=at(3)) == {("job-a", "t0")}
    assert hm.mgr.complete(held.lease_id, SHA, now=at(4)) is True
    assert hm.mgr.claim("n", now=at(5)) is None


def test_cordon_until_not_after_now_is_refused(hm: Harness) -> None:
    hm.take()
    with pytest.raises(ValueError, match="not after now"):
        hm.mgr.cordon("n", until=at(10), now=at(10))
    with pytest.raises(ValueError):
        hm.mgr.cordon("n", until=at(5), now=at(10))
    assert hm.take() == [] and hm.mgr.cordoned(now=at(0)) == {}


def test_naive_datetimes_are_utc(hm: Harness) -> None:
    naive = T0.replace(tzinfo=None)
    hm.mgr.add_task(spec(lease_seconds=10), now=naive)
    lease = hm.mgr.claim("n", now=naive)
    assert lease is not None and lease.deadline == at(10) and lease.deadline.tzinfo is not None
    hm.mgr.cordon("x", until=naive + timedelta(seconds=5), now=naive)
    assert hm.mgr.cordoned(now=at(1)) == {"x": (at(5), "")}
    other_zone = at(9).astimezone(timezone(timedelta(hours=5)))
    assert hm.mgr.lease_is_live(lease.lease_id, now=other_zone)
    assert not hm.mgr.lease_is_live(lease.lease_id, now=at(10).astimezone(timezone(timedelta(hours=-3))))


# --- queries ------------------------------------------------------------------------


def test_liveness_queries(hm: Harness) -> None:
    hm.mgr.add_task(spec("t0", lease_seconds=10), now=at(0))
    hm.mgr.add_task(spec("t1", lease_seconds=20), now=at(0))
    hm.mgr.add_task(spec("t2", job_id="job-b"), now=at(0))
    a = hm.mgr.claim("n1", now=at(0))
    b = hm.mgr.claim("n1", now=at(0))
    c = hm.mgr.claim("n2", now=at(0))
    assert a and b and c
    assert hm.mgr.lease_is_live(a.lease_id, now=at(9.5))
    assert not hm.mgr.lease_is_live(a.lease_id, now=at(10))
    assert not hm.mgr.lease_is_live("ls-unknown", now=at(0))
    assert hm.mgr.live_leases_for_node("n1", now=at(5)) == {("job-a", "t0"), ("job-a", "t1")}
    assert hm.mgr.live_leases_for_node("n1", now=at(15)) == {("job-a", "t1")}
    assert hm.mgr.live_leases_for_node("n2", now=at(5)) == {("job-b", "t2")}
    assert hm.mgr.live_leases_for_node("nobody", now=at(5)) == set()
    assert hm.mgr.lease_info("ls-unknown") is None
    assert hm.mgr.job_state("job-a") == {"LEASED": 2}
    assert hm.mgr.job_state("job-none") == {}
    assert [r.spec.task_id for r in hm.mgr.records()] == ["t0", "t1", "t2"]


def test_attempts_used_numbers_attempts_across_causes(hm: Harness) -> None:
    hm.mgr.add_task(spec(lease_seconds=5), now=at(0))
    first = hm.mgr.claim("n", now=at(0))
    assert first is not None
    hm.mgr.fail(first.lease_id, "x", now=at(1))
    second = hm.mgr.claim("n", now=at(2))
    assert second is not None
    third = hm.mgr.claim("n", now=at(7))  # the sweep inside claim expired `second`
    assert third is not None
    assert [first.attempt_number, second.attempt_number, third.attempt_number] == [1, 2, 3]
    record = state_of(hm)
    assert record.attempts_used == 3 and (record.failures_seen, record.expiries_seen) == (1, 1)
    assert list(record.lease_history) == [first.lease_id, second.lease_id, third.lease_id]
    assert len({first.lease_id, second.lease_id, third.lease_id}) == 3


# --- events --------------------------------------------------------------------------


def test_events_are_emitted_after_the_transition_commits(h: Harness) -> None:
    """Each listener call already sees the transition's state, from another connection too."""
    seen: list[tuple[str, TaskState | None]] = []

    def observe(event: Event) -> None:
        if h.kind in IN_MEMORY:
            store: Any = h._store
        else:
            store = h.independent_store()  # an independent connection: only committed state is visible
        task_id = event.data.get("task_id")
        record = store.get(event.job_id, task_id) if task_id else None
        seen.append((event.type.value, None if record is None else record.state))
        if h.kind not in IN_MEMORY:
            store.close()

    manager = LeaseManager(h.store(), on_event=observe)
    manager.add_task(spec(max_attempts=1, lease_seconds=5), now=at(0))
    lease = manager.claim("n", now=at(0))
    assert lease is not None
    manager.heartbeat(lease.lease_id, now=at(1))
    manager.fail(lease.lease_id, "x", now=at(2))
    assert seen == [
        ("TASK_CREATED", TaskState.PENDING),
        ("LEASE_CLAIMED", TaskState.LEASED),
        ("LEASE_RENEWED", TaskState.LEASED),
        ("TASK_ATTEMPT_FAILED", TaskState.FAILED),
        ("TASK_EXHAUSTED", TaskState.FAILED),
    ]


def test_on_event_exception_propagates_after_commit(tmp_path: Path) -> None:
    for store in (InMemoryLeaseStore(), SqliteLeaseStore(tmp_path / "e.db")):

        def explode(event: Event) -> None:
            raise RuntimeError(f"listener failed on {event.type.value}")

        manager = LeaseManager(store, on_event=explode)
        with pytest.raises(RuntimeError, match="TASK_CREATED"):
            manager.add_task(spec(), now=at(0))
        with pytest.raises(RuntimeError, match="LEASE_CLAIMED"):
            manager.claim("n", now=at(0))
        record = store.get("job-a", "task-000")
        assert record is not None and record.state is TaskState.LEASED  # the transition stayed committed
        if isinstance(store, SqliteLeaseStore):
            store.close()


# --- placement through claim --------------------------------------------------------------


def test_policy_claim_skips_ineligible_and_leases_first_eligible(hm: Harness) -> None:
    hm.mgr.add_task(spec("gpu", payload={"gpus": 2}), now=at(0))
    hm.mgr.add_task(spec("pool-x", payload={"pool": "x"}), now=at(0))
    hm.mgr.add_task(spec("plain-1"), now=at(0))
    hm.mgr.add_task(spec("plain-2"), now=at(0))
    policy = IsolationAwarePlacement()
    cpu_node = {"node_id": "cpu-1", "capabilities": {"gpus": [], "pools": []}}
    lease = hm.mgr.claim("cpu-1", now=at(1), policy=policy, node=cpu_node)
    assert lease is not None and lease.task_id == "plain-1"
    gpu_node = {"node_id": "gpu-1", "capabilities": {"gpus": [{"index": 0}, {"index": 1}], "pools": ["x"]}}
    assert hm.mgr.claim("gpu-1", now=at(1), policy=policy, node=gpu_node).task_id == "gpu"  # type: ignore[union-attr]
    assert hm.mgr.claim("gpu-1", now=at(1), policy=policy, node=gpu_node).task_id == "pool-x"  # type: ignore[union-attr]
    assert hm.mgr.claim("gpu-1", now=at(1), policy=policy, node=gpu_node).task_id == "plain-2"  # type: ignore[union-attr]
    assert hm.mgr.claim("gpu-1", now=at(1), policy=policy, node=gpu_node) is None


def test_policy_without_node_view_sees_only_node_id(hm: Harness) -> None:
    seen: list[dict[str, Any]] = []

    class Spy:
        def choose(self, pending: list[TaskSpec], node: dict[str, Any]) -> TaskSpec | None:
            seen.append(node)
            return pending[0] if pending else None

    hm.mgr.add_task(spec(), now=at(0))
    assert hm.mgr.claim("n-7", now=at(0), policy=Spy()) is not None
    assert seen == [{"node_id": "n-7"}]


def test_first_eligible_policy_is_offered_pages_in_queue_order(hm: Harness) -> None:
    bulk_add(hm, [spec(f"t{i:03d}", payload={"pool": "late" if i >= 520 else "other"}) for i in range(600)])
    pages: list[list[str]] = []

    class PoolPolicy(PlacementPolicy):
        def eligible(self, task: TaskSpec, node: dict[str, Any]) -> bool:
            return task.payload.get("pool") == "late"

        def choose(self, pending: Any, node: dict[str, Any]) -> TaskSpec | None:
            pages.append([task.task_id for task in pending])
            return super().choose(pending, node)

    lease = hm.mgr.claim("n", now=at(1), policy=PoolPolicy())
    assert lease is not None and lease.task_id == "t520"
    size = getattr(hm.mgr.store, "pending_page_size", PAGE_SIZE)  # a store may ask for smaller pages
    starts = range(0, (520 // size + 1) * size, size)  # every page up to the one holding t520
    assert [len(page) for page in pages] == [min(size, 600 - start) for start in starts]
    assert [page[0] for page in pages] == [f"t{start:03d}" for start in starts]


def test_scoring_policy_receives_whole_scope_and_highest_score_wins(hm: Harness) -> None:
    bulk_add(hm, [spec(f"t{i:03d}", payload={"priority": i % 7}) for i in range(300)])
    hm.mgr.add_task(spec("other-job", job_id="job-b", payload={"priority": 99}), now=at(0))
    calls: list[int] = []

    class Priority(FifoPlacement):
        def score(self, task: TaskSpec, node: dict[str, Any]) -> float:
            return float(task.payload["priority"])

        def choose(self, pending: Any, node: dict[str, Any]) -> TaskSpec | None:
            calls.append(len(pending))
            return super().choose(pending, node)

    lease = hm.mgr.claim("n", job_id="job-a", now=at(1), policy=Priority())
    assert lease is not None and lease.task_id == "t006"  # first of the highest score
    assert calls == [300]


def test_foreign_or_stale_choice_claims_nothing(hm: Harness) -> None:
    hm.mgr.add_task(spec("t0"), now=at(0))
    hm.mgr.add_task(spec("t1", job_id="job-b"), now=at(0))

    class Foreign:
        def choose(self, pending: Any, node: Any) -> TaskSpec:
            return spec("not-queued")

    class OtherJob:
        def choose(self, pending: Any, node: Any) -> TaskSpec:
            return spec("t1", job_id="job-b")

    class NotASpec:
        def choose(self, pending: Any, node: Any) -> object:
            return {"job_id": "job-a", "task_id": "t0"}

    assert hm.mgr.claim("n", now=at(1), policy=Foreign()) is None
    assert hm.mgr.claim("n", job_id="job-a", now=at(1), policy=OtherJob()) is None
    assert hm.mgr.claim("n", now=at(1), policy=NotASpec()) is None
    lease = hm.mgr.claim("n", now=at(1))
    assert lease is not None and lease.task_id == "t0"

    class Stale:
        def choose(self, pending: Any, node: Any) -> TaskSpec:
            return spec("t0")  # now LEASED

    assert hm.mgr.claim("n", now=at(1), policy=Stale()) is None
    assert hm.mgr.job_state("job-a") == {"LEASED": 1} and hm.mgr.job_state("job-b") == {"PENDING": 1}


# --- bad input changes nothing --------------------------------------------------------------


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -1.0, 0.0])
def test_bad_lease_seconds_rejected_and_nothing_stored(hm: Harness, bad: float) -> None:
    with pytest.raises(ValidationError):
        spec(lease_seconds=bad)
    forged = TaskSpec.model_construct(task_id="t", job_id="job-a", commit_key="k", lease_seconds=bad)
    with pytest.raises(ValueError, match="lease_seconds"):
        hm.mgr.add_task(forged, now=at(0))
    assert hm.mgr.records() == [] and hm.take() == []


@pytest.mark.parametrize("length", [1e13, 10 * 365 * 86_400 + 1, 4e-7])
def test_unrepresentable_lease_lengths_are_refused_at_add(hm: Harness, length: float) -> None:
    """Finite and > 0 is not enough: a deadline past datetime's last date would make every
    claim raise (blocking the queue), and one under a microsecond is dead when issued."""
    with pytest.raises(ValueError, match="lease_seconds must be at (most|least)"):
        hm.mgr.add_task(spec(lease_seconds=length), now=at(0))
    assert hm.mgr.records() == [] and hm.take() == []
    hm.mgr.add_task(spec(lease_seconds=10 * 365 * 86_400), now=at(0))  # the longest allowed
    lease = hm.mgr.claim("n", now=at(0))
    assert lease is not None and lease.deadline == at(10 * 365 * 86_400)


def test_claim_whose_deadline_overflows_is_refused_and_changes_nothing(hm: Harness) -> None:
    hm.mgr.add_task(spec(lease_seconds=3600), now=at(0))
    hm.take()
    before = _snapshot(hm)
    late = datetime.max.replace(tzinfo=timezone.utc) - timedelta(seconds=10)
    with pytest.raises(ValueError, match="past the last date"):
        hm.mgr.claim("n", now=late)
    assert _snapshot(hm) == before and hm.take() == []
    lease = hm.mgr.claim("n", now=at(1))  # the queue is not blocked
    assert lease is not None and lease.attempt_number == 1


def test_a_lease_payload_is_the_leases_own(hm: Harness) -> None:
    """Changing a lease's payload (even deep inside) never changes its task: the next
    attempt, and the placement gates that read the payload, see the task as queued."""
    queued = {"argv": ["python", "train.py"], "pool": "gpu", "isolation": {"allowFallback": False}}
    hm.mgr.add_task(spec(payload=queued, lease_seconds=10), now=at(0))
    lease = hm.mgr.claim("n", now=at(0))
    assert lease is not None and lease.payload == queued
    lease.payload["argv"].append("--evil")
    lease.payload["isolation"]["allowFallback"] = True
    lease.payload["pool"] = "other"
    assert state_of(hm).spec.payload == queued
    hm.mgr.fail(lease.lease_id, "boom", now=at(1))
    again = hm.mgr.claim("n", now=at(2))
    assert again is not None and again.payload == queued


def test_an_empty_lease_payload_is_the_leases_own_too(hm: Harness) -> None:
    """A task queued without a payload: filling the lease's empty payload never fills the task's."""
    hm.mgr.add_task(spec(lease_seconds=10), now=at(0))
    lease = hm.mgr.claim("n", now=at(0))
    assert lease is not None and lease.payload == {}
    lease.payload["scratch"] = [1, 2]
    assert state_of(hm).spec.payload == {}
    hm.mgr.fail(lease.lease_id, "boom", now=at(1))
    again = hm.mgr.claim("n", now=at(2))
    assert again is not None and again.payload == {}


def test_non_finite_payload_values_come_back_as_added(hm: Harness) -> None:
    """``payload`` is free-form: NaN and the infinities survive the store (SQLite included) instead
    of coming back as None."""
    hm.mgr.add_task(spec(payload={"lr": math.nan, "clip": [math.inf, -math.inf], "note": "é"}), now=at(0))
    lease = hm.mgr.claim("n", now=at(0))
    assert lease is not None
    for payload in (lease.payload, state_of(hm).spec.payload):
        assert math.isnan(payload["lr"]) and payload["clip"] == [math.inf, -math.inf] and payload["note"] == "é"


def test_heartbeat_whose_deadline_overflows_is_refused_and_changes_nothing(hm: Harness) -> None:
    late = datetime.max.replace(tzinfo=timezone.utc) - timedelta(days=3)
    hm.mgr.add_task(spec(lease_seconds=2 * 86_400), now=at(0))
    lease = hm.mgr.claim("n", now=late)
    assert lease is not None
    hm.take()
    before = _snapshot(hm)
    with pytest.raises(ValueError, match="cannot be renewed .* past the last date"):
        hm.mgr.heartbeat(lease.lease_id, now=late + timedelta(days=1, seconds=1))
    assert _snapshot(hm) == before and hm.take() == []
    assert hm.mgr.complete(lease.lease_id, SHA, now=late + timedelta(days=1, seconds=2)) is True


def test_a_claim_that_fails_after_sweeping_keeps_the_sweep_and_its_events(hm: Harness) -> None:
    """The sweep a claim starts with is a transition of its own: a policy raising during
    the claim proper neither loses the expiry's events nor (on any store) the expiry."""
    hm.mgr.add_task(spec("t0", lease_seconds=5), now=at(0))
    hm.mgr.add_task(spec("t1", lease_seconds=5), now=at(0))
    assert hm.mgr.claim("n1", now=at(0)) is not None
    hm.take()

    class Raising:
        def choose(self, pending: Any, node: Any) -> TaskSpec:
            raise RuntimeError("policy bug")

    with pytest.raises(RuntimeError, match="policy bug"):
        hm.mgr.claim("n2", now=at(5), policy=Raising())
    assert hm.take() == ["LEASE_EXPIRED", "TASK_REQUEUED"]
    record = state_of(hm, task_id="t0")
    assert record.state is TaskState.PENDING and record.expiries_seen == 1 and record.active_lease is None
    lease = hm.mgr.claim("n2", now=at(5))
    assert lease is not None and lease.task_id == "t0" and hm.take() == ["LEASE_CLAIMED"]


def test_bad_input_errors_are_typed_and_change_nothing(hm: Harness) -> None:
    hm.mgr.add_task(spec(lease_seconds=10), now=at(0))
    lease = hm.mgr.claim("n", now=at(0))
    assert lease is not None
    hm.take()
    before = _snapshot(hm)
    for bad_id in ("ls-000000000000", "", None, 123, ["ls"]):
        with pytest.raises(LeaseError):
            hm.mgr.heartbeat(bad_id, now=at(1))  # type: ignore[arg-type]
        with pytest.raises(LeaseError):
            hm.mgr.complete(bad_id, SHA, now=at(1))  # type: ignore[arg-type]
        with pytest.raises(LeaseError):
            hm.mgr.fail(bad_id, "x", now=at(1))  # type: ignore[arg-type]
        with pytest.raises(LeaseError):
            hm.mgr.release(bad_id, "x", now=at(1))  # type: ignore[arg-type]
        with pytest.raises(LeaseError):
            hm.mgr.abandon(bad_id, "x", now=at(1))  # type: ignore[arg-type]
        assert hm.mgr.lease_is_live(bad_id, now=at(1)) is False  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        hm.mgr.complete(lease.lease_id, None, now=at(1))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        hm.mgr.claim(None, now=at(1))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        hm.mgr.claim("", now=at(1))
    with pytest.raises(TypeError):
        hm.mgr.claim("n", now="2030-01-01")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        hm.mgr.add_task({"task_id": "t", "job_id": "j", "commit_key": "k"})  # type: ignore[arg-type]
    with pytest.raises(LeaseError):
        hm.mgr.heartbeat(lease.lease_id, now=at(10))  # dead: refused, event only
    assert hm.take() == ["LEASE_RENEWAL_REFUSED"]
    assert _snapshot(hm) == before
    assert issubclass(LeaseError, FlashRuntimeError)


def _snapshot(h: Harness) -> list[tuple[Any, ...]]:
    return [
        (
            r.spec.task_id,
            r.state,
            r.attempts_used,
            r.failures_seen,
            r.expiries_seen,
            r.releases_seen,
            r.active_lease,
            r.accepted_attempt_id,
            tuple(r.lease_history),
        )
        for r in h.mgr.records()
    ]


# --- the store protocol itself ----------------------------------------------------------------


def test_store_protocol_required_methods(h: Harness) -> None:
    store = h.store()
    assert isinstance(store, LeaseStore)
    for i, job in enumerate(["j1", "j2", "j1"]):
        store.add(TaskRecord(spec(f"t{i}", job)))
    store = h.store()
    with pytest.raises(ValueError):
        store.add(TaskRecord(spec("t0", "j1")))
    assert [(r.spec.job_id, r.spec.task_id, r.seq) for r in store.all()] == [
        ("j1", "t0", 1),
        ("j2", "t1", 2),
        ("j1", "t2", 3),
    ]
    assert [r.seq for r in store.all("j1")] == [1, 3]
    assert store.get("j1", "t1") is None and store.get("j2", "t1").seq == 2  # type: ignore[union-attr]
    assert store.next_pending().spec.task_id == "t0"  # type: ignore[union-attr]
    assert store.next_pending("j2").spec.task_id == "t1"  # type: ignore[union-attr]
    assert store.next_pending("nope") is None
    store = h.store()
    with store.transaction():
        record = store.get("j1", "t0")
        assert record is not None
        record.state = TaskState.COMPLETED
        record.accepted_attempt_id = "ls-aaaaaaaaaaaa"
        record.releases_seen = 2
        store.save(record)
    store = h.store()
    assert store.get("j1", "t0").state is TaskState.COMPLETED  # type: ignore[union-attr]
    assert store.get("j1", "t0").releases_seen == 2  # type: ignore[union-attr]
    assert [r.releases_seen for r in store.all()] == [2, 0, 0]
    assert store.next_pending().spec.task_id == "t1"  # type: ignore[union-attr]
    assert store.next_pending("j1").spec.task_id == "t2"  # type: ignore[union-attr]
    assert store.leased() == []
    assert store.counts("j1") == {"COMPLETED": 1, "PENDING": 1}


def test_store_accelerators_agree_with_a_manager_run(h: Harness) -> None:
    mgr = h.mgr
    for i in range(6):
        mgr.add_task(spec(f"t{i}", "j1" if i % 2 == 0 else "j2", lease_seconds=10 + i), now=at(0))
    leases = [mgr.claim("n1" if i < 2 else "n2", now=at(0)) for i in range(4)]
    assert all(leases)
    store = h.store()
    assert [r.spec.task_id for r in store.pending_page(None, 0, 10)] == ["t4", "t5"]
    assert [r.spec.task_id for r in store.pending_page(None, 5, 10)] == ["t5"]
    assert [r.spec.task_id for r in store.pending_page("j1", -1, 1)] == ["t4"]
    assert store.pending_page("j1", 5, 10) == []
    assert [r.spec.task_id for r in store.expired(at(12))] == ["t0", "t1", "t2"]
    assert [r.spec.task_id for r in store.expired(at(100))] == ["t0", "t1", "t2", "t3"]
    assert store.expired(at(9)) == []
    assert store.find_lease(leases[2].lease_id).spec.task_id == "t2"  # type: ignore[union-attr]
    assert store.find_lease("ls-nothing") is None
    assert [r.spec.task_id for r in store.leased_by_node("n1")] == ["t0", "t1"]
    assert [r.spec.task_id for r in store.leased()] == ["t0", "t1", "t2", "t3"]
    assert store.counts("j1") == {"LEASED": 2, "PENDING": 1}
    # queries change nothing: the same answer twice
    assert [r.spec.task_id for r in h.store().expired(at(100))] == ["t0", "t1", "t2", "t3"]
    store = h.store()
    store.put_cordon("n9", at(5), "why")
    store.put_cordon("n8", None, "")
    store = h.store()
    assert store.cordons() == {"n8": (None, ""), "n9": (at(5), "why")}
    assert store.cordon_for("n9") == (at(5), "why") and store.cordon_for("n1") is None
    assert store.remove_cordon("n9") is True and h.store().remove_cordon("n9") is False


def test_save_of_foreign_record_is_refused(h: Harness) -> None:
    store = h.store()
    store.add(TaskRecord(spec("t0")))
    with pytest.raises(ValueError):
        store.save(TaskRecord(spec("never-added")))


def test_lease_survives_reopen_and_can_be_renewed_committed_or_rejected(tmp_path: Path) -> None:
    path = tmp_path / "restart.db"
    first = LeaseManager(SqliteLeaseStore(path))
    first.add_task(spec("a", lease_seconds=30), now=at(0))
    first.add_task(spec("b", lease_seconds=30), now=at(0))
    a = first.claim("n1", now=at(0))
    b = first.claim("n2", now=at(0))
    assert a and b
    first.store.close()  # type: ignore[attr-defined]
    after = LeaseManager(SqliteLeaseStore(path))  # the coordinator restarted
    assert after.heartbeat(a.lease_id, now=at(20)).deadline == at(50)
    assert after.complete(a.lease_id, SHA, now=at(40)) is True
    assert after.complete(b.lease_id, SHA, now=at(40)) is False  # expired at 30 across the restart
    assert after.lease_info(b.lease_id) == b
    after.store.close()  # type: ignore[attr-defined]


def test_postgres_leases_survive_a_coordinator_restart_and_a_server_crash(postgres_cluster: Any,
                                                                          postgres_url: str) -> None:
    first = LeaseManager(PostgresLeaseStore(postgres_url))
    first.add_task(spec("a", lease_seconds=30), now=at(0))
    first.add_task(spec("b", lease_seconds=30), now=at(0))
    a = first.claim("n1", now=at(0))
    b = first.claim("n2", now=at(0))
    assert a and b
    first.store.close()  # type: ignore[attr-defined]
    postgres_cluster.restart("immediate")  # what a crash leaves: only the WAL, replayed at start
    store = PostgresLeaseStore(postgres_url)
    after = LeaseManager(store)  # the coordinator restarted
    assert after.heartbeat(a.lease_id, now=at(20)).deadline == at(50)
    postgres_cluster.restart("immediate")  # under an open pool: its dead connections are replaced
    assert after.complete(a.lease_id, SHA, now=at(40)) is True
    assert after.complete(b.lease_id, SHA, now=at(40)) is False  # expired at 30 across the restart
    assert after.lease_info(b.lease_id) == b
    store.close()


def test_postgres_refuses_a_newer_lease_schema_naming_the_database(postgres_url: str) -> None:
    store = PostgresLeaseStore(postgres_url)
    store.database.execute("UPDATE lease_meta SET value = '9' WHERE key = 'schema_version'")
    with pytest.raises(RuntimeError, match=r"PostgreSQL database '\w+' at 127\.0\.0\.1:\d+: lease schema version '9'"):
        PostgresLeaseStore(store.database)
    with pytest.raises(RuntimeError, match="lease schema version '9'"):
        PostgresLeaseStore(postgres_url)
    store.close()
