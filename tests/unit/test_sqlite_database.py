"""``SqliteDatabase``: one re-entrant transaction in which only the outermost level
commits and an exception reaching it rolls back everything inside, nested levels
included; ``after_commit`` callbacks that run once after that commit and never after a
rollback; another connection to the same file sees committed data only; the settings
it refuses and the files it creates."""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from flashruntime.errors import StoreError
from flashruntime.sqlite_database import SqliteDatabase


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "data" / "state.db"


@pytest.fixture
def db(path: Path) -> Iterator[SqliteDatabase]:
    database = SqliteDatabase(path)
    with database.transaction():
        database.connection.execute("CREATE TABLE items (name TEXT PRIMARY KEY)")
    yield database
    database.close()


@pytest.fixture
def other(path: Path, db: SqliteDatabase) -> Iterator[SqliteDatabase]:
    """A second connection to the same file, as another process would open it."""
    database = SqliteDatabase(path, busy_timeout_ms=50)
    yield database
    database.close()


def names(database: SqliteDatabase) -> list[str]:
    with database.lock:
        return [row[0] for row in database.connection.execute("SELECT name FROM items ORDER BY name")]


def insert(database: SqliteDatabase, name: str) -> None:
    database.connection.execute("INSERT INTO items (name) VALUES (?)", (name,))


# --- transactions ---------------------------------------------------------------------


def test_nested_transactions_commit_only_at_the_outermost(db: SqliteDatabase, other: SqliteDatabase) -> None:
    with db.transaction():
        insert(db, "outer")
        with db.transaction():
            insert(db, "inner")
            with db.transaction():
                insert(db, "innermost")
            assert db.connection.in_transaction
        assert names(other) == []  # the inner levels have ended, nothing is committed yet
        assert names(db) == ["inner", "innermost", "outer"]  # but this connection sees its own writes
    assert not db.connection.in_transaction
    assert names(other) == ["inner", "innermost", "outer"]


def test_transaction_is_the_same_object_at_every_level(db: SqliteDatabase) -> None:
    with db.transaction() as outer, db.transaction() as inner:
        assert inner is outer is db.transaction()


def test_an_exception_rolls_back_everything_inside_nested_levels_included(
        db: SqliteDatabase, other: SqliteDatabase) -> None:
    with db.transaction():
        insert(db, "before")
    with pytest.raises(KeyError), db.transaction():
        insert(db, "outer")
        with db.transaction():
            insert(db, "inner")
        with db.transaction():
            insert(db, "raising")
            raise KeyError("boom")
    assert names(db) == ["before"]
    assert names(other) == ["before"]
    assert not db.connection.in_transaction
    with db.transaction():  # and the next transaction starts afresh
        insert(db, "after")
    assert names(other) == ["after", "before"]


def test_an_exception_raised_at_the_outermost_level_rolls_back(db: SqliteDatabase) -> None:
    with pytest.raises(ValueError), db.transaction():
        insert(db, "gone")
        raise ValueError("refused")
    assert names(db) == []


def test_an_exception_caught_inside_the_outermost_level_undoes_nothing(
        db: SqliteDatabase, other: SqliteDatabase) -> None:
    """There are no savepoints: a nested level that ends with an exception its caller
    handles leaves its writes in the transaction, and the outermost commit keeps them."""
    with db.transaction():
        insert(db, "outer")
        try:
            with db.transaction():
                insert(db, "recorded-then-refused")
                raise LookupError("refused")
        except LookupError:
            pass
        assert db.connection.in_transaction
    assert names(other) == ["outer", "recorded-then-refused"]


def test_a_commit_that_fails_rolls_back_raises_and_leaves_the_database_usable(tmp_path: Path) -> None:
    database = SqliteDatabase(tmp_path / "fk.db")
    try:
        conn = database.connection
        conn.execute("PRAGMA foreign_keys = ON")
        with database.transaction():
            conn.execute("CREATE TABLE parents (id INTEGER PRIMARY KEY)")
            conn.execute("CREATE TABLE children (parent INTEGER REFERENCES parents (id) DEFERRABLE INITIALLY DEFERRED)")
        ran: list[str] = []
        with pytest.raises(StoreError, match="fk.db"), database.transaction():
            conn.execute("INSERT INTO parents (id) VALUES (1)")
            conn.execute("INSERT INTO children (parent) VALUES (2)")  # checked at COMMIT
            database.after_commit(lambda: ran.append("dropped"))
        assert ran == []
        assert not conn.in_transaction
        assert conn.execute("SELECT COUNT(*) FROM parents").fetchone() == (0,)
        with database.transaction():
            conn.execute("INSERT INTO parents (id) VALUES (2)")
            conn.execute("INSERT INTO children (parent) VALUES (2)")
            database.after_commit(lambda: ran.append("kept"))
        assert ran == ["kept"]
    finally:
        database.close()


