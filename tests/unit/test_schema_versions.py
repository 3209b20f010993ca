"""Schema versions: the rule that classifies a store's recorded version, and each SQLite
store's read-only reader on databases in memory (none yet, as written, and the older
forms a release migrates: a ledger before ``user_version``, lease tables without a
version). The PostgreSQL readers run against a server in tests/integration/test_cli_db.py."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flashruntime.checkpoint import sqlite_store as checkpoint_store
from flashruntime.coordinator import ledger_tables, sqlite_node_store
from flashruntime.coordinator.schema import (
    ABSENT,
    CURRENT,
    NEEDS_UPGRADE,
    NEWER,
    UNKNOWN,
    SchemaReport,
    StoreVersion,
    classify,
)
from flashruntime.database_url import sqlite_url
from flashruntime.leases import sqlite_store as lease_store
from flashruntime.sqlite_database import SqliteDatabase


@pytest.mark.parametrize(("stored", "reads", "upgrades", "expected"), [
    (None, "3", ("2",), ABSENT),
    ("3", "3", ("2",), CURRENT),
    ("2", "3", ("2",), NEEDS_UPGRADE),
    ("4", "3", ("2",), NEWER),
    ("10", "9", (), NEWER),  # compared as numbers, not as text
    ("1", "3", ("2",), UNKNOWN),  # older, but not one this release migrates
    ("x", "3", (), UNKNOWN),
])
def test_classify(stored: str | None, reads: str, upgrades: tuple[str, ...], expected: str) -> None:
    assert classify(stored, reads, upgrades) == expected


READERS: list[tuple[str, Callable[[Any], str | None], Callable[[SqliteDatabase], Any], str]] = [
    ("ledger", ledger_tables.stored_schema_version, lambda db: ledger_tables.SqliteLedgerTables(db, owns=False), "2"),
    ("leases", lease_store.stored_schema_version, lease_store.SqliteLeaseStore, "3"),
    ("checkpoints", checkpoint_store.stored_schema_version, checkpoint_store.SqliteManifestStore, "1"),
    ("nodes", sqlite_node_store.stored_schema_version, sqlite_node_store.SqliteNodeStore, "1"),
]


@pytest.mark.parametrize(("store", "read", "make", "version"), READERS, ids=[row[0] for row in READERS])
def test_each_sqlite_store_reads_the_version_it_records(store: str, read: Callable[[Any], str | None],
                                                        make: Callable[[SqliteDatabase], Any], version: str) -> None:
    db = SqliteDatabase(":memory:")
    try:
        assert read(db.connection) is None  # no tables yet
        make(db)
        assert read(db.connection) == version
        assert db.connection.in_transaction is False  # reading opened no transaction
    finally:
        db.close()


def test_older_forms_read_as_the_versions_this_release_upgrades() -> None:
    conn = sqlite3.connect(":memory:")
    try:
        conn.execute("CREATE TABLE jobs (job_id TEXT PRIMARY KEY)")  # a ledger from before user_version
        assert ledger_tables.stored_schema_version(conn) == "0"
        assert "0" in ledger_tables.SQLITE_UPGRADES_FROM
        conn.execute("CREATE TABLE lease_tasks (task_id TEXT PRIMARY KEY, lease_history_json TEXT)")
        assert lease_store.stored_schema_version(conn) == lease_store.UNVERSIONED
        assert classify(lease_store.UNVERSIONED, lease_store.SCHEMA_VERSION, lease_store.UPGRADES_FROM) == NEEDS_UPGRADE
    finally:
        conn.close()


def test_a_report_with_a_newer_store_names_it_and_both_versions() -> None:
    database = sqlite_url(Path("/srv/fr/flashruntime.db"))
    report = SchemaReport(database, (StoreVersion("ledger", "2", "2"), StoreVersion("nodes", "2", "1")))
    assert report.status == "unusable"
    [problem] = report.problems
    assert problem == ("the nodes schema version 2 in /srv/fr/flashruntime.db is newer than the 1 this flashruntime "
                       "reads: it was written by a later flashruntime; install that one (pip install -U flashruntime) "
                       "or restore a backup made before it")


def test_a_report_of_no_tables_is_empty_and_of_some_needs_upgrade() -> None:
    database = sqlite_url(Path("/srv/fr/flashruntime.db"))
    absent = [StoreVersion(name, None, "1") for name in ("ledger", "leases", "checkpoints", "nodes")]
    assert SchemaReport(database, tuple(absent)).status == "empty"
    partial = (StoreVersion("ledger", "1", "1"), *absent[1:])
    assert SchemaReport(database, partial).status == NEEDS_UPGRADE
