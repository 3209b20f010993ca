"""Concurrent claimers never lease one task to two nodes at once: 8 threads on one
manager (in memory and on SQLite), and 2 processes sharing one SQLite file. Sweeps of
several connections to one SQLite file (as every worker process of ``serve --workers``
runs one) expire each overdue lease once."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from flashruntime.leases import InMemoryLeaseStore, LeaseError, LeaseManager, SqliteLeaseStore
from flashruntime.protocol.v1alpha1 import TaskSpec, TaskState

REPO = Path(__file__).resolve().parents[2]
T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)
THREADS = 8


def _specs(count: int, **fields: Any) -> list[TaskSpec]:
    return [TaskSpec(task_id=f"t{i:04d}", job_id="job", commit_key=f"k{i}", **fields) for i in range(count)]


def _store(kind: str, tmp_path: Path) -> Any:
    return InMemoryLeaseStore() if kind == "memory" else SqliteLeaseStore(tmp_path / "leases.db")


def _run(threads: list[threading.Thread]) -> None:
    """Start and join the threads with a short GIL switch interval, so they really interleave."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
    finally:
        sys.setswitchinterval(interval)
    assert not any(thread.is_alive() for thread in threads), "a claimer hung"


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_eight_threads_claim_each_task_exactly_once(kind: str, tmp_path: Path) -> None:
    count = 400 if kind == "memory" else 160
    store = _store(kind, tmp_path)
    manager = LeaseManager(store)
    with store.transaction():
        for spec in _specs(count, lease_seconds=3600):
            manager.add_task(spec, now=T0)
    claims: list[list[tuple[str, str]]] = [[] for _ in range(THREADS)]
    barrier = threading.Barrier(THREADS)
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        try:
            barrier.wait()
            while True:
                lease = manager.claim(f"node-{index}", now=T0)
                if lease is None:
                    return
                claims[index].append((lease.task_id, lease.lease_id))
                if len(claims[index]) % 2:
                    assert manager.complete(lease.lease_id, "0" * 64, now=T0)
                time.sleep(0)  # yield the GIL: a fast claimer must not drain the queue in one time slice
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    _run(threads)
    assert not errors, errors
    claimed = Counter(task_id for per_thread in claims for task_id, _ in per_thread)
    assert len(claimed) == count and set(claimed.values()) == {1}
    assert sum(1 for per_thread in claims if per_thread) >= 2  # the threads really did interleave
    assert all(record.attempts_used == 1 for record in manager.records())
    if kind == "sqlite":
        store.close()


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_eight_threads_with_failures_and_expiries_never_overlap_leases(kind: str, tmp_path: Path) -> None:
    """Tasks go round (fail, expire, requeue); a shared clock only moves forward. At any
    instant each task is held by at most one thread, and every release is seen."""
    count = 40
    store = _store(kind, tmp_path)
    manager = LeaseManager(store)
    with store.transaction():
        for spec in _specs(count, lease_seconds=5, max_attempts=50, max_expiries=50):
            manager.add_task(spec, now=T0)
    clock_lock = threading.Lock()
    ticks = [0]
    holders: dict[str, tuple[str, datetime]] = {}  # task -> (lease id, deadline) of its unreleased lease
    holders_lock = threading.Lock()
    overlaps: list[str] = []
    errors: list[BaseException] = []
    steps = 120 if kind == "memory" else 40

    def now() -> datetime:
        with clock_lock:
            ticks[0] += 1
            return T0 + timedelta(milliseconds=ticks[0] * 20)

    def claim(node: str) -> Any:
        # the clock is read inside the transaction, so time never runs backwards across claims
        with store.transaction():
            return manager.claim(node, now=now())

    def worker(index: int) -> None:
        rng = random.Random(index)
        try:
            for _ in range(steps):
                lease = claim(f"node-{index}")
                if lease is None:
                    continue
                claimed_at = lease.deadline - timedelta(seconds=lease.lease_seconds)
                with holders_lock:
                    previous = holders.get(lease.task_id)
                    if previous is not None and previous[1] > claimed_at:
                        overlaps.append(f"{lease.task_id}: {lease.lease_id} issued while {previous[0]} was live")
                    holders[lease.task_id] = (lease.lease_id, lease.deadline)
                roll = rng.random()
                if roll >= 0.8:
                    continue  # abandon: a later claim's sweep expires it
                with holders_lock:  # released here, before the store releases it
                    if holders.get(lease.task_id, ("",))[0] == lease.lease_id:
                        del holders[lease.task_id]
                with store.transaction():
                    if roll < 0.5:
                        try:
                            manager.fail(lease.lease_id, "injected", now=now())
                        except LeaseError:
                            pass  # it expired under us
                    else:
                        manager.complete(lease.lease_id, "0" * 64, now=now())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    _run(threads)
    assert not errors, errors
    assert not overlaps, overlaps
    assert sum(record.expiries_seen for record in manager.records()) > 0
    assert sum(record.failures_seen for record in manager.records()) > 0
    for record in manager.records():
        history = sorted(record.lease_history.values(), key=lambda lease: lease.attempt_number)
        assert [lease.attempt_number for lease in history] == list(range(1, record.attempts_used + 1))
        assert record.failures_seen + record.expiries_seen <= record.attempts_used
        if record.state is TaskState.COMPLETED:
            assert record.accepted_attempt_id in record.lease_history
    if kind == "sqlite":
        store.close()


