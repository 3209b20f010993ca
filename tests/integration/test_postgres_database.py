"""``PostgresDatabase`` on a real server: one transaction per thread, re-entrant, committed
or rolled back as a whole, several threads' at once; ``after_commit``; advisory locks;
and psycopg's errors surfacing as ``StoreError`` messages that say what to fix."""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Iterator

import pytest

from flashruntime.errors import StoreError
from flashruntime.postgres_database import PostgresDatabase
from tests._support import run_core_only


@pytest.fixture
def db(postgres_url: str) -> Iterator[PostgresDatabase]:
    database = PostgresDatabase(postgres_url, max_size=4)
    database.execute("CREATE TABLE items (name TEXT PRIMARY KEY)")
    yield database
    database.close()


def names(db: PostgresDatabase) -> list[str]:
    return [row[0] for row in db.fetchall("SELECT name FROM items ORDER BY name")]


def test_a_transaction_commits_once_at_the_outermost_level(db: PostgresDatabase, postgres_url: str) -> None:
    other = PostgresDatabase(postgres_url)  # another process's view: committed rows only
    try:
        with db.transaction():
            db.execute("INSERT INTO items VALUES ('a')")
            with db.transaction():
                db.execute("INSERT INTO items VALUES ('b')")
            assert db.in_transaction() and names(db) == ["a", "b"]
            assert names(other) == []
        assert not db.in_transaction()
        assert names(other) == ["a", "b"]
    finally:
        other.close()


def test_an_exception_rolls_back_the_whole_transaction(db: PostgresDatabase) -> None:
    with pytest.raises(RuntimeError, match="inner"), db.transaction():
        db.execute("INSERT INTO items VALUES ('a')")
        with db.transaction():
            db.execute("INSERT INTO items VALUES ('b')")
            raise RuntimeError("inner")
    assert names(db) == []
    with db.transaction():  # the thread's connection went back clean
        db.execute("INSERT INTO items VALUES ('c')")
    assert names(db) == ["c"]


def test_a_failed_statement_caught_inside_is_not_reported_as_committed(db: PostgresDatabase) -> None:
    db.execute("INSERT INTO items VALUES ('a')")
    with pytest.raises(StoreError, match="rolled back, not committed"), db.transaction():
        db.execute("INSERT INTO items VALUES ('b')")
        with pytest.raises(StoreError, match="UniqueViolation"):
            db.execute("INSERT INTO items VALUES ('a')")
    assert names(db) == ["a"]


def test_after_commit_runs_after_the_commit_and_never_after_a_rollback(db: PostgresDatabase,
                                                                       postgres_url: str) -> None:
    other = PostgresDatabase(postgres_url)
    seen: list[tuple[str, list[str]]] = []
    try:
        db.after_commit(lambda: seen.append(("outside", names(other))))
        with db.transaction():
            db.execute("INSERT INTO items VALUES ('a')")
            db.after_commit(lambda: seen.append(("committed", names(other))))
            assert seen == [("outside", [])]
        with pytest.raises(RuntimeError), db.transaction():
            db.after_commit(lambda: seen.append(("rolled back", [])))
            raise RuntimeError("no")
        assert seen == [("outside", []), ("committed", ["a"])]
    finally:
        other.close()


def test_threads_hold_transactions_at_once(db: PostgresDatabase) -> None:
    inside = threading.Event()
    release = threading.Event()
    errors: list[BaseException] = []

    def slow() -> None:
        try:
            with db.transaction():
                db.execute("INSERT INTO items VALUES ('slow')")
                inside.set()
                assert release.wait(10)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    thread = threading.Thread(target=slow)
    thread.start()
    assert inside.wait(10)
    with db.transaction():  # not serialised behind the other thread's open transaction
        db.execute("INSERT INTO items VALUES ('fast')")
        assert names(db) == ["fast"]  # the other's row is not committed yet
    release.set()
    thread.join(10)
    assert not errors and names(db) == ["fast", "slow"]


