"""``EXPLAIN QUERY PLAN`` of every statement ``SqliteLeaseStore`` issues for claim,
heartbeat, complete, fail, sweep and the other hot paths: each goes through an
index, never a full scan of ``lease_tasks``. The statements are
recorded as the store issues them, bound parameters included, then explained.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from flashruntime.leases import LeaseManager, SqliteLeaseStore
from flashruntime.protocol.v1alpha1 import TaskSpec
from flashruntime.scheduler import IsolationAwarePlacement

T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)
ALLOWED = ("USING INDEX", "USING COVERING INDEX", "USING PRIMARY KEY", "USING INTEGER PRIMARY KEY")


class RecordingConnection:
    """Wraps the store's connection and records (sql, parameters) of every statement."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self.statements: list[tuple[str, tuple[Any, ...]]] = []

    def execute(self, sql: str, parameters: Any = ()) -> sqlite3.Cursor:
        self.statements.append((sql, tuple(parameters)))
        return self._conn.execute(sql, parameters)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def _plan(conn: sqlite3.Connection, sql: str, parameters: tuple[Any, ...]) -> list[str]:
    return [str(row[-1]) for row in conn.execute("EXPLAIN QUERY PLAN " + sql, parameters).fetchall()]


def _full_scans(conn: sqlite3.Connection, statements: list[tuple[str, tuple[Any, ...]]]) -> list[str]:
    bad = []
    for sql, parameters in statements:
        if sql.split()[0].upper() in ("BEGIN", "COMMIT", "ROLLBACK", "PRAGMA"):
            continue
        for detail in _plan(conn, sql, parameters):
            if "lease_tasks" in detail and not any(phrase in detail for phrase in ALLOWED):
                bad.append(f"{detail}  <-  {sql}")
    return bad


@pytest.fixture(params=["no statistics", "after ANALYZE"])
def populated(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[SqliteLeaseStore, LeaseManager]]:
    store = SqliteLeaseStore(tmp_path / "plan.db")
    manager = LeaseManager(store)
    with store.transaction():
        for i in range(3000):
            manager.add_task(
                TaskSpec(
                    task_id=f"task-{i:05d}",
                    job_id=f"job-{i % 3}",
                    commit_key=f"k{i}",
                    lease_seconds=5 + i % 50,
                    payload={"pool": "gpu"} if i % 5 == 0 else {},
                ),
                now=T0,
            )
        for i in range(1200):  # a realistic mix: completed, leased, pending
            lease = manager.claim(f"node-{i % 7}", now=T0)
            assert lease is not None
            if i % 2:
                manager.complete(lease.lease_id, "0" * 64, now=T0)
    if request.param == "after ANALYZE":
        store._conn.execute("ANALYZE")
    yield store, manager
    store.close()


def _recorded(store: SqliteLeaseStore) -> RecordingConnection:
    recorder = RecordingConnection(store._conn)
    store._conn = recorder  # type: ignore[assignment]
    return recorder


def test_hot_paths_never_scan_lease_tasks(populated: tuple[SqliteLeaseStore, LeaseManager]) -> None:
    store, manager = populated
    recorder = _recorded(store)
    now = T0 + timedelta(seconds=1)
    lease = manager.claim("node-x", now=now)
    assert lease is not None
    scoped = manager.claim("node-x", job_id="job-2", now=now)
    assert scoped is not None
    manager.heartbeat(lease.lease_id, now=now)
    assert manager.complete(lease.lease_id, "1" * 64, now=now)
    manager.fail(scoped.lease_id, "boom", now=now)
    assert manager.sweep(now=T0 + timedelta(seconds=30)) > 0  # many expired: the deadline index range
    policy_lease = manager.claim(
        "gpu-node", now=T0 + timedelta(seconds=31), policy=IsolationAwarePlacement(), node={"node_id": "gpu-node"}
    )
    assert policy_lease is not None
    assert manager.lease_is_live(policy_lease.lease_id, now=T0 + timedelta(seconds=31))
    assert manager.lease_info(policy_lease.lease_id) is not None
    manager.live_leases_for_node("gpu-node", now=T0 + timedelta(seconds=31))
    manager.cancel_task("job-0", "task-02997", now=T0 + timedelta(seconds=31))
    manager.job_state("job-1")
    manager.cordon("bad", reason="x", now=now)
    assert manager.claim("bad", now=now) is None
    manager.add_task(TaskSpec(task_id="late", job_id="job-9", commit_key="late"), now=now)

    issued = {sql for sql, _ in recorder.statements}
    assert len(issued) >= 12, issued
    assert _full_scans(store._conn._conn, recorder.statements) == []  # type: ignore[attr-defined]


def test_expected_plans_of_the_key_lookups(populated: tuple[SqliteLeaseStore, LeaseManager]) -> None:
    store, manager = populated
    recorder = _recorded(store)
    raw = recorder._conn
    lease = manager.claim("node-x", now=T0)
    assert lease is not None
    by_sql = dict(recorder.statements)
    next_pending = next(sql for sql in by_sql if "state = 'PENDING'" in sql and "LIMIT 1" in sql)
    plan = _plan(raw, next_pending, by_sql[next_pending])
    assert any("lease_tasks_pending" in detail for detail in plan), plan  # an ordered walk under LIMIT

    recorder.statements.clear()
    manager.heartbeat(lease.lease_id, now=T0)
    find = next((sql, p) for sql, p in recorder.statements if "FROM lease_history AS h" in sql)
    plan = _plan(raw, *find)
    # lease_history by its primary key, then lease_tasks by its primary key
    assert plan[0].startswith("SEARCH h USING INDEX sqlite_autoindex_lease_history_1 (lease_id=?)"), plan
    assert plan[1].startswith("SEARCH t USING INDEX sqlite_autoindex_lease_tasks_"), plan
    assert plan[1].endswith("(job_id=? AND task_id=?)"), plan

    recorder.statements.clear()
    manager.sweep(now=T0 + timedelta(seconds=20))
    expired = next((sql, p) for sql, p in recorder.statements if "deadline <=" in sql)
    assert any("lease_tasks_deadline" in d for d in _plan(raw, *expired))

    recorder.statements.clear()
    manager.live_leases_for_node("node-1", now=T0)
    by_node = next((sql, p) for sql, p in recorder.statements if "active_node_id = ?" in sql)
    assert any("lease_tasks_node" in d for d in _plan(raw, *by_node))


def test_a_full_scan_would_be_caught(tmp_path: Path) -> None:
    """The criterion itself: a bare SCAN of lease_tasks is reported."""
    store = SqliteLeaseStore(tmp_path / "scan.db")
    try:
        statements = [("SELECT * FROM lease_tasks WHERE spec_json LIKE ?", ("%x%",))]
        assert _full_scans(store._conn, statements) != []
    finally:
        store.close()
