"""Differential test: the same random sequence of manager calls on every store
(in memory, SQLite, and a store with only the required methods, which exercises
the manager's fallbacks) gives the same answers, events, records and counts."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from flashruntime.leases import InMemoryLeaseStore, LeaseError, LeaseManager, SqliteLeaseStore
from flashruntime.protocol.v1alpha1 import Event, TaskSpec
from flashruntime.scheduler import IsolationAwarePlacement

from tests.contract.test_lease_store_contract import MinimalStore

T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)
NODES = ["n0", "n1", "n2", "gpu"]
NODE_VIEWS = {
    "n0": {"node_id": "n0", "capabilities": {"pools": ["a"]}},
    "n1": {"node_id": "n1"},
    "n2": {"node_id": "n2", "capabilities": {"pools": ["a", "b"]}},
    "gpu": {"node_id": "gpu", "capabilities": {"gpus": [{}, {}], "pools": ["b"]}},
}


class Driver:
    """Runs one store; leases are named by issue order so answers compare across stores."""

    def __init__(self, store: Any) -> None:
        self.events: list[Event] = []
        self.manager = LeaseManager(store, on_event=self.events.append)
        self.leases: list[str] = []  # lease ids in issue order

    def name(self, lease_id: str | None) -> Any:
        return None if lease_id is None else self.leases.index(lease_id)

    def step(self, op: tuple[Any, ...]) -> Any:
        kind, *args = op
        m = self.manager
        try:
            if kind == "add":
                task_id, job_id, payload, lease_seconds, max_attempts, max_expiries = args
                m.add_task(
                    TaskSpec(task_id=task_id, job_id=job_id, commit_key=task_id, payload=payload,
                             lease_seconds=lease_seconds, max_attempts=max_attempts, max_expiries=max_expiries),
                    now=T0,
                )
                return "ok"
            if kind == "claim":
                node, job_id, with_policy, now = args
                lease = m.claim(node, job_id=job_id, now=now,
                                policy=IsolationAwarePlacement() if with_policy else None,
                                node=NODE_VIEWS[node] if with_policy else None)
                if lease is None:
                    return None
                self.leases.append(lease.lease_id)
                return (lease.task_id, lease.job_id, lease.node_id, lease.attempt_number, lease.deadline)
            if kind == "sweep":
                return m.sweep(now=args[0])
            if kind == "cancel":
                m.cancel_task(args[0], args[1], now=T0)
                return "ok"
            if kind == "cordon":
                m.cordon(args[0], until=args[1], reason="r", now=args[2])
                return "ok"
            if kind == "uncordon":
                return m.uncordon(args[0])
            if kind == "live":
                return sorted(m.live_leases_for_node(args[0], now=args[1]))
            lease_index = args[0]
            lease_id = self.leases[lease_index] if lease_index < len(self.leases) else "ls-none"
            if kind == "heartbeat":
                return m.heartbeat(lease_id, now=args[1]).deadline
            if kind == "complete":
                return m.complete(lease_id, f"{lease_index:064d}", now=args[1])
            if kind == "fail":
                m.fail(lease_id, "injected", now=args[1])
                return "ok"
        except (LeaseError, ValueError) as exc:
            return type(exc).__name__
        raise AssertionError(kind)

    def state(self) -> Any:
        m = self.manager
        records = [
            (r.spec.job_id, r.spec.task_id, r.seq, r.state, r.attempts_used, r.failures_seen, r.expiries_seen,
             None if r.active_lease is None else (self.name(r.active_lease.lease_id), r.active_lease.deadline),
             self.name(r.accepted_attempt_id), r.accepted_output_sha256,
             [(self.name(k), v.attempt_number, v.deadline) for k, v in r.lease_history.items()])
            for r in m.records()
        ]
        jobs = {r[0] for r in records}
        return records, {job: m.job_state(job) for job in sorted(jobs)}, m.cordoned(now=T0)

    def event_view(self) -> list[tuple[Any, ...]]:
        def anonymous(text: str) -> str:
            for index, lease_id in enumerate(self.leases):
                text = text.replace(lease_id, f"<lease {index}>")
            return text

        view = []
        for event in self.events:
            data = {key: anonymous(value) if isinstance(value, str) else value for key, value in event.data.items()}
            view.append((event.type, event.job_id, event.timestamp, anonymous(event.message), sorted(data.items(), key=str)))
        return view


def _random_ops(seed: int, count: int) -> list[tuple[Any, ...]]:
    rng = random.Random(seed)
    ops: list[tuple[Any, ...]] = []
    clock = 0.0
    tasks: list[tuple[str, str]] = []
    issued = 0
    for i in range(count):
        clock += rng.choice([0.0, 0.5, 1.0, 3.0])
        now = T0 + timedelta(seconds=clock)
        roll = rng.random()
        if roll < 0.15 or not tasks:
            job = rng.choice(["ja", "jb"])
            task_id = f"t{i}" if rng.random() < 0.95 or not tasks else tasks[0][1]  # sometimes a duplicate
            payload = rng.choice([{}, {}, {"pool": "a"}, {"pool": "b"}, {"gpus": 2}, {"isolation": {"tier": "gvisor"}}])
            ops.append(("add", task_id, job, payload, rng.choice([2.0, 4.0, 10.0]), rng.randint(1, 3), rng.randint(1, 3)))
            tasks.append((job, task_id))
        elif roll < 0.45:
            ops.append(("claim", rng.choice(NODES), rng.choice([None, None, "ja", "jb"]), rng.random() < 0.4, now))
            issued += 1
        elif roll < 0.6 and issued:
            ops.append(("heartbeat", rng.randrange(issued + 1), now))
        elif roll < 0.75 and issued:
            ops.append(("complete", rng.randrange(issued + 1), now))
        elif roll < 0.83 and issued:
            ops.append(("fail", rng.randrange(issued + 1), now))
        elif roll < 0.88:
            ops.append(("sweep", now))
        elif roll < 0.91:
            ops.append(("cancel", *rng.choice(tasks)))
        elif roll < 0.94:
            ops.append(("cordon", rng.choice(NODES), rng.choice([None, now + timedelta(seconds=5), now]), now))
        elif roll < 0.96:
            ops.append(("uncordon", rng.choice(NODES)))
        else:
            ops.append(("live", rng.choice(NODES), now))
    return ops


@pytest.mark.parametrize("seed", range(6))
def test_every_store_gives_the_same_answers(seed: int, tmp_path: Path) -> None:
    ops = _random_ops(seed, 300)
    sqlite_store = SqliteLeaseStore(tmp_path / "diff.db")
    drivers = {
        "memory": Driver(InMemoryLeaseStore()),
        "sqlite": Driver(sqlite_store),
        "minimal": Driver(MinimalStore()),
    }
    for position, op in enumerate(ops):
        answers = {name: driver.step(op) for name, driver in drivers.items()}
        assert answers["sqlite"] == answers["memory"] == answers["minimal"], (position, op, answers)
    states = {name: driver.state() for name, driver in drivers.items()}
    assert states["sqlite"] == states["memory"]
    assert states["minimal"][0] == states["memory"][0] and states["minimal"][1] == states["memory"][1]
    events = {name: driver.event_view() for name, driver in drivers.items()}
    assert events["sqlite"] == events["memory"] == events["minimal"]
    assert len(events["memory"]) > 100
    sqlite_store.close()
