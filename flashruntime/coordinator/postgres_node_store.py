"""``PostgresNodeStore``: the ``NodeStore`` in PostgreSQL, shared by every coordinator
replica, so a restart (or another replica) keeps every node's registration, its last
recorded heartbeat and its accepted count.

The SQLite store's table on a server: one row per node holding the registration's JSON,
a schema version in ``node_meta``. Each call is one statement, except ``set_pools``,
which reads the row under a lock (``FOR UPDATE``) and writes it back in one transaction;
on a shared ``PostgresDatabase`` a write joins the transaction its thread has open.
"""

from __future__ import annotations

from typing import Any

from flashruntime.coordinator.node_store import StoredNode
from flashruntime.db.owned import DatabaseStore
from flashruntime.db.postgres import PostgresDatabase
from flashruntime.protocol.v1alpha1 import NodeRegistration

__all__ = ["SCHEMA_VERSION", "PostgresNodeStore", "stored_schema_version"]

SCHEMA_VERSION = "1"
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS node_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS nodes (
        node_id TEXT COLLATE "C" PRIMARY KEY,
        registration TEXT NOT NULL,
        last_seen DOUBLE PRECISION NOT NULL,
        accepted BIGINT NOT NULL DEFAULT 0
    )""",
)
_COLUMNS = "registration, last_seen, accepted"


def stored_schema_version(database: PostgresDatabase) -> str | None:
    """The node store's schema version recorded in ``database``, or None where it has no
    node tables yet. Reads only."""
    return database.recorded_version("node_meta")


class PostgresNodeStore(DatabaseStore[PostgresDatabase]):
    """Nodes in PostgreSQL. ``database`` is a URL (the store opens and owns a
    ``PostgresDatabase``) or a ``PostgresDatabase`` shared with other stores (whose owner
    closes it). The constructor creates the schema; another schema version is refused
    (``RuntimeError`` naming the database) rather than misread."""

    def __init__(self, database: str | PostgresDatabase, **options: Any) -> None:
        db = self._open_database(
            database, PostgresDatabase, lambda: PostgresDatabase(database, **options),  # type: ignore[arg-type]
            lambda db: db.ensure_schema(meta_table="node_meta", version=SCHEMA_VERSION, statements=_SCHEMA,
                                        what="node"))
        self.where = db.where

    # --- NodeStore ----------------------------------------------------------------

    def register(self, registration: NodeRegistration, seen_at: float) -> None:
        if "\x00" in registration.node_id:
            raise ValueError(f"node id {registration.node_id!r} cannot contain NUL characters")
        self.database.execute(
            "INSERT INTO nodes (node_id, registration, last_seen, accepted) VALUES (%s, %s, %s, 0) "
            "ON CONFLICT (node_id) DO UPDATE SET registration = EXCLUDED.registration, "
            "last_seen = EXCLUDED.last_seen",
            (registration.node_id, registration.model_dump_json(), float(seen_at)),
        )

    def get(self, node_id: str) -> StoredNode | None:
        if "\x00" in node_id:
            return None  # no stored id holds one
        row = self.database.fetchone(f"SELECT {_COLUMNS} FROM nodes WHERE node_id = %s", (node_id,))
        return None if row is None else _node(row)

    def all(self) -> list[StoredNode]:
        return [_node(row) for row in self.database.fetchall(f"SELECT {_COLUMNS} FROM nodes ORDER BY node_id")]

    def set_pools(self, node_id: str, pools: list[str]) -> bool:
        if "\x00" in node_id:
            return False
        db = self.database
        with db.transaction():
            row = db.fetchone("SELECT registration FROM nodes WHERE node_id = %s FOR UPDATE", (node_id,))
            if row is None:
                return False
            registration = NodeRegistration.model_validate_json(row[0])
            capabilities = registration.capabilities.model_copy(update={"pools": list(pools)})
            updated = registration.model_copy(update={"capabilities": capabilities})
            db.execute("UPDATE nodes SET registration = %s WHERE node_id = %s", (updated.model_dump_json(), node_id))
            return True

    def seen(self, node_id: str, at: float) -> bool:
        if "\x00" in node_id:
            return False
        return self.database.execute("UPDATE nodes SET last_seen = GREATEST(last_seen, %s) WHERE node_id = %s",
                                     (float(at), node_id)) > 0

    def count_accepted(self, node_id: str) -> bool:
        if "\x00" in node_id:
            return False
        return self.database.execute("UPDATE nodes SET accepted = accepted + 1 WHERE node_id = %s", (node_id,)) > 0


def _node(row: tuple[Any, ...]) -> StoredNode:
    registration, last_seen, accepted = row
    return StoredNode(NodeRegistration.model_validate_json(registration), float(last_seen), int(accepted))
