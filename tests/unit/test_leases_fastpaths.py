"""The lease hot paths' shortcuts keep the documented behaviour: the cheap lease-id
test (``has_lease``) and the retry on a clashing id, the direct JSON decoder, the
shared decode of an unrenewed active lease, and the page size of new SQLite files."""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from flashruntime.leases import InMemoryLeaseStore, LeaseManager, SqliteLeaseStore
from flashruntime.leases._models import LeaseIds, loads
from flashruntime.protocol.v1alpha1 import TaskSpec

T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)


def spec(task_id: str, job_id: str = "job-a") -> TaskSpec:
    return TaskSpec(task_id=task_id, job_id=job_id, commit_key=f"{job_id}/{task_id}")


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    made = InMemoryLeaseStore() if request.param == "memory" else SqliteLeaseStore(tmp_path / "l.db")
    yield made
    if request.param == "sqlite":
        made.close()


def test_has_lease_knows_every_issued_lease_and_nothing_else(store: Any) -> None:
    manager = LeaseManager(store)
    manager.add_task(spec("t0"), now=T0)
    assert store.has_lease("ls-000000000000") is False
    lease = manager.claim("n1", now=T0)
    assert lease is not None and store.has_lease(lease.lease_id) is True
    assert manager.complete(lease.lease_id, "a" * 64, now=T0) is True
    assert store.has_lease(lease.lease_id) is True  # history outlives the active lease


def test_sqlite_has_lease_reads_the_file(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    with SqliteLeaseStore(path) as first:
        manager = LeaseManager(first)
        manager.add_task(spec("t0"), now=T0)
        lease = manager.claim("n1", now=T0)
    assert lease is not None
    with SqliteLeaseStore(path) as reopened:
        assert reopened.has_lease(lease.lease_id) is True
        assert reopened.has_lease("ls-ffffffffffff") is False


class _FindOnlyStore(InMemoryLeaseStore):
    """A store with find_lease but no has_lease: the manager derives the test from find_lease."""

    def __init__(self) -> None:
        super().__init__()
        del self.has_lease


@pytest.mark.parametrize("kind", ["memory", "sqlite", "find_only"])
def test_claim_draws_again_when_the_fresh_id_is_taken(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store: Any = {"memory": InMemoryLeaseStore, "find_only": _FindOnlyStore}.get(kind)
    store = store() if store is not None else SqliteLeaseStore(tmp_path / "l.db")
    drawn = iter(["ls-00000000000a", "ls-00000000000a", "ls-00000000000b"])
    monkeypatch.setattr(LeaseIds, "next", lambda self: next(drawn))
    manager = LeaseManager(store)
    manager.add_task(spec("t0"), now=T0)
    manager.add_task(spec("t1"), now=T0)
    first = manager.claim("n1", now=T0)
    second = manager.claim("n1", now=T0)
    assert first is not None and second is not None
    assert (first.lease_id, second.lease_id) == ("ls-00000000000a", "ls-00000000000b")
    assert manager.lease_info("ls-00000000000b").task_id == "t1"  # type: ignore[union-attr]
    if kind == "sqlite":
        store.close()


@pytest.mark.parametrize(
    "text",
    ['{"a":1,"b":[1.5,"x",null,true]}', '{"lease_id":"ls-1","deadline":"2030-01-01T00:00:00+00:00"}', "[]", '"s"'],
)
def test_loads_matches_json_loads(text: str) -> None:
    assert loads(text) == json.loads(text)
    assert loads(text.encode()) == json.loads(text.encode())  # bytes take json.loads itself


@pytest.mark.parametrize("text", [' {"a":1}', '{"a":1} ', '{"a":1}x', "", "{"])
def test_loads_falls_back_to_json_loads_for_other_text(text: str) -> None:
    try:
        expected: Any = json.loads(text)
    except json.JSONDecodeError as error:
        with pytest.raises(json.JSONDecodeError, match=error.msg):
            loads(text)
    else:
        assert loads(text) == expected


def test_sqlite_shares_the_decoded_active_lease_only_while_unrenewed(tmp_path: Path) -> None:
    with SqliteLeaseStore(tmp_path / "l.db") as store:
        manager = LeaseManager(store)
        manager.add_task(spec("t0"), now=T0)
        lease = manager.claim("n1", now=T0)
        assert lease is not None
        record = store.find_lease(lease.lease_id)
        assert record is not None and record.active_lease == lease
        assert record.lease_history[lease.lease_id] is record.active_lease
        renewal = manager.heartbeat(lease.lease_id, now=T0 + timedelta(seconds=5))
        record = store.find_lease(lease.lease_id)
        assert record is not None
        assert record.active_lease == renewal and record.active_lease.deadline == T0 + timedelta(seconds=65)
        assert record.lease_history[lease.lease_id] == lease  # as first issued
        assert record.lease_history[lease.lease_id].deadline == T0 + timedelta(seconds=60)


def test_new_sqlite_file_gets_2k_pages_and_an_existing_file_keeps_its_own(tmp_path: Path) -> None:
    with SqliteLeaseStore(tmp_path / "new.db") as store:
        assert store._conn.execute("PRAGMA page_size").fetchone()[0] == 2048
    old = tmp_path / "old.db"
    conn = sqlite3.connect(old)
    conn.execute("PRAGMA page_size = 4096")
    conn.execute("CREATE TABLE unrelated (x)")
    conn.commit()
    conn.close()
    with SqliteLeaseStore(old) as store:
        assert store._conn.execute("PRAGMA page_size").fetchone()[0] == 4096
        manager = LeaseManager(store)
        manager.add_task(spec("t0"), now=T0)
        lease = manager.claim("n1", now=T0)
        assert lease is not None and manager.complete(lease.lease_id, "b" * 64, now=T0) is True
