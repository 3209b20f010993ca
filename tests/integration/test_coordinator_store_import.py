"""A data directory of the layout with one SQLite file per store (``leases.db``,
``checkpoints.db`` beside the ledger's ``flashruntime.db``) joins the coordinator's one
database when ``open_state`` opens it: every task, lease history row, cordon, manifest
and registered part is copied and reads back equal through the stores, the old files
are kept as ``<name>.imported`` (with their WAL sidecars), nothing is imported twice
(not even when a start stopped between the copy and the rename), a database with rows of
its own refuses to merge, a schema-2 lease file is upgraded before it is copied and a
newer one is refused."""

from __future__ import annotations

import hashlib
import logging
import re
import sqlite3
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from flashruntime.checkpoint import CheckpointCatalog, SqliteManifestStore
from flashruntime.coordinator.ledger import Ledger
from flashruntime.coordinator.settings import RuntimeSettings
from flashruntime.coordinator.state import CoordinatorState, open_state
from flashruntime.coordinator.store_files import import_store_files
from flashruntime.leases import LeaseManager, SqliteLeaseStore, TaskRecord
from flashruntime.protocol.v1alpha1 import (
    CheckpointManifest,
    CheckpointPart,
    JobRecord,
    JobSpec,
    TaskSpec,
    TaskState,
)

T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)
SHA = "cd" * 32
SCOPE = "job-old::task-0"
LEASE_TABLES = ("lease_tasks", "lease_history", "lease_cordons")
CHECKPOINT_TABLES = ("checkpoint_manifests", "checkpoint_parts")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def spec(task_id: str, job_id: str = "job-old") -> TaskSpec:
    return TaskSpec(task_id=task_id, job_id=job_id, commit_key=f"{job_id}/{task_id}", payload={"n": task_id})


def job_record(job_id: str = "job-old") -> JobRecord:
    return JobRecord(job_id=job_id, backend="leases", created_at=T0, spec=JobSpec.model_validate({
        "metadata": {"name": "sweep"},
        "spec": {"execution": {"backend": "leases"}, "image": {"repository": "python", "tag": "3.11"},
                 "workload": {"type": "hyperparameter_search", "parameters": {}}}}))


def settings(data_dir: Path) -> RuntimeSettings:
    return RuntimeSettings(ledger_path=str(data_dir / "flashruntime.db"), artifacts_dir=str(data_dir / "artifacts"))


def records(store: Any) -> list[tuple[object, ...]]:
    """Everything a ``TaskRecord`` holds, lease history in order, for every task in queue order."""

    def fields(r: TaskRecord) -> tuple[object, ...]:
        return (r.spec, r.seq, r.state, r.attempts_used, r.failures_seen, r.expiries_seen, r.releases_seen,
                r.active_lease, r.accepted_attempt_id, r.accepted_output_sha256, list(r.lease_history.items()))

    return [fields(r) for r in store.all()]


def rows(path: Path, tables: tuple[str, ...]) -> dict[str, list[tuple[object, ...]]]:
    conn = sqlite3.connect(path)
    try:
        return {table: conn.execute(f"SELECT * FROM {table} ORDER BY rowid").fetchall() for table in tables}
    finally:
        conn.close()


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class OldLeases:
    records: list[tuple[object, ...]]
    cordons: dict[str, tuple[datetime | None, str]]
    rows: dict[str, list[tuple[object, ...]]]
    held_lease_id: str


def write_old_leases(path: Path, job_id: str = "job-old") -> OldLeases:
    """Tasks in every state worth keeping: a claimed lease (renewed), a completed task, a
    failed-and-requeued one, one released and claimed again, and two cordons."""
    store = SqliteLeaseStore(path)
    try:
        manager = LeaseManager(store)
        with store.transaction():
            for index in range(4):
                manager.add_task(spec(f"task-{index}", job_id), now=at(0))
            manager.add_task(spec("task-0", "job-other"), now=at(0))
        released = manager.claim("node-a", now=at(1))
        assert released is not None and released.task_id == "task-0"
        manager.release(released.lease_id, "worker stopping", now=at(2))
        held = manager.claim("node-a", now=at(3))
        assert held is not None and held.task_id == "task-0" and held.attempt_number == 2
        manager.heartbeat(held.lease_id, now=at(10))
        done = manager.claim("node-b", now=at(4))
        assert done is not None and done.task_id == "task-1"
        assert manager.complete(done.lease_id, SHA, now=at(5)) is True
        failed = manager.claim("node-b", now=at(6))
        assert failed is not None and failed.task_id == "task-2"
        manager.fail(failed.lease_id, "out of memory", now=at(7))
        manager.cordon("node-c", until=at(3600), reason="disk errors", now=at(8))
        manager.cordon("node-d", reason="maintenance", now=at(8))
        old = OldLeases(records(store), store.cordons(), {}, held.lease_id)
    finally:
        store.close()
    old.rows = rows(path, LEASE_TABLES)
    assert [len(old.rows[table]) for table in LEASE_TABLES] == [5, 4, 2]
    assert {r[2] for r in old.records} == {TaskState.LEASED, TaskState.COMPLETED, TaskState.PENDING}
    return old


