"""One contract for every ``NodeStore``: each test runs against ``InMemoryNodeStore``,
``SqliteNodeStore`` on a file of its own, ``SqliteNodeStore`` on a ``SqliteDatabase``
shared with other stores, and ``PostgresNodeStore`` the same two ways (on an empty
database of the session's cluster). For the SQL stores also: what was stored survives
closing and reopening, a write inside a shared transaction that raises is rolled back
with it, and a newer node schema is refused."""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flashruntime.coordinator.node_store import InMemoryNodeStore, NodeStore, StoredNode
from flashruntime.coordinator.postgres_node_store import PostgresNodeStore
from flashruntime.coordinator.sqlite_node_store import SqliteNodeStore
from flashruntime.postgres_database import PostgresDatabase
from flashruntime.protocol.v1alpha1 import NodeCapabilities, NodeEnvironment, NodeRegistration
from flashruntime.sqlite_database import SqliteDatabase

T0 = 1_700_000_000.125  # epoch seconds, exact in a double


def registration(node_id: str = "node-a", pools: list[str] | None = None, **fields: Any) -> NodeRegistration:
    """A registration using most fields, with values a JSON round trip must keep exactly."""
    capabilities = NodeCapabilities(
        cpu_cores=7.5,
        memory_bytes=68_719_476_736,
        gpus=[{"index": 0, "name": "L4", "memory_total_mb": 23034, "driver_version": "550.54",
               "compute_capability": "8.9"}],
        pools=["team-7", "spot"] if pools is None else pools,
        os="linux",
        architecture="x86_64",
    )
    values: dict[str, Any] = {
        "node_id": node_id,
        "kubernetes_node": f"k8s-{node_id}",
        "hostname": f"{node_id}.example",
        "capabilities": capabilities,
        "environment": NodeEnvironment.EDGE,
        "sandbox_capable": True,
        "argv_capable": True,
        "local_datasets": ["mnist", "cifar10"],
        "pool": "gpu",
        "labels": {"rack": "r12", "zone": {"name": "eu-1", "ids": [1, 2.5, None, True]}},
        "agent_version": "0.5.0",
    }
    values.update(fields)
    return NodeRegistration(**values)


class Harness:
    """A store of one kind; for the SQL kinds, the file or database it lives in and a way to reopen it."""

    def __init__(self, kind: str, tmp_path: Path, url: str | None = None) -> None:
        self.kind = kind
        self.path = tmp_path / "state" / "nodes.db"
        self.url = url  # the database of the postgres kinds
        self.database: SqliteDatabase | PostgresDatabase | None = None
        self.store: Any = self._open()

    def _open(self) -> Any:
        if self.kind == "memory":
            return InMemoryNodeStore()
        if self.kind == "sqlite-file":
            return SqliteNodeStore(self.path)
        if self.kind == "postgres":
            return PostgresNodeStore(self.url)  # type: ignore[arg-type]
        if self.kind == "postgres-shared":
            self.database = PostgresDatabase(self.url)  # type: ignore[arg-type]
            return PostgresNodeStore(self.database)
        self.database = SqliteDatabase(self.path)
        return SqliteNodeStore(self.database)

    def reopen(self) -> Any:
        """Close the store (and the shared database) and open a fresh one on the same file: a restart."""
        self.close()
        self.store = self._open()
        return self.store

    def close(self) -> None:
        if self.kind in ("sqlite-file", "postgres"):
            self.store.close()
        elif self.database is not None:
            self.store.close()
            self.database.close()


STORE_KINDS = ["memory", "sqlite-file", "sqlite-shared", "postgres", "postgres-shared"]
SQL_KINDS = ["sqlite-file", "sqlite-shared", "postgres", "postgres-shared"]


