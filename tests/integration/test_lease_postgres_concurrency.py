"""Coordinator replicas sharing one PostgreSQL database never hand out a task twice: two
processes, each claiming on two threads (one through the plain queue, one through a
placement policy's pages), take every task of one queue exactly once; two sweepers on
their own pools expire every silent lease exactly once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path

from flashruntime.leases import LeaseManager
from flashruntime.leases.postgres_store import PostgresLeaseStore
from flashruntime.protocol.v1alpha1 import TaskSpec

REPO = Path(__file__).resolve().parents[2]
T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)

CLAIMER = r"""
import json, sys, threading
from datetime import datetime, timezone
from flashruntime.leases import LeaseManager
from flashruntime.leases.postgres_store import PostgresLeaseStore
from flashruntime.scheduler import FifoPlacement

url, name = sys.argv[1], sys.argv[2]
store = PostgresLeaseStore(url, max_size=4)  # one pool, shared by both threads of this process
manager = LeaseManager(store)
now = datetime(2030, 1, 1, tzinfo=timezone.utc)
claims, errors = {}, []
print("ready", flush=True)
sys.stdin.readline()  # both processes start claiming together

def claimer(node, policy):
    taken = claims.setdefault(node, [])
    try:
        while True:
            lease = manager.claim(node, now=now, policy=policy)
            if lease is None:
                # Nothing free now; tasks another claimer has locked may still come back PENDING.
                if not manager.job_state("job").get("PENDING"):
                    return
                continue
            taken.append(lease.task_id)
            manager.heartbeat(lease.lease_id, now=now)
            if not manager.complete(lease.lease_id, "0" * 64, now=now):
                raise RuntimeError(f"commit of {lease.lease_id} rejected")
    except BaseException as exc:
        errors.append(repr(exc))

threads = [threading.Thread(target=claimer, args=(f"{name}-queue", None)),
           threading.Thread(target=claimer, args=(f"{name}-policy", FifoPlacement()))]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join(60)
store.close()
if errors:
    raise SystemExit("; ".join(errors))
print(json.dumps(claims))
"""


def _add(store: PostgresLeaseStore, count: int, lease_seconds: float) -> LeaseManager:
    manager = LeaseManager(store)
    with store.transaction():
        for i in range(count):
            manager.add_task(TaskSpec(task_id=f"t{i:04d}", job_id="job", commit_key=f"k{i}",
                                      lease_seconds=lease_seconds), now=T0)
    return manager


def test_two_processes_claim_each_task_exactly_once(postgres_url: str) -> None:
    count = 200
    store = PostgresLeaseStore(postgres_url)
    _add(store, count, 3600)
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    children = [
        subprocess.Popen([sys.executable, "-c", CLAIMER, postgres_url, f"proc-{i}"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env=env, text=True)
        for i in range(2)
    ]
    try:
        for child in children:
            assert child.stdout.readline().strip() == "ready", child.stderr.read()[-3000:]  # type: ignore[union-attr]
        for child in children:
            child.stdin.write("go\n")  # type: ignore[union-attr]
            child.stdin.flush()  # type: ignore[union-attr]
        results: dict[str, list[str]] = {}
        for child in children:
            out, err = child.communicate(timeout=120)
            assert child.returncode == 0, err[-3000:]
            results.update(json.loads(out))
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
    claimed = Counter(task_id for claims in results.values() for task_id in claims)
    assert len(claimed) == count and set(claimed.values()) == {1}
    assert sum(1 for claims in results.values() if claims) >= 2, f"the claims did not interleave: {results}"
    manager = LeaseManager(store)
    assert manager.job_state("job") == {"COMPLETED": count}
    assert all(record.attempts_used == 1 for record in manager.records())
    store.close()


def test_two_sweepers_expire_each_silent_lease_exactly_once(postgres_url: str) -> None:
    count = 100
    store = PostgresLeaseStore(postgres_url)
    manager = _add(store, count, 10)
    for _ in range(count):
        assert manager.claim("gone", now=T0) is not None
    sweepers = [LeaseManager(PostgresLeaseStore(postgres_url)) for _ in range(2)]  # two replicas
    swept = [0, 0]
    barrier = threading.Barrier(2)

    def sweep(index: int) -> None:
        barrier.wait()
        for step in range(20):  # each sweep expires what the other has not locked yet
            swept[index] += sweepers[index].sweep(now=T0 + timedelta(seconds=10, milliseconds=step))

    threads = [threading.Thread(target=sweep, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sum(swept) == count
    records = manager.records()
    assert [record.expiries_seen for record in records] == [1] * count
    assert manager.job_state("job") == {"PENDING": count}
    for sweeper in sweepers:
        sweeper.store.close()  # type: ignore[attr-defined]
    store.close()


def test_a_claim_in_flight_hides_only_its_own_choice_from_the_next_claimer(postgres_url: str) -> None:
    """While one claimer's transaction is open (it holds its chosen task), a policy claim of
    another gets the next task, not "nothing now": pages are read without locks and only
    the choice is locked."""
    from flashruntime.scheduler import FifoPlacement

    first_store, second_store = PostgresLeaseStore(postgres_url), PostgresLeaseStore(postgres_url)
    try:
        first, second = LeaseManager(first_store), LeaseManager(second_store)
        for index in range(3):
            first.add_task(TaskSpec(task_id=f"t{index}", job_id="job", commit_key=f"job/t{index}"), now=T0)
        holding, release = threading.Event(), threading.Event()
        taken: list[str] = []

        def claim_and_hold() -> None:
            with first_store.transaction():
                lease = first.claim("node-a", now=T0, policy=FifoPlacement())
                assert lease is not None
                taken.append(lease.task_id)
                holding.set()
                release.wait(30)  # a hang guard

        holder = threading.Thread(target=claim_and_hold)
        holder.start()
        try:
            assert holding.wait(30)
            lease = second.claim("node-b", now=T0, policy=FifoPlacement())
            assert lease is not None and lease.task_id != taken[0]
            assert second.claim("node-c", now=T0, policy=FifoPlacement()) is not None  # the third
            assert second.claim("node-d", now=T0, policy=FifoPlacement()) is None  # all three taken or held
        finally:
            release.set()
            holder.join(30)
        assert sorted(record.state.value for record in second_store.all("job")) == ["LEASED"] * 3
    finally:
        first_store.close()
        second_store.close()