@dataclass
class OldCheckpoints:
    manifests: list[CheckpointManifest]
    parts: dict[tuple[str, str, int], dict[str, tuple[str, int]]]
    rows: dict[str, list[tuple[object, ...]]]


def write_old_checkpoints(path: Path) -> OldCheckpoints:
    """Two committed manifests (one restore-verified) and the parts of a step not committed yet."""
    store = SqliteManifestStore(path)
    try:
        catalog = CheckpointCatalog(store=store)
        for step in (10, 20):
            part = CheckpointPart(key="model.pt", sha256=f"{step:064x}", size_bytes=step * 1000)
            catalog.register_part(SCOPE, "a0", step, part)
            manifest = catalog.commit(job_id=SCOPE, attempt_id="a0", step=step, expected_parts=[part],
                                      storage_prefix=f"/ckpt/{step}", world_size=2, compatible_world_sizes=[4])
            if step == 10:
                catalog.mark_restore_verified(manifest.manifest_id)
        catalog.register_part(SCOPE, "a0", 30, CheckpointPart(key="model.pt", sha256="3" * 64, size_bytes=30))
        catalog.register_part(SCOPE, "a0", 30, CheckpointPart(key="optim.pt", sha256="4" * 64, size_bytes=31))
        keys = [(SCOPE, "a0", step) for step in (10, 20, 30)]
        old = OldCheckpoints(store.all(), {key: store.parts(*key) for key in keys}, {})
    finally:
        store.close()
    old.rows = rows(path, CHECKPOINT_TABLES)
    assert len(old.manifests) == 2 and len(old.parts[(SCOPE, "a0", 30)]) == 2
    return old


def write_old_ledger(path: Path) -> None:
    ledger = Ledger(path)
    try:
        ledger.upsert_job(job_record())
    finally:
        ledger.close()


def assert_holds(state: CoordinatorState, leases: OldLeases, checkpoints: OldCheckpoints) -> None:
    assert records(state.leases) == leases.records
    assert state.leases.cordons() == leases.cordons
    assert state.manifests.all() == checkpoints.manifests
    for manifest in checkpoints.manifests:
        assert state.manifests.get(manifest.manifest_id) == manifest
    assert {key: state.manifests.parts(*key) for key in checkpoints.parts} == checkpoints.parts
    assert state.ledger.get_job("job-old") == job_record()


def test_an_old_data_directory_is_imported_into_the_one_database(tmp_path: Path) -> None:
    leases = write_old_leases(tmp_path / "leases.db")
    checkpoints = write_old_checkpoints(tmp_path / "checkpoints.db")
    write_old_ledger(tmp_path / "flashruntime.db")

    state = open_state(settings(tmp_path))
    try:
        assert_holds(state, leases, checkpoints)
        # the imported state works: the held lease is live and renewable, the queue goes on after it,
        # the cordons hold
        manager = LeaseManager(state.leases)
        assert manager.heartbeat(leases.held_lease_id, now=at(20)).deadline == at(80)
        manager.add_task(spec("task-new"), now=at(21))
        new = state.leases.get("job-old", "task-new")
        assert new is not None and new.seq == 6
        assert manager.claim("node-d", now=at(22)) is None
        assert manager.claim("node-c", now=at(23)) is None
        claimed = manager.claim("node-e", now=at(24))
        assert claimed is not None and claimed.task_id == "task-2" and claimed.attempt_number == 2
    finally:
        state.close()

    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("leases", "checkpoints"))) == [
        "checkpoints.db.imported", "leases.db.imported"]
    # the one database holds every row of both files, as they were
    merged = rows(tmp_path / "flashruntime.db", LEASE_TABLES + CHECKPOINT_TABLES)
    assert {t: merged[t] for t in CHECKPOINT_TABLES} == checkpoints.rows
    assert merged["lease_history"][:4] == leases.rows["lease_history"]
    assert merged["lease_cordons"] == leases.rows["lease_cordons"]
    assert len(merged["lease_tasks"]) == 6
    # and the files set aside are unchanged
    assert rows(tmp_path / "leases.db.imported", LEASE_TABLES) == leases.rows
    assert rows(tmp_path / "checkpoints.db.imported", CHECKPOINT_TABLES) == checkpoints.rows


