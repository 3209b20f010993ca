"""The coordinator's transactions on PostgreSQL, where several threads (and replicas) hold
transactions at once: a deadlock is rolled back and the transaction run again, its events
stored once and its after-commit work done once; threads committing, failing, sweeping,
refreshing and cancelling the same jobs at once never deadlock for good, and each job is
settled exactly once."""

from __future__ import annotations

import hashlib
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from flashruntime.coordinator.core import Coordinator
from flashruntime.coordinator.state import open_state
from flashruntime.protocol.v1alpha1 import CompleteRequest, Event, EventType, JobSpec, NodeRegistration
from tests.service_server import settings_for


def test_a_deadlocked_transaction_is_run_again_with_its_events_stored_once(tmp_path: Path,
                                                                           postgres_url: str) -> None:
    state = open_state(settings_for(tmp_path, database_url=postgres_url))
    try:
        state.database.execute("CREATE TABLE items (name TEXT PRIMARY KEY)")  # type: ignore[attr-defined]
        state.database.execute("INSERT INTO items VALUES ('a'), ('b')")  # type: ignore[attr-defined]
        barrier = threading.Barrier(2)
        runs: Counter[int] = Counter()
        observed: Counter[int] = Counter()
        failures: list[BaseException] = []

        def work(index: int, first: str, second: str) -> None:
            runs[index] += 1
            db: Any = state.database
            db.execute("SET LOCAL deadlock_timeout = '50ms'")
            state.ledger.append_event(Event(job_id="j", type=EventType.TASK_CREATED, source="test",
                                            message=f"thread {index}", data={"thread": index}))
            state.after_commit(lambda: observed.update([index]))
            db.execute("SELECT name FROM items WHERE name = %s FOR UPDATE", (first,))
            if runs[index] == 1:
                barrier.wait(10)  # both hold their first row: each now waits for the other's
            db.execute("SELECT name FROM items WHERE name = %s FOR UPDATE", (second,))

        def thread(index: int, first: str, second: str) -> None:
            try:
                state.run(lambda: work(index, first, second))
            except BaseException as exc:  # noqa: BLE001 - reported below
                failures.append(exc)

        threads = [threading.Thread(target=thread, args=(0, "a", "b")),
                   threading.Thread(target=thread, args=(1, "b", "a"))]
        for each in threads:
            each.start()
        for each in threads:
            each.join(30)
        assert failures == []
        assert sorted(runs.values()) == [1, 2]  # PostgreSQL rolled one back; it ran again
        assert sorted(event.data["thread"] for event in state.ledger.events_for("j")) == [0, 1]
        assert observed == Counter({0: 1, 1: 1})
    finally:
        state.close()


SPEC = {"apiVersion": "flashml.dev/v1alpha1", "kind": "Job", "metadata": {"name": "pg-race"},
        "spec": {"execution": {"backend": "leases"},
                 "workload": {"type": "hyperparameter_search",
                              "parameters": {"trials": [{"i": i} for i in range(30)], "lease_seconds": 60}}}}


def _finish(coordinator: Coordinator, lease: Any) -> bool:
    record = coordinator.manager.store.get(lease.job_id, lease.task_id)
    assert record is not None
    body = lease.lease_id.encode()
    path = coordinator.artifacts.path_of(record.spec.commit_key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(body)
    answer = coordinator.complete(lease, CompleteRequest(output_sha256=hashlib.sha256(body).hexdigest()))
    return bool(answer["accepted"])


def test_threads_ending_tasks_of_the_same_jobs_settle_each_job_once(tmp_path: Path, postgres_url: str) -> None:
    coordinator = Coordinator(settings_for(tmp_path, database_url=postgres_url))
    try:
        done = coordinator.submit(JobSpec.model_validate(SPEC)).job_id
        cancelled = coordinator.submit(JobSpec.model_validate(SPEC)).job_id
        for index in range(4):
            coordinator.nodes.register(NodeRegistration(node_id=f"n{index}", kubernetes_node="",
                                                        hostname=f"n{index}", capabilities={"cpu_cores": 1}))
        failures: list[BaseException] = []
        stop = threading.Event()

        def worker(index: int) -> None:
            try:
                for turn in range(200):
                    job_id = done if turn % 2 == 0 else cancelled
                    lease = coordinator.manager.claim(f"n{index}", job_id=job_id, now=coordinator.now())
                    if lease is None:
                        if coordinator.job(done).state.value == "SUCCEEDED":  # type: ignore[union-attr]
                            return
                        continue
                    if turn % 7 == 0:
                        coordinator.manager.fail(lease.lease_id, "injected", now=coordinator.now())
                    else:
                        _finish(coordinator, lease)
            except BaseException as exc:  # noqa: BLE001 - reported below
                failures.append(exc)

        def background() -> None:
            try:
                while not stop.is_set():
                    coordinator.sweep_once()
                    coordinator.jobs()
            except BaseException as exc:  # noqa: BLE001 - reported below
                failures.append(exc)

        threads = [threading.Thread(target=worker, args=(index,)) for index in range(4)]
        sweeper = threading.Thread(target=background)
        for each in (*threads, sweeper):
            each.start()
        coordinator.cancel(cancelled)  # while its tasks are being claimed and committed
        for each in threads:
            each.join(60)
        stop.set()
        sweeper.join(30)
        assert failures == []
        assert not any(each.is_alive() for each in (*threads, sweeper))
        kinds = Counter(event.type for event in coordinator.ledger.events_for(done))
        assert coordinator.job(done).state.value == "SUCCEEDED"  # type: ignore[union-attr]
        assert kinds[EventType.JOB_SUCCEEDED] == 1 and kinds[EventType.TASK_COMMIT_ACCEPTED] == 30
        assert coordinator.job(cancelled).state.value == "CANCELLED"  # type: ignore[union-attr]
        other = Counter(event.type for event in coordinator.ledger.events_for(cancelled))
        assert other[EventType.JOB_SUCCEEDED] + other[EventType.JOB_FAILED] == 0
        accepted = sum(node.accepted for node in coordinator.nodes.store.all())
        assert accepted == 30 + other[EventType.TASK_COMMIT_ACCEPTED]
    finally:
        coordinator.close()
