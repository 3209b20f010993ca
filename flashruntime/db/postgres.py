"""``PostgresDatabase``: a PostgreSQL database behind a pool of connections, and the
re-entrant per-thread transaction every store built on it shares.

What ``SqliteDatabase`` is for one SQLite file, this is for a server: a store given a
``PostgresDatabase`` writes through the connection of the transaction its thread has
open, so whatever runs inside one ``transaction()`` commits together or not at all.
Unlike SQLite, several threads (and processes, and coordinator replicas) hold
transactions at once; stores make that safe with row locks (``SELECT ... FOR UPDATE``,
``SKIP LOCKED`` for claims). psycopg (the ``postgres`` extra) is imported when a database
is opened, not with this module, and its errors stop here: they surface as ``StoreError``
naming the server, with psycopg's error (and its ``sqlstate``) as the cause
(``flashruntime.db.postgres_errors``).
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any

from flashruntime.db.postgres_errors import _driver, describe, translate_postgres_errors, translated
from flashruntime.db.schema import schema_statements
from flashruntime.db.session_lock import SessionLock
from flashruntime.errors import StoreError

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["PostgresDatabase"]


def _rollback(conn: Any) -> None:
    with contextlib.suppress(Exception):  # the connection is gone: the server has rolled back already
        conn.execute("ROLLBACK")


@translate_postgres_errors(lambda transaction: transaction._db.where, lambda transaction: transaction._db.source)
class _Transaction:
    """``BEGIN`` ... ``COMMIT`` (``ROLLBACK`` on an exception) on the thread's own pooled
    connection; re-entrant per thread, and the same object for every caller."""

    __slots__ = ("_db",)

    def __init__(self, db: PostgresDatabase) -> None:
        self._db = db

    def __enter__(self) -> Self:
        db = self._db
        local = db._local
        depth = getattr(local, "depth", 0)
        if depth == 0:
            conn = db._checkout()
            try:
                conn.execute("BEGIN")
            except BaseException:
                db._checkin(conn)
                raise
            local.conn = conn
            local.callbacks = []
        local.depth = depth + 1
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        db = self._db
        local = db._local
        local.depth -= 1
        if local.depth:
            return
        conn, callbacks = local.conn, local.callbacks
        local.conn, local.callbacks = None, []
        try:
            if exc_type is not None:
                _rollback(conn)
                return
            if conn.info.transaction_status == db._psycopg.pq.TransactionStatus.INERROR:
                # COMMIT of an aborted transaction is a ROLLBACK that reports no error: say so instead.
                _rollback(conn)
                raise StoreError(
                    f"{db.where}: the transaction was rolled back, not committed: a statement inside it failed "
                    "and the error was caught before the transaction ended"
                )
            try:
                conn.execute("COMMIT")
            except BaseException as failed:
                _rollback(conn)
                if isinstance(failed, db._psycopg.OperationalError) and not getattr(failed, "sqlstate", None):
                    # No answer from the server (an answer would carry a SQLSTATE).
                    raise StoreError(
                        f"{db.where}: the connection was lost while committing ({failed}); whether the "
                        "transaction committed is unknown, so read the state back before acting on it"
                    ) from failed
                raise
        finally:
            db._checkin(conn)
        for callback in callbacks:  # after the connection is back: none of them may hold it up
            callback()


class PostgresDatabase:
    """The PostgreSQL database at ``url`` (``postgresql://user[:password]@host[:port]/database``,
    libpq's URL, its query parameters included).

    A pool of ``min_size`` to ``max_size`` connections (autocommit; ``transaction()`` opens
    and ends transactions explicitly). The constructor connects once, so an unreachable
    server, a missing database or a refused login raise ``StoreError`` at once, naming the
    host and port and ``source``, the setting the URL came from. ``where`` names the
    database in messages; the password is never shown.
    """

    def __init__(
        self,
        url: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        connect_timeout_s: float = 10.0,
        checkout_timeout_s: float = 30.0,
        check_connections: bool = True,
        source: str = "the database URL",
    ) -> None:
        if not isinstance(url, str):
            raise TypeError(f"url must be a str, got {type(url).__name__}")
        for name, value, least in (("min_size", min_size, 0), ("max_size", max_size, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
        if max_size < min_size:
            raise ValueError(f"max_size ({max_size}) must be >= min_size ({min_size})")
        for name, seconds in (("connect_timeout_s", connect_timeout_s), ("checkout_timeout_s", checkout_timeout_s)):
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < math.inf:
                raise ValueError(f"{name} must be a number of seconds, finite and > 0, got {seconds!r}")
        psycopg, psycopg_pool = _driver()
        self._psycopg = psycopg
        self.source = source
        self.host, self.port, self.name = _address(psycopg, url, source)
        self.where = f"PostgreSQL database {self.name!r} at {self.host}:{self.port}"
        self._local = threading.local()
        self._checkout_timeout_s = float(checkout_timeout_s)
        connect_kwargs = {
            "autocommit": True,  # transactions are explicit: BEGIN ... COMMIT
            "connect_timeout": max(2, math.ceil(connect_timeout_s)),  # libpq takes whole seconds, at least 2
            "application_name": "flashruntime",
        }
        self._url = url
        self._connect_kwargs = connect_kwargs
        self._pool: Any = None
        try:
            # One connection first: its error says why the server cannot be used, which a pool
            # (that retries in the background) would only report as a timeout.
            probe = psycopg.connect(url, **connect_kwargs)
            self.server_version = probe.info.server_version
            probe.close()
            self._pool = psycopg_pool.ConnectionPool(
                url,
                min_size=min_size,
                max_size=max_size,
                kwargs=connect_kwargs,
                check=psycopg_pool.ConnectionPool.check_connection if check_connections else None,
                timeout=self._checkout_timeout_s,
                name=f"flashruntime {self.name}",
                open=False,
            )
            self._pool.open(wait=min_size > 0, timeout=float(connect_timeout_s))
        except BaseException as exc:
            if self._pool is not None:
                self._pool.close()  # its worker threads would outlive the refused database
            if isinstance(exc, psycopg.Error):
                raise StoreError(describe(exc, self.where, source) or str(exc)) from exc
            raise
        self._transaction = _Transaction(self)

    # --- transactions -------------------------------------------------------------

    def transaction(self) -> _Transaction:
        """``BEGIN`` ... ``COMMIT`` around what runs inside it, ``ROLLBACK`` when it raises;
        re-entrant on one thread (only the outermost commits). Each thread has its own:
        transactions of several threads run at once, isolated as PostgreSQL's READ COMMITTED
        isolates them."""
        return self._transaction

    def in_transaction(self) -> bool:
        """Whether this thread is inside ``transaction()``."""
        return getattr(self._local, "conn", None) is not None

    def after_commit(self, callback: Callable[[], object]) -> None:
        """Run ``callback`` once the transaction this thread is in has committed (dropped if it
        rolls back); at once when this thread is in none. For what must follow only what is
        stored: a log line, a counter."""
        if getattr(self._local, "conn", None) is not None:
            self._local.callbacks.append(callback)
            return
        callback()

    # --- statements ---------------------------------------------------------------

    @contextmanager
    def connection(self) -> Iterator[Any]:
        """The psycopg connection to run statements on: this thread's transaction's, or else
        one from the pool (autocommit: each statement is its own transaction), returned after.
        psycopg's errors raised inside become ``StoreError``."""
        conn = getattr(self._local, "conn", None)
        try:
            if conn is not None:
                yield conn
                return
            conn = self._checkout()
            try:
                yield conn
            finally:
                self._checkin(conn)
        except StoreError:
            raise
        except Exception as exc:
            error = translated(exc, self.where, self.source)
            if error is exc:
                raise
            raise error from exc

    def fetchall(self, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """The rows of one statement, run as ``connection()`` says."""
        with self.connection() as conn:
            return conn.execute(statement, params).fetchall()  # type: ignore[no-any-return]

    def fetchone(self, statement: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        """The first row of one statement, or None."""
        with self.connection() as conn:
            return conn.execute(statement, params).fetchone()  # type: ignore[no-any-return]

    def execute(self, statement: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; the number of rows it changed. Outside a transaction it commits
        on its own."""
        with self.connection() as conn:
            return int(conn.execute(statement, params).rowcount)

    # --- locks and schema ---------------------------------------------------------

    def lock(self, name: str) -> None:
        """Wait for the advisory lock ``name``, held until this thread's transaction ends
        (``pg_advisory_xact_lock``): one holder at a time across every process on the database."""
        self._require_transaction("lock")
        self.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (name,))

    def try_lock(self, name: str) -> bool:
        """Take the advisory lock ``name`` until this thread's transaction ends, if no other
        transaction holds it; whether it was taken. Never waits."""
        self._require_transaction("try_lock")
        row = self.fetchone("SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0))", (name,))
        return bool(row and row[0])

    def ensure_schema(
        self,
        *,
        meta_table: str,
        version: str,
        statements: Sequence[str],
        what: str,
        upgrades: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        """Create a store's tables and record ``version`` in ``meta_table`` (key
        ``schema_version``) when the database has none; run ``upgrades[stored]`` when an
        older version is stored; refuse any other stored version with ``SchemaVersionError``
        naming the database. One process at a time (an advisory lock), so replicas starting
        together do not race to create the same tables."""
        with self.transaction():
            self.lock(f"flashruntime schema {meta_table}")
            todo = schema_statements(self.recorded_version(meta_table), version=version, statements=statements,
                                     upgrades=upgrades or {}, where=self.where, what=what,
                                     fix="use the flashruntime version that wrote it")
            if todo is None:
                return
            for statement in todo:
                self.execute(statement)
            self.execute(
                f"INSERT INTO {meta_table} (key, value) VALUES ('schema_version', %s) "
                "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                (version,),
            )

    def recorded_version(self, meta_table: str) -> str | None:
        """The ``schema_version`` a store recorded in ``meta_table`` (found through the
        ``search_path``), or None when that table or its row is absent. Reads only."""
        exists = self.fetchone("SELECT to_regclass(%s) IS NOT NULL", (meta_table,))
        if not (exists and exists[0]):
            return None
        row = self.fetchone(f"SELECT value FROM {meta_table} WHERE key = 'schema_version'")
        return None if row is None else str(row[0])

    def ping(self, timeout_s: float) -> None:
        """One ``SELECT 1`` on a pooled connection taken within ``timeout_s``: ``StoreError``
        saying why when the server does not answer in that time, for a readiness probe that
        must answer sooner than a statement would wait for a connection."""
        try:
            conn = self._pool.getconn(timeout=timeout_s)
            try:
                conn.execute("SELECT 1")
            finally:
                self._checkin(conn)
        except Exception as exc:
            error = translated(exc, self.where, self.source)
            if error is exc:
                raise
            raise error from exc

    def session_lock(self, name: str) -> SessionLock:
        """The advisory lock ``name`` held by a session of its own (``SessionLock``): for a role
        one process at a time plays, such as the expiry sweeper of replicas sharing this database."""
        return SessionLock(self, name)

    def connect(self, **options: Any) -> Any:
        """A psycopg connection of its own, outside the pool, made as the pool's are but with
        ``options`` (libpq's parameters) over theirs; the caller closes it."""
        return self._psycopg.connect(self._url, **{**self._connect_kwargs, **options})

    # --- lifecycle ----------------------------------------------------------------

    @property
    def label(self) -> str:
        """The database in messages and a store's ``repr``: ``where`` (no password)."""
        return self.where

    def close(self) -> None:
        """Close every connection of the pool (idempotent)."""
        self._pool.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PostgresDatabase({self.label!r})"

    # --- plumbing -----------------------------------------------------------------

    def _checkout(self) -> Any:
        return self._pool.getconn(timeout=self._checkout_timeout_s)

    def _checkin(self, conn: Any) -> None:
        self._pool.putconn(conn)

    def _require_transaction(self, what: str) -> None:
        if getattr(self._local, "conn", None) is None:
            raise RuntimeError(f"{what}() holds its lock until the transaction ends: call it inside transaction()")


def _address(psycopg: Any, url: str, source: str) -> tuple[str, str, str]:
    """``(host, port, database)`` of ``url`` for messages, as libpq would resolve them."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.Error as exc:
        # psycopg's message quotes the URL, password included: it stays in the cause only.
        raise StoreError(
            f"{source} is not a PostgreSQL URL: write it as postgresql://user@host:port/database "
            "(libpq's URL, query parameters allowed)"
        ) from exc
    host = str(params.get("host") or os.environ.get("PGHOST") or "localhost")
    port = str(params.get("port") or os.environ.get("PGPORT") or "5432")
    user = str(params.get("user") or os.environ.get("PGUSER") or "")
    name = str(params.get("dbname") or os.environ.get("PGDATABASE") or user or "postgres")
    return host, port, name