def _harness(request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    # Only the postgres kinds ask for a database, so the other kinds never start the cluster.
    url = request.getfixturevalue("postgres_url") if request.param.startswith("postgres") else None
    return Harness(request.param, tmp_path, url)


@pytest.fixture(params=STORE_KINDS)
def h(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    harness = _harness(request, tmp_path)
    yield harness
    harness.close()


@pytest.fixture(params=SQL_KINDS)
def hs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    harness = _harness(request, tmp_path)
    yield harness
    harness.close()


def stored(store: NodeStore, node_id: str) -> StoredNode:
    node = store.get(node_id)
    assert node is not None, f"{node_id} is not stored"
    return node


# --- the protocol -------------------------------------------------------------------


def test_is_a_node_store(h: Harness) -> None:
    assert isinstance(h.store, NodeStore)


def test_register_then_get_returns_what_was_stored(h: Harness) -> None:
    reg = registration()
    h.store.register(reg, T0)
    node = stored(h.store, "node-a")
    assert node == StoredNode(reg, T0, 0)
    assert node.registration.labels == {"rack": "r12", "zone": {"name": "eu-1", "ids": [1, 2.5, None, True]}}
    assert isinstance(node.last_seen, float) and isinstance(node.accepted, int)


def test_get_of_a_node_that_never_registered_is_none(h: Harness) -> None:
    assert h.store.get("node-a") is None
    h.store.register(registration("node-a"), T0)
    assert h.store.get("node-b") is None
    assert h.store.get("") is None


def test_register_replaces_the_registration_and_last_seen(h: Harness) -> None:
    h.store.register(registration(hostname="old.example", pools=["p-old"]), T0)
    replacement = registration(hostname="new.example", pools=["p-new"], local_datasets=[], labels={})
    h.store.register(replacement, T0 + 30)
    assert stored(h.store, "node-a") == StoredNode(replacement, T0 + 30, 0)
    assert len(h.store.all()) == 1


def test_reregistration_takes_its_own_seen_at_even_when_earlier(h: Harness) -> None:
    h.store.register(registration(), T0 + 60)
    h.store.register(registration(), T0)
    assert stored(h.store, "node-a").last_seen == T0


def test_reregistration_keeps_the_accepted_count(h: Harness) -> None:
    h.store.register(registration(), T0)
    for _ in range(3):
        assert h.store.count_accepted("node-a") is True
    h.store.register(registration(hostname="again.example"), T0 + 1)
    node = stored(h.store, "node-a")
    assert node.accepted == 3
    assert node.registration.hostname == "again.example"


def test_what_get_returns_is_a_copy_the_caller_may_change(h: Harness) -> None:
    h.store.register(registration(), T0)
    node = stored(h.store, "node-a")
    node.registration.capabilities.pools.append("stolen")
    node.registration.labels["zone"]["name"] = "changed"
    node.registration.hostname = "changed.example"
    listed = h.store.all()[0]
    listed.registration.local_datasets.clear()
    assert stored(h.store, "node-a") == StoredNode(registration(), T0, 0)


def test_changing_the_registration_after_register_changes_nothing_stored(h: Harness) -> None:
    reg = registration()
    h.store.register(reg, T0)
    reg.capabilities.pools.append("later")
    reg.labels["rack"] = "r99"
    pools = ["p1"]
    h.store.set_pools("node-a", pools)
    pools.append("p2")
    node = stored(h.store, "node-a")
    assert node.registration.capabilities.pools == ["p1"]
    assert node.registration.labels["rack"] == "r12"


def test_all_is_every_node_sorted_by_node_id(h: Harness) -> None:
    assert h.store.all() == []
    for node_id, at in [("node-c", T0 + 2), ("node-a", T0 + 1), ("node-b", T0), ("node-10", T0 + 3)]:
        h.store.register(registration(node_id), at)
    nodes = h.store.all()
    assert [n.registration.node_id for n in nodes] == ["node-10", "node-a", "node-b", "node-c"]
    assert nodes == [stored(h.store, n.registration.node_id) for n in nodes]
    assert [n.last_seen for n in nodes] == [T0 + 3, T0 + 1, T0, T0 + 2]


def test_set_pools_replaces_only_the_pools(h: Harness) -> None:
    h.store.register(registration("node-a"), T0)
    h.store.register(registration("node-b"), T0 + 1)
    h.store.count_accepted("node-a")
    assert h.store.set_pools("node-a", ["batch", "team-9"]) is True
    node = stored(h.store, "node-a")
    expected = registration("node-a", pools=["batch", "team-9"])
    assert node == StoredNode(expected, T0, 1)
    assert stored(h.store, "node-b") == StoredNode(registration("node-b"), T0 + 1, 0)
    assert h.store.set_pools("node-a", []) is True
    assert stored(h.store, "node-a") == StoredNode(registration("node-a", pools=[]), T0, 1)


def test_set_pools_of_an_unknown_node_is_false_and_stores_nothing(h: Harness) -> None:
    assert h.store.set_pools("ghost", ["p"]) is False
    assert h.store.get("ghost") is None and h.store.all() == []
    h.store.register(registration(), T0)
    assert h.store.set_pools("ghost", ["p"]) is False
    assert h.store.get("ghost") is None
    assert h.store.all() == [StoredNode(registration(), T0, 0)]


def test_seen_keeps_the_later_time(h: Harness) -> None:
    h.store.register(registration(), T0)
    assert h.store.seen("node-a", T0 + 10.5) is True
    assert stored(h.store, "node-a").last_seen == T0 + 10.5
    assert h.store.seen("node-a", T0 + 3) is True  # an older report: known, but it does not go back
    assert stored(h.store, "node-a").last_seen == T0 + 10.5
    assert h.store.seen("node-a", T0 + 10.5) is True
    assert stored(h.store, "node-a") == StoredNode(registration(), T0 + 10.5, 0)


def test_seen_of_an_unknown_node_is_false_and_stores_nothing(h: Harness) -> None:
    assert h.store.seen("ghost", T0) is False
    assert h.store.get("ghost") is None and h.store.all() == []
    h.store.register(registration(), T0)
    assert h.store.seen("ghost", T0 + 5) is False
    assert h.store.all() == [StoredNode(registration(), T0, 0)]


def test_count_accepted_adds_one_per_call(h: Harness) -> None:
    h.store.register(registration("node-a"), T0)
    h.store.register(registration("node-b"), T0)
    assert h.store.count_accepted("node-a") is True
    assert h.store.count_accepted("node-a") is True
    assert h.store.count_accepted("node-b") is True
    assert [(n.registration.node_id, n.accepted) for n in h.store.all()] == [("node-a", 2), ("node-b", 1)]
    assert stored(h.store, "node-a").last_seen == T0  # counting is not hearing from the node


def test_count_accepted_of_an_unknown_node_is_false_and_stores_nothing(h: Harness) -> None:
    assert h.store.count_accepted("ghost") is False
    assert h.store.get("ghost") is None and h.store.all() == []
    h.store.register(registration(), T0)
    assert h.store.count_accepted("ghost") is False
    assert h.store.all() == [StoredNode(registration(), T0, 0)]


def test_each_call_is_atomic_under_concurrent_callers(h: Harness) -> None:
    h.store.register(registration(), T0)
    threads, calls = 4, 8

    def work(index: int) -> None:
        for call in range(calls):
            h.store.count_accepted("node-a")
            h.store.seen("node-a", T0 + index * calls + call)

    workers = [threading.Thread(target=work, args=(index,)) for index in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert stored(h.store, "node-a") == StoredNode(registration(), T0 + threads * calls - 1, threads * calls)


# --- the SQL stores -------------------------------------------------------------------


def test_what_was_stored_survives_a_restart(hs: Harness) -> None:
    hs.store.register(registration("node-b"), T0)
    hs.store.register(registration("node-a", pools=["p"]), T0 + 1)
    hs.store.set_pools("node-b", ["after"])
    hs.store.seen("node-b", T0 + 42.25)
    hs.store.count_accepted("node-a")
    hs.store.count_accepted("node-a")
    before = hs.store.all()
    reopened = hs.reopen()
    assert reopened.all() == before == [
        StoredNode(registration("node-a", pools=["p"]), T0 + 1, 2),
        StoredNode(registration("node-b", pools=["after"]), T0 + 42.25, 0),
    ]
    reopened.register(registration("node-a"), T0 + 50)  # the count, restored from the file, is kept
    assert stored(reopened, "node-a").accepted == 2


def test_a_write_inside_a_shared_transaction_that_raises_is_rolled_back(tmp_path: Path) -> None:
    db = SqliteDatabase(tmp_path / "shared.db")
    try:
        store = SqliteNodeStore(db)
        store.register(registration("node-a"), T0)
        with pytest.raises(RuntimeError, match="after the writes"), db.transaction():
            store.register(registration("node-b"), T0)
            store.set_pools("node-a", ["rolled-back"])
            store.seen("node-a", T0 + 99)
            store.count_accepted("node-a")
            assert store.get("node-b") is not None  # seen inside the transaction
            raise RuntimeError("after the writes")
        assert store.get("node-b") is None
        assert store.all() == [StoredNode(registration("node-a"), T0, 0)]
    finally:
        db.close()


def test_writes_inside_a_shared_transaction_commit_with_it(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    db = SqliteDatabase(path)
    other = SqliteNodeStore(SqliteDatabase(path))  # another connection, as another process would have
    try:
        store = SqliteNodeStore(db)
        with db.transaction():
            store.register(registration("node-a"), T0)
            store.count_accepted("node-a")
            assert other.get("node-a") is None  # not committed yet
        assert other.get("node-a") == StoredNode(registration("node-a"), T0, 1)
    finally:
        other.close()
        db.close()


def test_closing_a_store_on_a_shared_database_leaves_the_database_open(tmp_path: Path) -> None:
    db = SqliteDatabase(tmp_path / "shared.db")
    try:
        store = SqliteNodeStore(db)
        store.register(registration(), T0)
        store.close()
        assert SqliteNodeStore(db).get("node-a") == StoredNode(registration(), T0, 0)
    finally:
        db.close()


def _set_node_schema_version(path: Path, version: str) -> None:
    conn = sqlite3.connect(path)
    try:
        with conn:
            conn.execute("UPDATE node_meta SET value = ? WHERE key = 'schema_version'", (version,))
    finally:
        conn.close()


@pytest.mark.parametrize("shared", [False, True], ids=["own-file", "shared-database"])
def test_a_newer_node_schema_is_refused_naming_the_file(tmp_path: Path, shared: bool) -> None:
    path = tmp_path / "nodes.db"
    store = SqliteNodeStore(path)
    store.register(registration(), T0)
    store.close()
    _set_node_schema_version(path, "2")
    if not shared:
        with pytest.raises(RuntimeError, match=re.escape(str(path)) + ".*'2'"):
            SqliteNodeStore(path)
    else:
        db = SqliteDatabase(path)
        try:
            with pytest.raises(RuntimeError, match=re.escape(str(path)) + ".*'2'"):
                SqliteNodeStore(db)
            # the refusal wrote nothing and left its owner's database usable
            assert db.connection.execute("SELECT value FROM node_meta").fetchall() == [("2",)]
            assert db.connection.execute("SELECT COUNT(*) FROM nodes").fetchone() == (1,)
        finally:
            db.close()
    _set_node_schema_version(path, "1")
    reopened = SqliteNodeStore(path)
    try:
        assert reopened.all() == [StoredNode(registration(), T0, 0)]
    finally:
        reopened.close()


# --- the PostgreSQL store ----------------------------------------------------------------


def test_postgres_a_write_inside_a_shared_transaction_that_raises_is_rolled_back(postgres_url: str) -> None:
    db = PostgresDatabase(postgres_url)
    try:
        store = PostgresNodeStore(db)
        store.register(registration("node-a"), T0)
        with pytest.raises(RuntimeError, match="after the writes"), db.transaction():
            store.register(registration("node-b"), T0)
            store.set_pools("node-a", ["rolled-back"])
            store.seen("node-a", T0 + 99)
            store.count_accepted("node-a")
            assert store.get("node-b") is not None  # seen inside the transaction
            raise RuntimeError("after the writes")
        assert store.get("node-b") is None
        assert store.all() == [StoredNode(registration("node-a"), T0, 0)]
    finally:
        db.close()


def test_postgres_writes_inside_a_shared_transaction_commit_with_it(postgres_url: str) -> None:
    db = PostgresDatabase(postgres_url)
    other = PostgresNodeStore(postgres_url)  # a pool of its own, as another replica would have
    try:
        store = PostgresNodeStore(db)
        with db.transaction():
            store.register(registration("node-a"), T0)
            store.count_accepted("node-a")
            assert other.get("node-a") is None  # not committed yet
        assert other.get("node-a") == StoredNode(registration("node-a"), T0, 1)
        store.close()  # a store on a shared database leaves it open
        assert PostgresNodeStore(db).get("node-a") == StoredNode(registration("node-a"), T0, 1)
    finally:
        other.close()
        db.close()


def test_postgres_refuses_a_newer_node_schema_naming_the_database(postgres_url: str) -> None:
    db = PostgresDatabase(postgres_url)
    try:
        PostgresNodeStore(db).register(registration(), T0)
        db.execute("UPDATE node_meta SET value = '2' WHERE key = 'schema_version'")
        with pytest.raises(RuntimeError, match=r"PostgreSQL database '\w+' at [\d.]+:\d+: node schema version '2'"):
            PostgresNodeStore(db)
        # the refusal wrote nothing and left its owner's database usable
        assert db.fetchall("SELECT value FROM node_meta") == [("2",)]
        assert db.fetchone("SELECT COUNT(*) FROM nodes") == (1,)
    finally:
        db.close()
