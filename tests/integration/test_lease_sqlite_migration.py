"""Migration of the single-document ``lease_tasks`` layout: converted in
one transaction on open, queue order and in-flight leases kept, the new counters
at 0; schema 2 gains the release count in place; a newer schema is refused."""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from flashruntime.leases import LeaseManager, SqliteLeaseStore
from flashruntime.protocol.v1alpha1 import Lease, TaskSpec, TaskState

T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)
SHA = "ef" * 32


def _spec_json(task_id: str, job_id: str, **extra: object) -> str:
    # an older writer: no max_expiries, integer lease_seconds
    return json.dumps({"schema_version": "v1alpha1", "task_id": task_id, "job_id": job_id, "payload": {"n": task_id},
                       "commit_key": f"{job_id}/{task_id}", "max_attempts": 3, "lease_seconds": 60, **extra})


def _lease(lease_id: str, task_id: str, job_id: str, attempt: int, deadline: datetime) -> Lease:
    return Lease(lease_id=lease_id, task_id=task_id, job_id=job_id, node_id="old-node", attempt_number=attempt,
                 deadline=deadline, payload={"n": task_id})


def _old_database(path: Path, keyed_by_task_only: bool) -> dict[str, Lease]:
    conn = sqlite3.connect(path)
    key_columns = "" if keyed_by_task_only else "job_id TEXT NOT NULL, "
    primary_key = "PRIMARY KEY (task_id)" if keyed_by_task_only else "PRIMARY KEY (job_id, task_id)"
    conn.execute(
        f"CREATE TABLE lease_tasks ({key_columns}task_id TEXT NOT NULL, seq INTEGER NOT NULL, spec_json TEXT NOT NULL, "
        "state TEXT NOT NULL, attempts_used INTEGER NOT NULL DEFAULT 0, active_lease_json TEXT, "
        f"accepted_attempt_id TEXT, lease_history_json TEXT NOT NULL DEFAULT '{{}}', {primary_key})"
    )
    conn.execute("CREATE INDEX lease_tasks_state ON lease_tasks (state, seq)")
    leases = {
        "in-flight": _lease("ls-00000000000a", "b-leased", "job", 2, T0 + timedelta(seconds=60)),
        "earlier": _lease("ls-00000000000b", "b-leased", "job", 1, T0 - timedelta(seconds=30)),
        "winner": _lease("ls-00000000000c", "c-done", "job", 1, T0),
    }
    rows = [  # inserted out of queue order: seq decides
        ("c-done", 3, "COMPLETED", 1, None, leases["winner"].lease_id, {"ls-00000000000c": leases["winner"]}),
        ("a-pending", 1, "PENDING", 0, None, None, {}),
        ("b-leased", 2, "LEASED", 2, leases["in-flight"], None,
         {"ls-00000000000b": leases["earlier"], "ls-00000000000a": leases["in-flight"]}),
        ("d-pending", 4, "PENDING", 0, None, None, {}),
    ]
    for task_id, seq, state, attempts, active, accepted, history in rows:
        values = {
            "task_id": task_id,
            "seq": seq,
            "spec_json": _spec_json(task_id, "job"),
            "state": state,
            "attempts_used": attempts,
            "active_lease_json": active.model_dump_json() if active else None,
            "accepted_attempt_id": accepted,
            "lease_history_json": json.dumps({k: v.model_dump(mode="json") for k, v in history.items()}),
        }
        if not keyed_by_task_only:
            values["job_id"] = "job"
        names = ", ".join(values)
        conn.execute(f"INSERT INTO lease_tasks ({names}) VALUES ({', '.join('?' * len(values))})", list(values.values()))
    conn.commit()
    conn.close()
    return leases


