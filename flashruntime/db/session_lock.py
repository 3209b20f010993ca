"""``SessionLock``: a PostgreSQL advisory lock held by a connection of its own, for a role
one process at a time plays among those sharing a database (the expiry sweeper of
coordinator replicas). The connection, not a transaction, holds it, so it ends with the
process, after ``kill -9`` too, or with a client host that vanished (by keepalives)."""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import TYPE_CHECKING, Any

from flashruntime.db.postgres_errors import _driver

if TYPE_CHECKING:
    from flashruntime.db.postgres import PostgresDatabase

__all__ = ["SessionLock"]

log = logging.getLogger("flashruntime.service")

# A session lock's connection: probes after 5 s idle, every 5 s, 3 unanswered ones end it;
# a statement's data unacknowledged for 15 s ends it too.
_KEEPALIVE_IDLE_S, _KEEPALIVE_INTERVAL_S, _KEEPALIVE_COUNT = 5, 5, 3
_TCP_USER_TIMEOUT_MS = 15_000


def _session(database: PostgresDatabase, application_name: str) -> Any:
    """A connection outside the pool, for a session lock: libpq's keepalives and a TCP user
    timeout bound how long a statement waits on a server that vanished, and the server's
    own keepalives how long it keeps the session (and its locks) of a client host that did."""
    psycopg, _ = _driver()
    options: dict[str, Any] = {"application_name": application_name, "keepalives": 1,
                               "keepalives_idle": _KEEPALIVE_IDLE_S, "keepalives_interval": _KEEPALIVE_INTERVAL_S,
                               "keepalives_count": _KEEPALIVE_COUNT}
    if psycopg.pq.version() >= 120000:  # libpq learnt tcp_user_timeout in 12
        options["tcp_user_timeout"] = _TCP_USER_TIMEOUT_MS
    conn = database.connect(**options)
    try:
        for setting, value in (("tcp_keepalives_idle", _KEEPALIVE_IDLE_S),
                               ("tcp_keepalives_interval", _KEEPALIVE_INTERVAL_S),
                               ("tcp_keepalives_count", _KEEPALIVE_COUNT)):
            conn.execute(f"SET {setting} = {int(value)}")  # ignored on a Unix-domain socket
    except BaseException:
        conn.close()
        raise
    return conn


class SessionLock:
    """The advisory lock ``name`` (``pg_try_advisory_lock``) on ``database``, held by a
    connection of its own, outside the pool, for as long as that connection lives: it ends
    with this process (the server sees the connection close, after ``kill -9`` too), with
    ``release()``, or when the connection is lost (a vanished client host within about 20 s,
    by the server's keepalives).

    ``hold()`` never waits: it keeps the lock while the connection answers, and takes it when
    no other session holds it. Other processes do the same, so at most one holds it at a time,
    and when the holder dies another takes it at its next ``hold()``."""

    def __init__(self, database: PostgresDatabase, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a session lock needs a name, got {name!r}")
        self._db = database
        self.name = name
        self._mutex = threading.Lock()
        self._conn: Any = None
        self._held = False

    @property
    def held(self) -> bool:
        """Whether the lock was held at the last ``hold()``."""
        return self._held

    def hold(self) -> bool:
        """Whether this process holds the lock now (see the class). A database that fails is
        "not held", never an exception: the connection is dropped, with the lock if it had it,
        and the next call connects again."""
        psycopg, _ = _driver()
        with self._mutex:
            try:
                if self._conn is None:
                    self._conn = _session(self._db, f"flashruntime {self.name}")
                if self._held:
                    self._conn.execute("SELECT 1")  # still connected, so still the holder
                else:
                    row = self._conn.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))",
                                             (self.name,)).fetchone()
                    self._held = bool(row and row[0])
            except psycopg.Error as exc:
                if self._held:
                    log.warning("%s: lost the %s lock with its connection (%s)", self._db.where, self.name,
                                str(exc).strip())
                else:
                    log.debug("%s: cannot take the %s lock (%s)", self._db.where, self.name, str(exc).strip())
                self._drop()
            return self._held

    def release(self) -> None:
        """Give the lock up, then close its connection; idempotent. The lock is released by a
        statement first: closing alone frees it only once the server has seen the connection
        end, which a replica asking at once could miss."""
        with self._mutex:
            if self._held and self._conn is not None:
                with contextlib.suppress(Exception):  # a broken connection: the server frees the lock anyway
                    self._conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (self.name,))
            self._drop()

    def _drop(self) -> None:
        conn, self._conn, self._held = self._conn, None, False
        if conn is not None:
            with contextlib.suppress(Exception):  # closing what is already broken
                conn.close()

    def __repr__(self) -> str:
        return f"SessionLock({self.name!r}, held={self._held})"
