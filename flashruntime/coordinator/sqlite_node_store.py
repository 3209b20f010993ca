"""``SqliteNodeStore``: the ``NodeStore`` in SQLite, so a coordinator restart keeps every
node's registration, its last recorded heartbeat and its accepted count.

One row per node holding the registration's JSON; ``BEGIN IMMEDIATE`` around every
write, bound parameters only, a schema version in ``node_meta``. On a shared
``SqliteDatabase`` a write joins the transaction its caller has open.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from flashruntime.coordinator.node_store import StoredNode
from flashruntime.errors import SchemaVersionError
from flashruntime.protocol.v1alpha1 import NodeRegistration
from flashruntime.db.sqlite import SqliteDatabase, recorded_version
from flashruntime.db.sqlite_errors import translate_sqlite_errors

__all__ = ["SCHEMA_VERSION", "SqliteNodeStore", "stored_schema_version"]

SCHEMA_VERSION = "1"
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS node_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS nodes ("
    " node_id TEXT PRIMARY KEY,"
    " registration TEXT NOT NULL,"
    " last_seen REAL NOT NULL,"
    " accepted INTEGER NOT NULL DEFAULT 0)",
)
_COLUMNS = "registration, last_seen, accepted"


def stored_schema_version(connection: sqlite3.Connection) -> str | None:
    """The node store's schema version recorded in the database of ``connection`` (read-only
    will do), or None where it has no node tables yet. Reads only."""
    return recorded_version(connection, "node_meta")


@translate_sqlite_errors(lambda store: f"node store {store.path}")
class SqliteNodeStore:
    """Nodes in the SQLite file at ``path``, or in a ``SqliteDatabase`` shared with other
    stores (whose owner closes it). The constructor creates the schema; a newer one is
    refused rather than misread."""

    def __init__(self, path: str | os.PathLike[str] | SqliteDatabase, *, busy_timeout_ms: int = 5000) -> None:
        if isinstance(path, SqliteDatabase):
            db, self._owns_db = path, False
        else:
            db, self._owns_db = SqliteDatabase(os.fspath(path), busy_timeout_ms=busy_timeout_ms), True
        self._db = db
        self.path = db.path
        try:
            with self._write() as conn:
                for statement in _SCHEMA:
                    conn.execute(statement)
                row = conn.execute("SELECT value FROM node_meta WHERE key = 'schema_version'").fetchone()
                if row is None:
                    conn.execute("INSERT INTO node_meta (key, value) VALUES ('schema_version', ?)", (SCHEMA_VERSION,))
                elif row[0] != SCHEMA_VERSION:
                    raise SchemaVersionError(
                        f"{self.path}: node schema version {row[0]!r} is not one this flashruntime reads (it reads "
                        f"{SCHEMA_VERSION!r}); open it with the version that wrote it"
                    )
        except BaseException:
            if self._owns_db:
                db.close()
            raise

    def close(self) -> None:
        """Close the connection this store opened; one on a shared database is its owner's to close."""
        if self._owns_db:
            self._db.close()

    def __repr__(self) -> str:
        return f"SqliteNodeStore({str(self.path)!r})"

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._db.transaction():
            yield self._db.connection

    # --- NodeStore ----------------------------------------------------------------

    def register(self, registration: NodeRegistration, seen_at: float) -> None:
        with self._write() as conn:
            conn.execute(
                "INSERT INTO nodes (node_id, registration, last_seen, accepted) VALUES (?, ?, ?, 0) "
                "ON CONFLICT (node_id) DO UPDATE SET registration = excluded.registration, "
                "last_seen = excluded.last_seen",
                (registration.node_id, registration.model_dump_json(), float(seen_at)),
            )

    def get(self, node_id: str) -> StoredNode | None:
        with self._db.lock:
            row = self._db.connection.execute(f"SELECT {_COLUMNS} FROM nodes WHERE node_id = ?",
                                              (node_id,)).fetchone()
        return None if row is None else _node(row)

    def all(self) -> list[StoredNode]:
        with self._db.lock:
            rows = self._db.connection.execute(f"SELECT {_COLUMNS} FROM nodes ORDER BY node_id").fetchall()
        return [_node(row) for row in rows]

    def set_pools(self, node_id: str, pools: list[str]) -> bool:
        with self._write() as conn:
            row = conn.execute("SELECT registration FROM nodes WHERE node_id = ?", (node_id,)).fetchone()
            if row is None:
                return False
            registration = NodeRegistration.model_validate_json(row[0])
            capabilities = registration.capabilities.model_copy(update={"pools": list(pools)})
            updated = registration.model_copy(update={"capabilities": capabilities})
            conn.execute("UPDATE nodes SET registration = ? WHERE node_id = ?", (updated.model_dump_json(), node_id))
            return True

    def seen(self, node_id: str, at: float) -> bool:
        with self._write() as conn:
            cursor = conn.execute("UPDATE nodes SET last_seen = MAX(last_seen, ?) WHERE node_id = ?",
                                  (float(at), node_id))
            return cursor.rowcount > 0

    def count_accepted(self, node_id: str) -> bool:
        with self._write() as conn:
            return conn.execute("UPDATE nodes SET accepted = accepted + 1 WHERE node_id = ?",
                                (node_id,)).rowcount > 0


def _node(row: tuple[str, float, int]) -> StoredNode:
    registration, last_seen, accepted = row
    return StoredNode(NodeRegistration.model_validate_json(registration), float(last_seen), int(accepted))