def test_advisory_locks_have_one_holder_until_its_transaction_ends(db: PostgresDatabase) -> None:
    taken = threading.Event()
    done = threading.Event()

    def holder() -> None:
        with db.transaction():
            assert db.try_lock("sweeper")
            taken.set()
            done.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    assert taken.wait(10)
    with db.transaction():
        assert db.try_lock("sweeper") is False
        assert db.try_lock("another name") is True
    done.set()
    thread.join(10)
    with db.transaction():
        assert db.try_lock("sweeper") is True
    with pytest.raises(RuntimeError, match="inside transaction"):
        db.try_lock("sweeper")


def test_a_deadlock_is_a_store_error_saying_to_run_the_transaction_again(db: PostgresDatabase) -> None:
    db.execute("INSERT INTO items VALUES ('a'), ('b')")
    barrier = threading.Barrier(2)
    outcomes: list[BaseException | None] = [None, None]

    def lock_both(index: int, first: str, second: str) -> None:
        try:
            with db.transaction():
                db.execute("SET LOCAL deadlock_timeout = '50ms'")
                db.execute("SELECT name FROM items WHERE name = %s FOR UPDATE", (first,))
                barrier.wait(10)
                db.execute("SELECT name FROM items WHERE name = %s FOR UPDATE", (second,))
        except BaseException as exc:  # noqa: BLE001 - compared below
            outcomes[index] = exc

    threads = [threading.Thread(target=lock_both, args=(0, "a", "b")),
               threading.Thread(target=lock_both, args=(1, "b", "a"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    refused = [outcome for outcome in outcomes if outcome is not None]
    assert len(refused) == 1, outcomes
    assert isinstance(refused[0], StoreError)
    assert re.search(r"rolled back after a deadlock .*; run it again", str(refused[0]))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_an_unreachable_server_is_a_store_error_naming_host_port_and_setting(postgres_cluster: object) -> None:
    port = _free_port()
    with pytest.raises(StoreError, match=rf"127\.0\.0\.1:{port}.*cannot be reached.*--database-url"):
        PostgresDatabase(f"postgresql://postgres:secret@127.0.0.1:{port}/flash", connect_timeout_s=2,
                         source="--database-url")


def test_a_missing_database_and_a_bad_url_say_what_to_fix(postgres_url: str) -> None:
    missing = re.sub(r"/[^/?]+(\?.*)?$", "/no_such_database", postgres_url)
    with pytest.raises(StoreError, match="'no_such_database'.*does not exist.*createdb"):
        PostgresDatabase(missing)
    for bad in ("mysql://flash:hunter2@db.example/flash", "db.example:5432"):
        with pytest.raises(StoreError, match="is not a PostgreSQL URL.*postgresql://user@host:port/database") as refused:
            PostgresDatabase(bad)
        assert "hunter2" not in str(refused.value)
    with pytest.raises(ValueError, match="max_size"):
        PostgresDatabase(postgres_url, max_size=0)


def test_the_password_is_never_shown(postgres_url: str) -> None:
    url = postgres_url.replace("postgres@", "postgres:hunter2@")
    database = PostgresDatabase(url)  # trust authentication: the password is not checked
    try:
        assert "hunter2" not in repr(database) and "hunter2" not in database.where
    finally:
        database.close()


def test_the_postgres_modules_import_without_psycopg_and_say_what_to_install() -> None:
    result = run_core_only(
        "import flashruntime.postgres_database as pg, flashruntime.leases.postgres_store\n"
        "try:\n"
        "    pg.PostgresDatabase('postgresql://flash@db.example/flash')\n"
        "except pg.StoreError as exc:\n"
        "    print(exc)\n",
        refuse=("psycopg", "psycopg_pool"),
    )
    assert result.returncode == 0, result.stderr
    assert "pip install 'flashruntime[postgres]'" in result.stdout