@pytest.mark.parametrize("keyed_by_task_only", [False, True])
def test_single_document_layout_is_migrated_on_open(tmp_path: Path, keyed_by_task_only: bool) -> None:
    path = tmp_path / "old.db"
    leases = _old_database(path, keyed_by_task_only)
    store = SqliteLeaseStore(path)
    manager = LeaseManager(store)

    records = manager.records()
    assert [(r.spec.task_id, r.seq) for r in records] == [("a-pending", 1), ("b-leased", 2), ("c-done", 3), ("d-pending", 4)]
    assert all(r.failures_seen == 0 and r.expiries_seen == 0 for r in records)
    assert all(r.spec.max_expiries == 9 and r.spec.lease_seconds == 60.0 for r in records)
    leased = store.get("job", "b-leased")
    assert leased is not None and leased.state is TaskState.LEASED and leased.attempts_used == 2
    assert leased.active_lease == leases["in-flight"]
    assert list(leased.lease_history) == ["ls-00000000000b", "ls-00000000000a"]
    done = store.get("job", "c-done")
    assert done is not None and done.state is TaskState.COMPLETED and done.accepted_attempt_id == "ls-00000000000c"

    # the in-flight lease still works after the migration; the winner's retry is idempotent
    assert manager.heartbeat("ls-00000000000a", now=T0).deadline == T0 + timedelta(seconds=60)
    assert manager.complete("ls-00000000000c", SHA, now=T0) is True
    assert manager.complete("ls-00000000000b", SHA, now=T0) is False
    assert manager.claim("new-node", now=T0).task_id == "a-pending"  # type: ignore[union-attr]
    assert manager.complete("ls-00000000000a", SHA, now=T0 + timedelta(seconds=1)) is True
    store.close()

    raw = sqlite3.connect(path)
    try:
        assert raw.execute("SELECT value FROM lease_meta WHERE key = 'schema_version'").fetchone() == ("3",)
        tables = {name for (name,) in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert tables == {"lease_meta", "lease_tasks", "lease_history", "lease_cordons"}
        indexes = {name for (name,) in raw.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL")}
        assert {"lease_tasks_pending", "lease_tasks_pending_job", "lease_tasks_deadline", "lease_tasks_node",
                "lease_tasks_job_state", "lease_history_task"} <= indexes
        assert "lease_tasks_state" not in indexes
        assert raw.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        raw.close()
    again = LeaseManager(SqliteLeaseStore(path))  # reopening a migrated file changes nothing
    assert again.job_state("job") == {"PENDING": 1, "LEASED": 1, "COMPLETED": 2}
    again.store.close()  # type: ignore[attr-defined]


def test_failed_migration_rolls_back_and_leaves_the_old_table(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    _old_database(path, keyed_by_task_only=False)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE lease_tasks SET spec_json = '{not json' WHERE task_id = 'd-pending'")
    conn.commit()
    before = conn.execute("SELECT * FROM lease_tasks ORDER BY seq").fetchall()
    conn.close()
    with pytest.raises(ValueError):
        SqliteLeaseStore(path)
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT * FROM lease_tasks ORDER BY seq").fetchall() == before
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert tables == {"lease_tasks"}
    finally:
        conn.close()


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    SqliteLeaseStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE lease_meta SET value = '4' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(RuntimeError, match="schema version '4'"):
        SqliteLeaseStore(path)


def test_schema_2_gains_the_release_count_in_place(tmp_path: Path) -> None:
    path = tmp_path / "v2.db"
    manager = LeaseManager(SqliteLeaseStore(path))
    for task_id in ("a", "b"):
        manager.add_task(TaskSpec.model_validate_json(_spec_json(task_id, "job")), now=T0)
    lease = manager.claim("n1", now=T0)
    assert lease is not None
    manager.store.close()  # type: ignore[attr-defined]
    conn = sqlite3.connect(path)  # the file as schema 2 wrote it: no releases_seen column
    conn.execute("ALTER TABLE lease_tasks DROP COLUMN releases_seen")
    conn.execute("UPDATE lease_meta SET value = '2' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    upgraded = LeaseManager(SqliteLeaseStore(path))
    records = {r.spec.task_id: r for r in upgraded.records()}
    assert [r.releases_seen for r in records.values()] == [0, 0]
    assert records["a"].active_lease == lease  # the lease in flight survives the upgrade
    upgraded.release(lease.lease_id, "drain", now=T0)
    assert upgraded.store.get("job", "a").releases_seen == 1  # type: ignore[union-attr]
    upgraded.store.close()  # type: ignore[attr-defined]
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("SELECT value FROM lease_meta WHERE key = 'schema_version'").fetchone() == ("3",)
        assert raw.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        raw.close()


def test_constructor_creates_parent_directory_and_wal(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "leases.db"
    store = SqliteLeaseStore(path, busy_timeout_ms=250)
    try:
        assert path.exists()
        assert store._conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert store._conn.execute("PRAGMA synchronous").fetchone() == (2,)  # FULL
        assert store._conn.execute("PRAGMA busy_timeout").fetchone() == (250,)
    finally:
        store.close()
    with pytest.raises(ValueError):
        SqliteLeaseStore(path, busy_timeout_ms=-1)