def test_transactions_of_several_threads_are_serialised() -> None:
    database = SqliteDatabase(":memory:")
    try:
        with database.transaction():
            database.connection.execute("CREATE TABLE counter (n INTEGER NOT NULL)")
            database.connection.execute("INSERT INTO counter (n) VALUES (0)")
        threads, rounds = 4, 25

        def work() -> None:
            for _ in range(rounds):
                with database.transaction():
                    (n,) = database.connection.execute("SELECT n FROM counter").fetchone()
                    database.connection.execute("UPDATE counter SET n = ?", (n + 1,))

        workers = [threading.Thread(target=work) for _ in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        assert database.connection.execute("SELECT n FROM counter").fetchone() == (threads * rounds,)
    finally:
        database.close()


# --- after_commit ---------------------------------------------------------------------


def test_after_commit_runs_once_after_the_outermost_commit(db: SqliteDatabase, other: SqliteDatabase) -> None:
    ran: list[tuple[str, list[str]]] = []
    with db.transaction():
        insert(db, "a")
        db.after_commit(lambda: ran.append(("first", names(other))))
        with db.transaction():
            insert(db, "b")
            db.after_commit(lambda: ran.append(("second", names(other))))
        assert ran == []  # the inner level ended: nothing has committed yet
    # in the order given, once, and each saw what was committed
    assert ran == [("first", ["a", "b"]), ("second", ["a", "b"])]
    with db.transaction():
        insert(db, "c")
    assert len(ran) == 2  # not run again by a later commit


def test_after_commit_never_runs_when_the_transaction_rolls_back(db: SqliteDatabase) -> None:
    ran: list[str] = []
    with pytest.raises(RuntimeError), db.transaction():
        db.after_commit(lambda: ran.append("outer"))
        with db.transaction():
            db.after_commit(lambda: ran.append("inner"))
        raise RuntimeError("roll back")
    assert ran == []
    with db.transaction():  # nor after a later commit
        db.after_commit(lambda: ran.append("later"))
    assert ran == ["later"]


def test_after_commit_outside_a_transaction_runs_at_once(db: SqliteDatabase) -> None:
    ran: list[str] = []
    db.after_commit(lambda: ran.append("now"))
    assert ran == ["now"]


def test_after_commit_callbacks_run_outside_the_lock(db: SqliteDatabase) -> None:
    """A callback may wait on another thread that uses the database without a deadlock."""
    written: list[str] = []

    def write() -> None:
        with db.transaction():
            insert(db, "from-callback")

    def write_from_another_thread() -> None:
        worker = threading.Thread(target=write)
        worker.start()
        worker.join(timeout=2)
        written.append("blocked" if worker.is_alive() else "joined")

    with db.transaction():
        insert(db, "first")
        db.after_commit(write_from_another_thread)
    assert written == ["joined"]
    assert names(db) == ["first", "from-callback"]


# --- two connections to one file ------------------------------------------------------


def test_another_connection_sees_committed_data_only(db: SqliteDatabase, other: SqliteDatabase) -> None:
    with db.transaction():
        insert(db, "pending")
        assert names(other) == []
    assert names(other) == ["pending"]
    with pytest.raises(OSError), db.transaction():
        insert(db, "rolled-back")
        raise OSError("disk gone")
    assert names(other) == ["pending"]


def test_a_writer_waits_for_the_other_connections_transaction(db: SqliteDatabase, other: SqliteDatabase) -> None:
    """``BEGIN IMMEDIATE`` takes the write lock up front: past its busy timeout a second writer
    gets a ``StoreError`` naming the file, and can write once the first has committed."""
    with db.transaction():
        insert(db, "held")
        with pytest.raises(StoreError, match=str(other.path.name)), other.transaction():
            insert(other, "never")
        assert not other.connection.in_transaction
    with other.transaction():
        insert(other, "second")
    assert names(db) == ["held", "second"]


# --- construction ---------------------------------------------------------------------


@pytest.mark.parametrize("timeout", [-1, 1.5, "100", True, None])
def test_a_bad_busy_timeout_is_a_value_error(tmp_path: Path, timeout: object) -> None:
    with pytest.raises(ValueError, match="busy_timeout_ms"):
        SqliteDatabase(tmp_path / "x.db", busy_timeout_ms=timeout)  # type: ignore[arg-type]
    assert not (tmp_path / "x.db").exists()


def test_a_zero_busy_timeout_is_accepted(tmp_path: Path) -> None:
    database = SqliteDatabase(tmp_path / "x.db", busy_timeout_ms=0)
    try:
        assert database.connection.execute("PRAGMA busy_timeout").fetchone() == (0,)
    finally:
        database.close()


def test_memory_is_a_private_database_and_creates_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    first, second = SqliteDatabase(":memory:"), SqliteDatabase(":memory:")
    try:
        assert first.path == Path(":memory:")
        with first.transaction():
            first.connection.execute("CREATE TABLE t (v TEXT)")
            first.connection.execute("INSERT INTO t (v) VALUES ('kept')")
        ran: list[str] = []
        with first.transaction():
            first.after_commit(lambda: ran.append("ran"))
        assert ran == ["ran"]
        assert first.connection.execute("SELECT v FROM t").fetchall() == [("kept",)]
        with pytest.raises(sqlite3.OperationalError):
            second.connection.execute("SELECT v FROM t")
    finally:
        first.close()
        second.close()
    assert os.listdir(tmp_path) == []


def test_the_parent_directory_is_created(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "c" / "state.db"
    database = SqliteDatabase(path)
    try:
        with database.transaction():
            database.connection.execute("CREATE TABLE t (v TEXT)")
        assert path.is_file()
    finally:
        database.close()


def test_wal_full_sync_and_the_page_size_of_a_new_file(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    database = SqliteDatabase(path, page_size=2048)
    try:
        conn = database.connection
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert conn.execute("PRAGMA synchronous").fetchone() == (2,)  # FULL
        with database.transaction():
            conn.execute("CREATE TABLE t (v TEXT)")
        assert conn.execute("PRAGMA page_size").fetchone() == (2048,)
    finally:
        database.close()
    reopened = SqliteDatabase(path, page_size=8192)  # an existing file keeps its own
    try:
        assert reopened.connection.execute("PRAGMA page_size").fetchone() == (2048,)
    finally:
        reopened.close()


def test_close_closes_the_connection(tmp_path: Path) -> None:
    database = SqliteDatabase(tmp_path / "state.db")
    database.close()
    with pytest.raises(sqlite3.ProgrammingError):
        database.connection.execute("SELECT 1")