def test_the_wal_files_beside_an_old_file_move_with_it(tmp_path: Path) -> None:
    """A connection still open on each old file keeps its ``-wal``/``-shm`` on disk (and the
    last writes only in the WAL); they are renamed with the file, and nothing is lost."""
    held = {name: sqlite3.connect(tmp_path / name) for name in ("leases.db", "checkpoints.db")}
    try:
        leases = write_old_leases(tmp_path / "leases.db")
        checkpoints = write_old_checkpoints(tmp_path / "checkpoints.db")
        for conn in held.values():
            conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        for name in held:
            assert (tmp_path / f"{name}-wal").is_file() and (tmp_path / f"{name}-shm").is_file()
        write_old_ledger(tmp_path / "flashruntime.db")

        state = open_state(settings(tmp_path))
        try:
            assert_holds(state, leases, checkpoints)
        finally:
            state.close()
        for name in held:
            assert not (tmp_path / name).exists()
            assert not (tmp_path / f"{name}-wal").exists() and not (tmp_path / f"{name}-shm").exists()
            assert (tmp_path / f"{name}.imported").is_file()
            assert (tmp_path / f"{name}.imported-wal").is_file() and (tmp_path / f"{name}.imported-shm").is_file()
    finally:
        for conn in held.values():
            conn.close()
    assert rows(tmp_path / "leases.db.imported", LEASE_TABLES) == leases.rows
    assert rows(tmp_path / "checkpoints.db.imported", CHECKPOINT_TABLES) == checkpoints.rows


