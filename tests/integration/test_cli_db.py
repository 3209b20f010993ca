"""``flashruntime db check`` and ``flashruntime db upgrade`` on real databases.

SQLite: a new data directory (empty, and check creates nothing), one made current by
upgrade, a lease table of schema 2 (check exits 1 and changes no byte; upgrade migrates
it and keeps every task), a migration that fails (every store is left as it was), an
older data directory whose ``leases.db`` waits to be imported, a store newer than this
release (refused, naming the store and both versions), and bad URLs. PostgreSQL: an
empty database, upgraded, then current.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from flashruntime.cli.dispatch import main
from flashruntime.coordinator.settings import RuntimeSettings
from flashruntime.coordinator.state import open_state
from flashruntime.leases import LeaseManager, SqliteLeaseStore
from flashruntime.protocol.v1alpha1 import TaskSpec

T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)
SHA = "ab" * 32


@pytest.fixture(autouse=True)
def no_database_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("FLASHML_DATABASE_URL", "FLASHML_LEDGER_PATH", "FLASHML_LOCAL_ARTIFACTS_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


def db(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``flashruntime db ARGV`` in this process: (exit code, stdout, stderr)."""
    code = main(["db", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def settings(data: Path) -> RuntimeSettings:
    return RuntimeSettings(ledger_path=str(data / "flashruntime.db"), artifacts_dir=str(data / "artifacts"))


def spec(task_id: str) -> TaskSpec:
    return TaskSpec(task_id=task_id, job_id="job", commit_key=f"job/{task_id}", payload={"n": task_id})


def records(store: Any) -> list[tuple[object, ...]]:
    """What each task record holds, in queue order."""
    return [(r.spec, r.seq, r.state, r.attempts_used, r.releases_seen, r.active_lease, r.accepted_attempt_id,
             r.accepted_output_sha256, list(r.lease_history.items())) for r in store.all()]


def current_database(data: Path, tasks: int = 0) -> list[tuple[object, ...]]:
    """A database as this release writes it, holding ``tasks`` tasks (the first completed);
    → what every task record holds."""
    state = open_state(settings(data))
    try:
        manager = LeaseManager(state.leases)
        for index in range(tasks):
            manager.add_task(spec(f"task-{index}"), now=T0)
        if tasks:
            lease = manager.claim("node-a", now=T0)
            assert lease is not None and manager.complete(lease.lease_id, SHA, now=T0)
        return records(state.leases)
    finally:
        state.close()


def execute(path: Path, *statements: str) -> None:
    conn = sqlite3.connect(path)
    try:
        with conn:
            for statement in statements:
                conn.execute(statement)
    finally:
        conn.close()


def query(path: Path, statement: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(statement).fetchall()
    finally:
        conn.close()


def digests(data: Path) -> dict[str, str]:
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(data.iterdir())}


LEASES_TO_SCHEMA_2 = ("ALTER TABLE lease_tasks DROP COLUMN releases_seen",
                      "UPDATE lease_meta SET value = '2' WHERE key = 'schema_version'")


# --- SQLite ---------------------------------------------------------------------------


def test_a_new_data_directory_is_empty_and_check_creates_nothing(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = db(capsys, "check", "--data-dir", str(tmp_path / "data"))
    assert code == 0, err
    assert out.splitlines()[0] == f"database  {tmp_path / 'data' / 'flashruntime.db'}"
    assert "ledger       -  no tables yet" in out and out.rstrip().endswith("empty: serve or db upgrade creates the tables")
    assert not (tmp_path / "data").exists()
    code, out, _ = db(capsys, "check", "--data-dir", str(tmp_path / "data"), "--json")
    assert code == 0 and json.loads(out)["status"] == "empty"


def test_upgrade_creates_every_store_and_check_then_finds_them_current(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    data = str(tmp_path / "data")
    code, out, err = db(capsys, "upgrade", "--data-dir", data)
    assert code == 0, err
    assert out.splitlines()[1:] == ["ledger       - -> 2  created", "leases       - -> 3  created",
                                    "checkpoints  - -> 1  created", "nodes        - -> 1  created",
                                    "upgraded: the database is current"]
    code, out, err = db(capsys, "check", "--data-dir", data)
    assert code == 0, err
    assert out.splitlines()[1:] == ["ledger       2  current", "leases       3  current",
                                    "checkpoints  1  current", "nodes        1  current", "current"]
    code, out, _ = db(capsys, "upgrade", "--data-dir", data, "--json")
    done = json.loads(out)
    assert code == 0 and done["status"] == "current" and done["imported"] == {}
    assert {store["change"] for store in done["stores"]} == {"unchanged"}


def test_a_schema_2_lease_table_needs_upgrade_and_upgrade_keeps_every_task(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    before = current_database(data, tasks=3)
    execute(data / "flashruntime.db", *LEASES_TO_SCHEMA_2)
    untouched = digests(data)

    code, out, err = db(capsys, "check", "--data-dir", str(data))
    assert code == 1, err
    assert "leases       2  needs upgrade to 3" in out and "ledger       2  current" in out
    assert "needs upgrade: stop the coordinator, back the database up, then run flashruntime db upgrade" in out
    code, out, _ = db(capsys, "check", "--data-dir", str(data), "--json")
    report = json.loads(out)
    assert code == 1 and report["status"] == "needs upgrade"
    assert report["stores"][1] == {"store": "leases", "version": "2", "reads": "3", "status": "needs upgrade"}
    assert digests(data) == untouched  # check changed no byte of the database

    code, out, err = db(capsys, "upgrade", "--data-dir", str(data))
    assert code == 0, err
    assert "leases       2 -> 3  upgraded" in out and "ledger       2 -> 2  unchanged" in out
    state = open_state(settings(data))
    try:
        assert records(state.leases) == before
    finally:
        state.close()
    assert db(capsys, "check", "--data-dir", str(data))[0] == 0


def test_a_migration_that_fails_leaves_every_store_as_it_was(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """The ledger (recorded as version 1) and a missing node store would be brought up to date
    before the lease store's migration fails: all three are in one transaction, so none is."""
    data = tmp_path / "data"
    current_database(data, tasks=2)
    path = data / "flashruntime.db"
    # Schema 2 by its version, yet already holding the column its migration adds: ALTER TABLE fails.
    execute(path, "UPDATE lease_meta SET value = '2' WHERE key = 'schema_version'", "DROP TABLE nodes",
            "DROP TABLE node_meta", "PRAGMA user_version = 1")
    code, out, err = db(capsys, "upgrade", "--data-dir", str(data))
    assert code == 2 and out == ""
    assert f"flashruntime db upgrade: the upgrade of sqlite://{path} failed:" in err
    assert "duplicate column name: releases_seen" in err and "the step that failed changed nothing" in err
    assert query(path, "PRAGMA user_version") == [(1,)]
    assert query(path, "SELECT value FROM lease_meta") == [("2",)]
    assert query(path, "SELECT name FROM sqlite_master WHERE name LIKE 'node%'") == []
    code, out, _ = db(capsys, "check", "--data-dir", str(data))
    assert code == 1 and "ledger       1  needs upgrade to 2" in out and "nodes        -  no tables yet: db upgrade " \
                                                                             "creates them" in out


def test_an_older_data_directory_waits_for_its_leases_db_to_be_imported(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    old = SqliteLeaseStore(data / "leases.db")
    try:
        manager = LeaseManager(old)
        for index in range(2):
            manager.add_task(spec(f"task-{index}"), now=T0)
        expected = records(old)
    finally:
        old.close()
    from flashruntime.coordinator.ledger import Ledger

    Ledger(data / "flashruntime.db").close()  # the ledger's own file, as that layout had it

    code, out, err = db(capsys, "check", "--data-dir", str(data))
    assert code == 1, err
    assert "leases       -  no tables yet: db upgrade creates them" in out
    assert "leases.db    3  waits to be imported: db upgrade copies it into the database" in out
    assert (data / "leases.db").is_file()

    code, out, err = db(capsys, "upgrade", "--data-dir", str(data))
    assert code == 0, err
    assert "leases       - -> 3  created" in out
    assert re.search(r"^leases\.db +imported 2 rows; the file is kept as leases\.db\.imported$", out, re.MULTILINE)
    assert not (data / "leases.db").exists() and (data / "leases.db.imported").is_file()
    state = open_state(settings(data))
    try:
        assert records(state.leases) == expected
    finally:
        state.close()
    assert db(capsys, "check", "--data-dir", str(data))[0] == 0


@pytest.mark.parametrize(("statement", "message"), [
    ("UPDATE node_meta SET value = '2'", "the nodes schema version 2 in {path} is newer than the 1 this flashruntime reads"),
    ("PRAGMA user_version = 7", "the ledger schema version 7 in {path} is newer than the 2 this flashruntime reads"),
])
def test_a_newer_store_is_refused_naming_it_and_both_versions(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             statement: str, message: str) -> None:
    data = tmp_path / "data"
    current_database(data)
    path = data / "flashruntime.db"
    execute(path, statement)
    untouched = digests(data)
    code, out, err = db(capsys, "check", "--data-dir", str(data))
    assert code == 2 and "newer than the" in out
    assert f"flashruntime db check: {message.format(path=path)}" in err
    code, _, err = db(capsys, "upgrade", "--data-dir", str(data))
    assert code == 2 and f"flashruntime db upgrade: nothing changed: {message.format(path=path)}" in err
    assert digests(data) == untouched


@pytest.mark.parametrize("what", ["text", "directory"])
def test_a_path_that_is_not_a_database_cannot_be_read(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      what: str) -> None:
    path = tmp_path / "data" / "flashruntime.db"
    if what == "text":
        path.parent.mkdir()
        path.write_text("not a database " * 100)
    else:
        path.mkdir(parents=True)
    code, _, err = db(capsys, "check", "--data-dir", str(tmp_path / "data"))
    assert code == 2 and f"flashruntime db check: cannot read the database sqlite://{path}: " in err
    assert ("file is not a database" if what == "text" else "not a SQLite file (a directory?)") in err


@pytest.mark.parametrize("action", ["check", "upgrade"])
def test_a_bad_database_url_exits_2_as_serve_does(capsys: pytest.CaptureFixture[str], action: str) -> None:
    code, _, err = db(capsys, action, "--database-url", "mysql://fr:s3cret@db/fr")
    assert code == 2 and "s3cret" not in err
    assert err.startswith(f"flashruntime db {action}: --database-url has the scheme 'mysql://', which is not a "
                          "database this coordinator opens")


# --- PostgreSQL -----------------------------------------------------------------------


def test_an_unreachable_server_exits_2_without_the_password(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("psycopg")
    from tests.service_server import free_port

    port = free_port()  # nothing listens there
    code, _, err = db(capsys, "check", "--database-url", f"postgresql://fr:s3cret@127.0.0.1:{port}/fr")
    assert code == 2 and "s3cret" not in err
    assert f"flashruntime db check: cannot use the database postgresql://fr:***@127.0.0.1:{port}/fr: " in err


def test_postgres_empty_then_upgraded_then_current(postgres_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = db(capsys, "check", "--database-url", postgres_url)
    assert code == 0, err
    assert out.splitlines()[0] == f"database  {postgres_url}"  # no password in it to mask
    assert out.rstrip().endswith("empty: serve or db upgrade creates the tables")
    code, out, err = db(capsys, "upgrade", "--database-url", postgres_url)
    assert code == 0, err
    assert out.splitlines()[1:] == ["ledger       - -> 1  created", "leases       - -> 1  created",
                                    "checkpoints  - -> 1  created", "nodes        - -> 1  created",
                                    "upgraded: the database is current"]
    code, out, err = db(capsys, "check", "--database-url", postgres_url, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["kind"] == "postgresql" and report["status"] == "current"
    assert [store["version"] for store in report["stores"]] == ["1", "1", "1", "1"]
