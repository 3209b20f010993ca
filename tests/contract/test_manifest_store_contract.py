"""One contract for every ``ManifestStore``, run against the in-memory
store, SQLite in memory, a SQLite file and PostgreSQL (an empty database of the session's
cluster); the part registry and reopening for the stores that offer them."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from flashruntime.checkpoint import CheckpointCatalog, InMemoryManifestStore, ManifestStore, SqliteManifestStore
from flashruntime.checkpoint.postgres_store import PostgresManifestStore
from flashruntime.protocol.v1alpha1 import CheckpointManifest, CheckpointPart, CheckpointValidation

StoreFactory = Callable[[], ManifestStore]


def manifest(manifest_id: str, job_id: str = "job", step: int = 1, **kwargs: object) -> CheckpointManifest:
    return CheckpointManifest(
        manifest_id=manifest_id,
        job_id=job_id,
        attempt_id="a0",
        step=step,
        storage_prefix=f"/ckpt/{job_id}/{step}",
        parts=[CheckpointPart(key="model.pt", sha256="c" * 64, size_bytes=3)],
        validation=CheckpointValidation.HASH_VERIFIED,
        created=datetime(2026, 1, 1, 12, 0, step % 60, tzinfo=timezone.utc),
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.fixture(params=["memory", "sqlite-memory", "sqlite-file", "postgres"])
def kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def factory(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[StoreFactory]:
    opened: list[SqliteManifestStore | PostgresManifestStore] = []
    # Only the postgres kind asks for a database, so the other kinds never start the cluster.
    url = request.getfixturevalue("postgres_url") if kind == "postgres" else None

    def make() -> ManifestStore:
        if kind == "memory":
            return InMemoryManifestStore()
        store: SqliteManifestStore | PostgresManifestStore
        if url is not None:
            store = PostgresManifestStore(url)
        else:
            store = SqliteManifestStore(":memory:" if kind == "sqlite-memory" else tmp_path / "data" / "manifests.db")
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


@pytest.fixture
def store(factory: StoreFactory) -> ManifestStore:
    return factory()


# --- the protocol -------------------------------------------------------------------


def test_is_a_manifest_store(store: ManifestStore) -> None:
    assert isinstance(store, ManifestStore)


def test_add_get_and_unknown(store: ManifestStore) -> None:
    m = manifest("ck-1", world_size=2, compatible_world_sizes=[2, 4], checkpoint_duration_s=0.25, framework="pt")
    store.add(m)
    assert store.get("ck-1") == m
    assert store.get("ck-missing") is None


def test_duplicate_add_is_a_value_error(store: ManifestStore) -> None:
    store.add(manifest("ck-1"))
    with pytest.raises(ValueError, match="ck-1"):
        store.add(manifest("ck-1", step=2))
    assert store.get("ck-1").step == 1
    assert len(store.all()) == 1


def test_all_in_insertion_order_and_scope_filter(store: ManifestStore) -> None:
    for mid, job, step in [
        ("ck-c", "job-a", 30),
        ("ck-a", "job-b", 10),
        ("ck-b", "job-a", 20),
        ("ck-d", "job-a::task-1", 5),
    ]:
        store.add(manifest(mid, job, step))
    assert [m.manifest_id for m in store.all()] == ["ck-c", "ck-a", "ck-b", "ck-d"]
    assert [m.manifest_id for m in store.all("job-a")] == ["ck-c", "ck-b"]
    assert [m.manifest_id for m in store.all(scope="job-a::task-1")] == ["ck-d"]
    assert store.all("nobody") == []


def test_save_updates_in_place_and_keeps_order(store: ManifestStore) -> None:
    store.add(manifest("ck-1"))
    store.add(manifest("ck-2"))
    updated = store.get("ck-1").model_copy(update={"validation": CheckpointValidation.RESTORE_VERIFIED})
    store.save(updated)
    assert store.get("ck-1").validation == CheckpointValidation.RESTORE_VERIFIED
    assert [m.manifest_id for m in store.all()] == ["ck-1", "ck-2"]


def test_save_of_an_unknown_manifest_inserts_it(store: ManifestStore) -> None:
    store.add(manifest("ck-1"))
    store.save(manifest("ck-2"))
    assert [m.manifest_id for m in store.all()] == ["ck-1", "ck-2"]


def test_returned_manifests_are_copies(store: ManifestStore) -> None:
    original = manifest("ck-1")
    store.add(original)
    original.step = 99
    fetched = store.get("ck-1")
    assert fetched.step == 1
    fetched.parts.append(CheckpointPart(key="x", sha256="d" * 64, size_bytes=1))
    store.all()[0].compatible_world_sizes.append(7)
    assert store.get("ck-1").parts == manifest("ck-1").parts
    assert store.get("ck-1").compatible_world_sizes == []


def test_catalog_runs_on_the_store(store: ManifestStore) -> None:
    catalog = CheckpointCatalog(store=store)
    part = CheckpointPart(key="model.pt", sha256="e" * 64, size_bytes=1)
    catalog.register_part("job::task-0", "a0", 3, part)
    committed = catalog.commit(job_id="job::task-0", attempt_id="a0", step=3, expected_parts=[part], storage_prefix="p")
    assert store.get(committed.manifest_id) == committed
    assert catalog.latest_valid("job::task-0").manifest_id == committed.manifest_id


def test_concurrent_adds_from_threads(store: ManifestStore) -> None:
    def worker(index: int) -> None:
        for n in range(25):
            store.add(manifest(f"ck-{index}-{n}", f"job-{index}", n))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(store.all()) == 100
    for index in range(4):
        assert [m.step for m in store.all(f"job-{index}")] == list(range(25))


# --- the part registry (optional) ------------------------------------------------------


def _has_parts(store: ManifestStore) -> bool:
    return callable(getattr(store, "put_part", None)) and callable(getattr(store, "parts", None))


def test_which_stores_keep_parts(kind: str, store: ManifestStore) -> None:
    assert _has_parts(store) is (kind != "memory")


@pytest.mark.parametrize("where", ["sqlite-memory", "sqlite-file", "postgres"])
def test_part_registry(where: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    # InMemoryManifestStore has no part registry: its catalog keeps pending parts in memory.
    registry: SqliteManifestStore | PostgresManifestStore
    if where == "postgres":
        registry = PostgresManifestStore(request.getfixturevalue("postgres_url"))
    else:
        registry = SqliteManifestStore(":memory:" if where == "sqlite-memory" else tmp_path / "parts.db")
    assert registry.parts("job", "a0", 1) == {}
    registry.put_part("job", "a0", 1, CheckpointPart(key="model.pt", sha256="1" * 64, size_bytes=10))
    registry.put_part("job", "a0", 1, CheckpointPart(key="opt.pt", sha256="2" * 64, size_bytes=20))
    registry.put_part("job", "a0", 1, CheckpointPart(key="model.pt", sha256="3" * 64, size_bytes=30))  # last wins
    registry.put_part("job", "a1", 1, CheckpointPart(key="model.pt", sha256="4" * 64, size_bytes=40))
    registry.put_part("job", "a0", 2, CheckpointPart(key="model.pt", sha256="5" * 64, size_bytes=50))
    assert registry.parts("job", "a0", 1) == {"model.pt": ("3" * 64, 30), "opt.pt": ("2" * 64, 20)}
    assert registry.parts("job", "a1", 1) == {"model.pt": ("4" * 64, 40)}
    assert registry.parts("job", "a0", 2) == {"model.pt": ("5" * 64, 50)}
    assert registry.parts("other", "a0", 1) == {}
    registry.close()


# --- SQLite: reopening from disk, schema -------------------------------------------------


def _reopener(where: str, tmp_path: Path, request: pytest.FixtureRequest) -> Callable[[], Any]:
    """A function opening a fresh store on the same file or database each time it is called."""
    if where == "postgres":
        url = request.getfixturevalue("postgres_url")
        return lambda: PostgresManifestStore(url)
    path = tmp_path / "state" / "checkpoints.db"
    return lambda: SqliteManifestStore(path)


@pytest.mark.parametrize("where", ["sqlite-file", "postgres"])
def test_reopen_keeps_manifests_parts_and_order(where: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    reopen = _reopener(where, tmp_path, request)
    first = reopen()
    catalog = CheckpointCatalog(store=first)
    part = CheckpointPart(key="model.pt", sha256="f" * 64, size_bytes=9)
    catalog.register_part("job::t0", "a0", 7, part)  # registered, not yet committed
    first.add(manifest("ck-b", "job::t0", 5))
    first.add(manifest("ck-a", "job::t0", 6))
    first.save(first.get("ck-b").model_copy(update={"validation": CheckpointValidation.RESTORE_VERIFIED}))
    first.close()

    second = reopen()
    assert [m.manifest_id for m in second.all()] == ["ck-b", "ck-a"]
    assert second.get("ck-b").validation == CheckpointValidation.RESTORE_VERIFIED
    assert second.get("ck-a") == manifest("ck-a", "job::t0", 6)
    resumed = CheckpointCatalog(store=second)
    committed = resumed.commit(job_id="job::t0", attempt_id="a0", step=7, expected_parts=[part], storage_prefix="p")
    second.add(manifest("ck-c", "job::t0", 8))
    assert [m.manifest_id for m in second.all()] == ["ck-b", "ck-a", committed.manifest_id, "ck-c"]
    second.close()

    third = reopen()
    assert CheckpointCatalog(store=third).latest_valid("job::t0").manifest_id == "ck-c"
    third.close()


@pytest.mark.parametrize("where", ["sqlite-file", "postgres"])
def test_two_stores_share_one_file(where: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    reopen = _reopener(where, tmp_path, request)
    stores = [reopen(), reopen()]

    def worker(index: int) -> None:
        for n in range(20):
            stores[index].add(manifest(f"ck-{index}-{n}", f"job-{index}", n))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(stores[0].all()) == len(stores[1].all()) == 40
    with pytest.raises(ValueError):
        stores[1].add(manifest("ck-0-0"))
    for store in stores:
        store.close()


def test_schema_and_pragmas(tmp_path: Path) -> None:
    path = tmp_path / "schema.db"
    store = SqliteManifestStore(path, busy_timeout_ms=1234)
    store.add(manifest("ck-1"))
    con = sqlite3.connect(path)
    try:
        columns = {row[1]: row for row in con.execute("PRAGMA table_info(checkpoint_manifests)")}
        assert list(columns) == ["manifest_id", "scope", "seq", "manifest_json"]
        assert columns["manifest_id"][5] == 1  # primary key
        assert columns["scope"][3] == columns["seq"][3] == columns["manifest_json"][3] == 1  # NOT NULL
        part_columns = [row[1] for row in con.execute("PRAGMA table_info(checkpoint_parts)")]
        assert part_columns == ["job_id", "attempt_id", "step", "key", "sha256", "size_bytes"]
        pk = sorted((row[5], row[1]) for row in con.execute("PRAGMA table_info(checkpoint_parts)") if row[5])
        assert [name for _, name in pk] == ["job_id", "attempt_id", "step", "key"]
        indexes = {row[1]: row for row in con.execute("PRAGMA index_list(checkpoint_manifests)")}
        scope_seq = [
            name for name in indexes if [c[2] for c in con.execute(f"PRAGMA index_info({name})")] == ["scope", "seq"]
        ]
        assert scope_seq
        assert any(
            row[2] == 1 and [c[2] for c in con.execute(f"PRAGMA index_info({row[1]})")] == ["seq"]
            for row in indexes.values()
        )  # seq UNIQUE
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert con.execute("SELECT value FROM checkpoint_meta WHERE key='schema_version'").fetchone()[0] == "1"
        plan = " ".join(
            str(row[3])
            for row in con.execute(
                "EXPLAIN QUERY PLAN SELECT manifest_json FROM checkpoint_manifests WHERE scope = ? ORDER BY seq", ("x",)
            )
        )
        assert "USING INDEX" in plan or "USING COVERING INDEX" in plan
    finally:
        con.close()
    assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert store._conn.execute("PRAGMA busy_timeout").fetchone()[0] == 1234
    store.close()


def test_postgres_refuses_another_checkpoint_schema_naming_the_database(postgres_url: str) -> None:
    store = PostgresManifestStore(postgres_url)
    store.add(manifest("ck-1"))
    store.database.execute("UPDATE checkpoint_meta SET value = '2' WHERE key = 'schema_version'")
    with pytest.raises(RuntimeError, match=r"PostgreSQL database '\w+' at [\d.]+:\d+: checkpoint schema version '2'"):
        PostgresManifestStore(postgres_url)
    store.database.execute("UPDATE checkpoint_meta SET value = '1' WHERE key = 'schema_version'")
    assert PostgresManifestStore(store.database).all() == [manifest("ck-1")]
    store.close()