def test_opening_again_imports_nothing_twice_and_leaves_a_new_stray_file_alone(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    leases = write_old_leases(tmp_path / "leases.db")
    checkpoints = write_old_checkpoints(tmp_path / "checkpoints.db")
    write_old_ledger(tmp_path / "flashruntime.db")
    open_state(settings(tmp_path)).close()
    imported = digest(tmp_path / "leases.db.imported")

    state = open_state(settings(tmp_path))
    try:
        assert_holds(state, leases, checkpoints)
        files = {"leases.db": tmp_path / "leases.db", "checkpoints.db": tmp_path / "checkpoints.db"}
        assert import_store_files(state.database, files) == {}  # nothing left to import
    finally:
        state.close()

    stray = write_old_leases(tmp_path / "leases.db", job_id="job-stray")
    stray_digest = digest(tmp_path / "leases.db")
    with caplog.at_level(logging.WARNING, logger="flashruntime.service"):
        state = open_state(settings(tmp_path))
    try:
        assert_holds(state, leases, checkpoints)  # the stray file was not read
        assert state.leases.all("job-stray") == []
        assert import_store_files(state.database, files) == {"leases.db": 0}
    finally:
        state.close()
    assert "is not read: move it away" in caplog.text
    assert (tmp_path / "leases.db").is_file() and digest(tmp_path / "leases.db") == stray_digest
    assert digest(tmp_path / "leases.db.imported") == imported
    assert rows(tmp_path / "leases.db", LEASE_TABLES) == stray.rows


def test_an_import_whose_rename_did_not_happen_is_finished_without_copying_again(tmp_path: Path) -> None:
    """The copy commits before the file is renamed: a start that stopped in between left the
    file in place, and the next start only sets it aside."""
    leases = write_old_leases(tmp_path / "leases.db")
    checkpoints = write_old_checkpoints(tmp_path / "checkpoints.db")
    write_old_ledger(tmp_path / "flashruntime.db")
    open_state(settings(tmp_path)).close()
    for name in ("leases.db", "checkpoints.db"):
        (tmp_path / f"{name}.imported").rename(tmp_path / name)  # as if the rename had never happened

    state = open_state(settings(tmp_path))
    try:
        assert_holds(state, leases, checkpoints)
    finally:
        state.close()
    for name in ("leases.db", "checkpoints.db"):
        assert not (tmp_path / name).exists() and (tmp_path / f"{name}.imported").is_file()
    merged = rows(tmp_path / "flashruntime.db", LEASE_TABLES + CHECKPOINT_TABLES)
    assert {t: merged[t] for t in LEASE_TABLES} == leases.rows
    assert {t: merged[t] for t in CHECKPOINT_TABLES} == checkpoints.rows


@pytest.mark.parametrize("name", ["leases.db", "checkpoints.db"])
def test_a_database_with_rows_of_its_own_refuses_to_merge_an_old_file(tmp_path: Path, name: str) -> None:
    state = open_state(settings(tmp_path))
    try:
        LeaseManager(state.leases).add_task(spec("own-task", "job-new"), now=at(0))
        CheckpointCatalog(store=state.manifests).register_part("job-new", "a0", 1, CheckpointPart(
            key="model.pt", sha256="9" * 64, size_bytes=9))
        own = (records(state.leases), state.manifests.parts("job-new", "a0", 1))
    finally:
        state.close()
    if name == "leases.db":
        write_old_leases(tmp_path / name)
    else:
        write_old_checkpoints(tmp_path / name)
    before = digest(tmp_path / name)

    with pytest.raises(RuntimeError) as refused:
        open_state(settings(tmp_path))
    message = str(refused.value)
    assert str(tmp_path / name) in message
    assert f"Move {name} out of {tmp_path}" in message
    assert "move flashruntime.db away" in message
    assert (tmp_path / name).is_file() and not (tmp_path / f"{name}.imported").exists()
    assert digest(tmp_path / name) == before

    (tmp_path / name).rename(tmp_path / "elsewhere.db")  # as the message says: then it opens on its own rows
    state = open_state(settings(tmp_path))
    try:
        assert (records(state.leases), state.manifests.parts("job-new", "a0", 1)) == own
        assert state.manifests.all() == [] and state.leases.all("job-old") == []
    finally:
        state.close()


def test_a_schema_2_lease_file_is_upgraded_then_imported(tmp_path: Path) -> None:
    path = tmp_path / "leases.db"
    store = SqliteLeaseStore(path)
    try:
        manager = LeaseManager(store)
        for index in range(3):
            manager.add_task(spec(f"task-{index}"), now=at(0))
        held = manager.claim("node-a", now=at(1))
        done = manager.claim("node-b", now=at(2))
        assert held is not None and done is not None
        manager.complete(done.lease_id, SHA, now=at(3))
        manager.cordon("node-c", reason="flaky", now=at(4))
        expected = records(store)
        cordons = store.cordons()
    finally:
        store.close()
    conn = sqlite3.connect(path)
    try:
        with conn:
            conn.execute("ALTER TABLE lease_tasks DROP COLUMN releases_seen")
            conn.execute("UPDATE lease_meta SET value = '2' WHERE key = 'schema_version'")
    finally:
        conn.close()

    state = open_state(settings(tmp_path))
    try:
        assert records(state.leases) == expected
        assert all(r.releases_seen == 0 for r in state.leases.all())
        assert state.leases.cordons() == cordons
        assert LeaseManager(state.leases).lease_is_live(held.lease_id, now=at(5))
    finally:
        state.close()
    assert not path.exists()
    upgraded = sqlite3.connect(tmp_path / "leases.db.imported")
    try:
        assert upgraded.execute("SELECT value FROM lease_meta WHERE key = 'schema_version'").fetchone() == ("3",)
        assert "releases_seen" in [row[1] for row in upgraded.execute("PRAGMA table_info(lease_tasks)")]
    finally:
        upgraded.close()


def test_a_lease_file_of_a_newer_schema_is_refused_before_anything_is_copied(tmp_path: Path) -> None:
    write_old_leases(tmp_path / "leases.db")
    conn = sqlite3.connect(tmp_path / "leases.db")
    try:
        with conn:
            conn.execute("UPDATE lease_meta SET value = '4' WHERE key = 'schema_version'")
    finally:
        conn.close()
    with pytest.raises(RuntimeError, match=re.escape(str(tmp_path / "leases.db")) + ".*'4'"):
        open_state(settings(tmp_path))
    assert (tmp_path / "leases.db").is_file() and not (tmp_path / "leases.db.imported").exists()
    assert rows(tmp_path / "flashruntime.db", LEASE_TABLES) == {table: [] for table in LEASE_TABLES}


def test_a_checkpoint_file_of_a_newer_schema_is_refused_before_anything_is_copied(tmp_path: Path) -> None:
    write_old_checkpoints(tmp_path / "checkpoints.db")
    conn = sqlite3.connect(tmp_path / "checkpoints.db")
    try:
        with conn:
            conn.execute("UPDATE checkpoint_meta SET value = '9' WHERE key = 'schema_version'")
    finally:
        conn.close()
    with pytest.raises(RuntimeError, match=re.escape(str(tmp_path / "checkpoints.db")) + ".*'9'"):
        open_state(settings(tmp_path))
    assert (tmp_path / "checkpoints.db").is_file() and not (tmp_path / "checkpoints.db.imported").exists()
    assert rows(tmp_path / "flashruntime.db", CHECKPOINT_TABLES) == {table: [] for table in CHECKPOINT_TABLES}


def test_a_private_in_memory_database_imports_nothing_from_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_old_leases(tmp_path / "leases.db")
    monkeypatch.chdir(tmp_path)
    state = open_state(RuntimeSettings(ledger_path=":memory:", artifacts_dir=str(tmp_path / "artifacts")))
    try:
        assert state.leases.all() == []
    finally:
        state.close()
    assert (tmp_path / "leases.db").is_file() and not (tmp_path / "leases.db.imported").exists()
