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
from flashruntime.db.owned import DatabaseStore
from flashruntime.db.sqlite import SqliteDatabase, recorded_version
from flashruntime.db.sqlite_errors import translate_sqlite_errors
from flashruntime.protocol.v1alpha1 import NodeRegistration

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
class SqliteNodeStore(DatabaseStore[SqliteDatabase]):
    """Nodes in the SQLite file at ``path``, or in a ``SqliteDatabase`` shared with other
    stores (whose owner closes it). The constructor creates the schema; a newer one is
    refused rather than misread."""

    def __init__(self, path: str | os.PathLike[str] | SqliteDatabase, *, busy_timeout_ms: int = 5000) -> None:
        def open_file() -> SqliteDatabase:
            return SqliteDatabase(os.fspath(path), busy_timeout_ms=busy_timeout_ms)  # type: ignore[arg-type]

        db = self._open_database(
            path, SqliteDatabase, open_file,
            lambda db: db.ensure_schema(meta_table="node_meta", version=SCHEMA_VERSION, statements=_SCHEMA,
                                        what="node"))
        self.path = db.path

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self.database.transaction():
            yield self.database.connection

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
        with self.database.lock:
            row = self.database.connection.execute(f"SELECT {_COLUMNS} FROM nodes WHERE node_id = ?",
                                              (node_id,)).fetchone()
        return None if row is None else _node(row)

    def all(self) -> list[StoredNode]:
        with self.database.lock:
            rows = self.database.connection.execute(f"SELECT {_COLUMNS} FROM nodes ORDER BY node_id").fetchall()
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
