"""``SqliteDatabase``: one SQLite file behind one connection, and the one re-entrant
transaction every store built on it shares.

A store given a ``SqliteDatabase`` instead of a path writes through this connection, so
whatever runs inside one ``transaction()`` (a lease transition, the events it implies,
a job record) commits together or not at all. WAL with ``synchronous=FULL``: a committed
transaction survives ``kill -9`` and power loss. ``BEGIN IMMEDIATE`` takes the write lock
up front, so several processes may share the file. Standard library only.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

from flashruntime.db.schema import schema_statements
from flashruntime.db.sqlite_errors import translate_sqlite_errors

__all__ = ["SqliteDatabase", "has_table", "recorded_version"]


@translate_sqlite_errors(lambda transaction: f"database {transaction._db.path}")
class _Transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on an exception); re-entrant, and the
    same object for every caller, so nesting one store's transaction in another's is free."""

    __slots__ = ("_db",)

    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db

    def __enter__(self) -> _Transaction:
        db = self._db
        db.lock.acquire()
        if db._depth == 0:
            try:
                db.connection.execute("BEGIN IMMEDIATE")
            except BaseException:
                db.lock.release()
                raise
        db._depth += 1
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        db = self._db
        committed: list[Callable[[], object]] | None = None
        try:
            db._depth -= 1
            if db._depth == 0:
                conn = db.connection
                if exc_type is None:
                    try:
                        conn.execute("COMMIT")
                    except BaseException:
                        _rollback(conn)
                        db._after_commit.clear()
                        raise
                    if db._after_commit:
                        committed, db._after_commit = db._after_commit, []
                else:
                    _rollback(conn)
                    if db._after_commit:
                        db._after_commit.clear()
        finally:
            db.lock.release()
        if committed:
            for callback in committed:  # outside the lock: none of them may hold up the database
                callback()


def _rollback(conn: sqlite3.Connection) -> None:
    try:
        conn.execute("ROLLBACK")
    except sqlite3.Error:
        pass  # no transaction left to roll back (SQLite rolled it back itself)


class SqliteDatabase:
    """The SQLite file at ``path`` (``":memory:"``: a private in-memory database).

    ``connection`` is shared by every store on this database and used only under
    ``lock`` (re-entrant): ``transaction()`` for a read-modify-write, ``lock`` alone for
    a read. The constructor creates the parent directory; a new file gets ``page_size``
    (an existing one keeps its own).
    """

    def __init__(self, path: str | Path, *, busy_timeout_ms: int = 5000, page_size: int | None = None) -> None:
        if isinstance(busy_timeout_ms, bool) or not isinstance(busy_timeout_ms, int) or busy_timeout_ms < 0:
            raise ValueError(f"busy_timeout_ms must be an int >= 0, got {busy_timeout_ms!r}")
        memory = str(path) == ":memory:"
        self.path = Path(path) if not memory else Path(":memory:")
        if not memory:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.lock = threading.RLock()
        self._depth = 0
        self._after_commit: list[Callable[[], object]] = []
        self.connection = sqlite3.connect(
            ":memory:" if memory else str(self.path),
            timeout=busy_timeout_ms / 1000.0,
            isolation_level=None,  # transactions are explicit: BEGIN IMMEDIATE ... COMMIT
            check_same_thread=False,  # every use is under ``lock``
        )
        try:
            self.connection.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            if page_size is not None:
                self.connection.execute(f"PRAGMA page_size = {int(page_size)}")  # before WAL fixes it
            self.connection.execute("PRAGMA journal_mode = WAL")
            self.connection.execute("PRAGMA synchronous = FULL")
        except BaseException:
            self.connection.close()
            raise
        self._transaction = _Transaction(self)

    def transaction(self) -> _Transaction:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` around what runs inside it, ``ROLLBACK`` when it
        raises; re-entrant on one thread (only the outermost commits), serialised across threads."""
        return self._transaction

    def after_commit(self, callback: Callable[[], object]) -> None:
        """Run ``callback`` once the transaction this thread is in has committed (dropped if it
        rolls back); at once when this thread is in none. For what must follow only what is
        stored: a log line, a counter."""
        with self.lock:
            if self._depth:
                self._after_commit.append(callback)
                return
        callback()

    def ensure_schema(
        self,
        *,
        meta_table: str,
        version: str,
        statements: Sequence[str],
        what: str,
        upgrades: Mapping[str, Sequence[str]] | None = None,
        unversioned: Callable[[sqlite3.Connection], None] | None = None,
    ) -> None:
        """Create a store's tables and record ``version`` in ``meta_table`` (key
        ``schema_version``) when the file has none; run ``upgrades[stored]`` when an older
        version is stored; refuse any other stored version with ``SchemaVersionError`` naming
        the file. ``unversioned(connection)``, when given, runs first where no version is
        recorded (a store's layout from before it kept one). A file already at ``version`` is
        only read: no write lock is taken."""
        with self.lock:
            if recorded_version(self.connection, meta_table) == version:
                return
        with self._transaction:
            conn = self.connection
            stored = recorded_version(conn, meta_table)
            todo = schema_statements(stored, version=version, statements=statements, upgrades=upgrades or {},
                                     where=str(self.path), what=what, fix="open it with the version that wrote it")
            if todo is None:
                return
            if stored is None and unversioned is not None:
                unversioned(conn)
            for statement in todo:
                conn.execute(statement)
            conn.execute(f"INSERT OR REPLACE INTO {meta_table} (key, value) VALUES ('schema_version', ?)", (version,))

    @property
    def label(self) -> str:
        """The database in messages and a store's ``repr``: the file's path."""
        return str(self.path)

    def close(self) -> None:
        with self.lock:
            self.connection.close()

    def __repr__(self) -> str:
        return f"SqliteDatabase({self.label!r})"


def has_table(connection: sqlite3.Connection, name: str) -> bool:
    """Whether the database of ``connection`` holds the table ``name``; reads only."""
    row = connection.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone()
    return row is not None


def recorded_version(connection: sqlite3.Connection, meta_table: str) -> str | None:
    """The ``schema_version`` a store recorded in its ``meta_table`` (key/value rows), or None
    when that table or its row is absent; reads only, so it suits a read-only connection."""
    if not has_table(connection, meta_table):
        return None
    row = connection.execute(f"SELECT value FROM {meta_table} WHERE key = 'schema_version'").fetchone()
    return None if row is None else str(row[0])
