"""Unit tests of the lease package's small pieces: exports, ``bounded_lease_seconds``,
``TaskRecord`` defaults, lease ids, and that no ``Event`` is built without a listener."""

from __future__ import annotations

import math
import os
import re
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

import flashruntime.leases as leases
from flashruntime import errors
from flashruntime.leases import _offer as offer_module
from flashruntime.leases import manager as manager_module
from flashruntime.leases import sqlite_store, store
from flashruntime.leases._models import LeaseIds, lease_from_json, lease_to_json, spec_from_json, spec_to_json
from flashruntime.protocol.v1alpha1 import Lease, TaskSpec, TaskState

T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)


def test_public_names_and_defining_modules() -> None:
    assert leases.__all__ == [
        "LeaseManager",
        "LeaseError",
        "TaskRecord",
        "LeaseStore",
        "InMemoryLeaseStore",
        "SqliteLeaseStore",
        "MAX_LEASE_SECONDS",
        "bounded_lease_seconds",
    ]
    assert leases.LeaseManager is manager_module.LeaseManager
    assert leases.LeaseError is manager_module.LeaseError is errors.LeaseError
    assert leases.TaskRecord is store.TaskRecord
    assert leases.LeaseStore is store.LeaseStore
    assert leases.InMemoryLeaseStore is store.InMemoryLeaseStore
    assert leases.SqliteLeaseStore is sqlite_store.SqliteLeaseStore
    assert leases.MAX_LEASE_SECONDS == manager_module.MAX_LEASE_SECONDS == 3600


def test_task_record_defaults() -> None:
    spec = TaskSpec(task_id="t", job_id="j", commit_key="k")
    record = leases.TaskRecord(spec)
    assert record.spec is spec and record.state is TaskState.PENDING
    assert (record.attempts_used, record.failures_seen, record.expiries_seen) == (0, 0, 0)
    assert record.active_lease is None and record.lease_history == {} and record.seq is None
    assert record.accepted_attempt_id is None and record.accepted_output_sha256 is None
    assert not hasattr(record, "__dict__")
    assert "state=PENDING" in repr(record)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(None, 45.0), (30, 30.0), ("12.5", 12.5), (1e9, 3600.0), (3600, 3600.0), (1, 1.0), (" 7 ", 7.0)],
)
def test_bounded_lease_seconds_accepts(raw: Any, expected: float) -> None:
    value = leases.bounded_lease_seconds(raw, 45.0)
    assert value == expected and type(value) is float


@pytest.mark.parametrize("raw", [True, False, "abc", "", [], {}, math.nan, math.inf, -math.inf, "nan", "inf", 0, -5, "-1", 1e-6, 0.999])
def test_bounded_lease_seconds_refuses(raw: Any) -> None:
    with pytest.raises(ValueError):
        leases.bounded_lease_seconds(raw, 45.0)


def test_lease_ids_are_ls_plus_12_hex_and_unique() -> None:
    ids = LeaseIds()
    drawn = [ids() for _ in range(3000)]
    assert all(re.fullmatch(r"ls-[0-9a-f]{12}", lease_id) for lease_id in drawn)
    assert len(set(drawn)) == len(drawn)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX-only")
def test_forked_child_does_not_reuse_the_parents_lease_ids() -> None:
    ids = LeaseIds()
    ids()  # the batch is drawn
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        os.close(read)
        os.write(write, ids().encode())
        os._exit(0)
    os.close(write)
    child_id = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert child_id != ids()