CLAIMER = r"""
import json, sys, time
from datetime import datetime, timezone
from flashruntime.leases import LeaseManager, SqliteLeaseStore

path, node = sys.argv[1], sys.argv[2]
manager = LeaseManager(SqliteLeaseStore(path))
now = datetime(2030, 1, 1, tzinfo=timezone.utc)
print("ready", flush=True)
sys.stdin.readline()  # both processes start claiming together
claims = []
while True:
    lease = manager.claim(node, now=now)
    if lease is None:
        break
    claims.append(lease.task_id)
    manager.heartbeat(lease.lease_id, now=now)
    if not manager.complete(lease.lease_id, "0" * 64, now=now):
        raise SystemExit(f"commit of {lease.lease_id} rejected")
    time.sleep(0.001)  # the work: it leaves the other process room to take the write lock
print(json.dumps(claims))
"""


def test_two_processes_on_one_file_claim_each_task_exactly_once(tmp_path: Path) -> None:
    count = 300
    db = tmp_path / "shared.db"
    store = SqliteLeaseStore(db)
    manager = LeaseManager(store)
    with store.transaction():
        for spec in _specs(count, lease_seconds=3600):
            manager.add_task(spec, now=T0)
    store.close()
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER, str(db), f"proc-{i}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=REPO,
            env=env,
            text=True,
        )
        for i in range(2)
    ]
    for child in children:
        assert child.stdout.readline().strip() == "ready", child.stderr.read()[-3000:]  # type: ignore[union-attr]
    for child in children:
        child.stdin.write("go\n")  # type: ignore[union-attr]
        child.stdin.flush()  # type: ignore[union-attr]
    results = []
    for child in children:
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, err[-3000:]
        results.append(json.loads(out))
    claimed = Counter(task_id for claims in results for task_id in claims)
    assert len(claimed) == count and set(claimed.values()) == {1}
    assert all(results), "one process got nothing: the claims did not interleave"
    reopened = LeaseManager(SqliteLeaseStore(db))
    assert reopened.job_state("job") == {"COMPLETED": count}
    assert all(record.attempts_used == 1 for record in reopened.records())
    reopened.store.close()  # type: ignore[attr-defined]


def test_sweeps_of_four_connections_to_one_file_expire_each_lease_once(tmp_path: Path) -> None:
    """Each sweep reads the overdue leases inside its own write transaction, so a sweep that
    waited for another finds what that one expired already requeued."""
    stores = [SqliteLeaseStore(tmp_path / "leases.db") for _ in range(4)]
    try:
        first = LeaseManager(stores[0])
        with stores[0].transaction():
            for spec in _specs(40, lease_seconds=10):
                first.add_task(spec, now=T0)
        for index in range(40):
            assert first.claim(f"node-{index % 3}", now=T0) is not None
        later = T0 + timedelta(seconds=60)
        expired: list[int] = []
        barrier = threading.Barrier(len(stores))

        def sweep(store: SqliteLeaseStore) -> None:
            manager = LeaseManager(store)
            barrier.wait()
            expired.append(manager.sweep(now=later))

        _run([threading.Thread(target=sweep, args=(store,)) for store in stores])
        assert sorted(expired) == [0, 0, 0, 40]  # one sweep expired all forty; the others found none
        records = stores[0].all()
        assert {record.state for record in records} == {TaskState.PENDING}
        assert {record.expiries_seen for record in records} == {1}
    finally:
        for store in stores:
            store.close()