def test_no_event_is_built_without_a_listener(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("an Event was built although on_event is None")

    monkeypatch.setattr(manager_module, "make_event", forbidden)
    manager = leases.LeaseManager()
    for i in range(3):
        manager.add_task(TaskSpec(task_id=f"t{i}", job_id="j", commit_key="k", lease_seconds=5), now=T0)
    a = manager.claim("n", now=T0)
    b = manager.claim("n", now=T0)
    c = manager.claim("n", now=T0)
    assert a and b and c
    manager.heartbeat(a.lease_id, now=T0)
    assert manager.complete(a.lease_id, "0" * 64, now=T0)
    assert manager.complete(a.lease_id, "0" * 64, now=T0)
    manager.fail(b.lease_id, "x", now=T0)
    assert manager.complete(b.lease_id, "0" * 64, now=T0) is False
    with pytest.raises(leases.LeaseError):
        manager.heartbeat(b.lease_id, now=T0)
    assert manager.sweep(now=T0 + timedelta(seconds=5)) == 1
    manager.cancel_task("j", "t1", now=T0)
    manager.cordon("n", reason="x", now=T0)
    assert manager.uncordon("n")


def test_default_store_is_in_memory_and_store_must_have_required_methods() -> None:
    assert isinstance(leases.LeaseManager().store, leases.InMemoryLeaseStore)
    with pytest.raises(TypeError, match=r"not a LeaseStore: it lacks add\(\), save\(\), .*next_pending\(\)"):
        leases.LeaseManager(object())  # type: ignore[arg-type]


def test_policy_ranking_detection_is_by_class() -> None:
    from flashruntime.scheduler import FifoPlacement, IsolationAwarePlacement

    class Ranked(FifoPlacement):
        def score(self, task: TaskSpec, node: dict[str, Any]) -> float:
            return 1.0

    class Duck:
        def choose(self, pending: Any, node: Any) -> None:
            return None

    assert not offer_module._policy_ranks(FifoPlacement())
    assert not offer_module._policy_ranks(IsolationAwarePlacement())
    assert not offer_module._policy_ranks(Duck())
    assert offer_module._policy_ranks(Ranked())


def test_lease_json_round_trip_keeps_every_field() -> None:
    lease = Lease(
        lease_id="ls-0123456789ab",
        task_id="t",
        job_id="j",
        node_id="n",
        attempt_number=3,
        deadline=T0 + timedelta(microseconds=7),
        payload={"a": [1, 2]},
        lease_seconds=12.5,
    )
    again = lease_from_json(lease_to_json(lease), {"a": [1, 2]})
    assert again == lease and again.model_dump() == lease.model_dump()
    assert Lease.model_validate_json(again.model_dump_json()) == lease


def test_spec_json_round_trip_without_revalidation_and_old_documents() -> None:
    spec = TaskSpec(task_id="t", job_id="j", commit_key="k", payload={"x": {"y": 1}}, lease_seconds=5)
    again = spec_from_json(spec_to_json(spec))
    assert again == spec and type(again.lease_seconds) is float
    old = '{"task_id": "t", "job_id": "j", "commit_key": "k", "lease_seconds": 5}'  # older writer, no max_expiries
    parsed = spec_from_json(old)
    assert parsed.max_expiries == 9 and parsed.lease_seconds == 5.0


def test_a_store_whose_transaction_returns_a_fresh_context_each_call() -> None:
    import contextlib
    import threading

    class GeneratorTransactions(leases.InMemoryLeaseStore):
        def __init__(self) -> None:
            super().__init__()
            self.entered = 0
            self.depth = 0
            self.max_depth = 0

        @contextlib.contextmanager
        def transaction(self):  # type: ignore[override]
            with self._lock:
                self.entered += 1
                self.depth += 1
                self.max_depth = max(self.max_depth, self.depth)
                try:
                    yield
                finally:
                    self.depth -= 1

    store = GeneratorTransactions()
    manager = leases.LeaseManager(store)
    with store.transaction():  # nested: the manager's transitions join the caller's
        for i in range(20):
            manager.add_task(TaskSpec(task_id=f"t{i}", job_id="j", commit_key="k"), now=T0)
    assert store.max_depth == 2

    def work() -> None:
        while (lease := manager.claim("n", now=T0)) is not None:
            assert manager.complete(lease.lease_id, "0" * 64, now=T0)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert manager.job_state("j") == {"COMPLETED": 20}
    assert store.depth == 0 and store.entered > 40
