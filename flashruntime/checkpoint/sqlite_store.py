"""Committed manifests and the registry of uploaded parts in SQLite, so a
coordinator restart keeps both.

WAL, ``synchronous=FULL``, a busy timeout, ``BEGIN IMMEDIATE`` around every write and
bound parameters only; several processes may share one file. State lives in SQLite:
the constructor only creates the parent directory and the schema. On a shared
``SqliteDatabase`` a write joins the transaction its caller has open, so a manifest
and the event that announces it commit together.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from flashruntime.db.owned import DatabaseStore
from flashruntime.db.sqlite import SqliteDatabase, recorded_version
from flashruntime.db.sqlite_errors import translate_sqlite_errors
from flashruntime.protocol.v1alpha1 import CheckpointManifest, CheckpointPart

__all__ = ["SCHEMA_VERSION", "SqliteManifestStore", "stored_schema_version"]

SCHEMA_VERSION = "1"

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS checkpoint_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS checkpoint_manifests ("
    " manifest_id TEXT PRIMARY KEY,"
    " scope TEXT NOT NULL,"
    " seq INTEGER NOT NULL UNIQUE,"
    " manifest_json TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS checkpoint_manifests_scope_seq ON checkpoint_manifests (scope, seq)",
    "CREATE TABLE IF NOT EXISTS checkpoint_parts ("
    " job_id TEXT NOT NULL,"
    " attempt_id TEXT NOT NULL,"
    " step INTEGER NOT NULL,"
    " key TEXT NOT NULL,"
    " sha256 TEXT NOT NULL,"
    " size_bytes INTEGER NOT NULL,"
    " PRIMARY KEY (job_id, attempt_id, step, key))",
)


def stored_schema_version(connection: sqlite3.Connection) -> str | None:
    """The checkpoint store's schema version recorded in the database of ``connection`` (read-only
    will do), or None where it has no checkpoint tables yet. Reads only."""
    return recorded_version(connection, "checkpoint_meta")


@translate_sqlite_errors(lambda store: f"manifest store {store.path}")
class SqliteManifestStore(DatabaseStore[SqliteDatabase]):
    """``ManifestStore`` plus the part registry, in the SQLite file at ``path``, or in a
    ``SqliteDatabase`` shared with other stores (whose owner closes it).

    ``":memory:"`` gives a private in-memory database (useful in tests). A file written
    with another schema version is refused (``RuntimeError``) rather than misread.
    """

    def __init__(self, path: str | os.PathLike[str] | SqliteDatabase, *, busy_timeout_ms: int = 5000) -> None:
        def open_file() -> SqliteDatabase:
            return SqliteDatabase(os.fspath(path), busy_timeout_ms=busy_timeout_ms)  # type: ignore[arg-type]

        db = self._open_database(
            path, SqliteDatabase, open_file,
            lambda db: db.ensure_schema(meta_table="checkpoint_meta", version=SCHEMA_VERSION, statements=_SCHEMA,
                                        what="checkpoint"))
        self.path = os.fspath(db.path)
        self._lock = db.lock
        self._conn = db.connection

    # --- plumbing -------------------------------------------------------------

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Cursor]:
        with self.database.transaction():
            cur = self._conn.cursor()
            try:
                yield cur
            finally:
                cur.close()

    def _query(self, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    # --- ManifestStore -----------------------------------------------------------

    def add(self, manifest: CheckpointManifest) -> None:
        payload = manifest.model_dump_json()
        with self._write() as cur:
            if cur.execute(
                "SELECT 1 FROM checkpoint_manifests WHERE manifest_id = ?", (manifest.manifest_id,)
            ).fetchone():
                raise ValueError(f"manifest {manifest.manifest_id!r} is already stored; use save() to update it")
            cur.execute(
                "INSERT INTO checkpoint_manifests (manifest_id, scope, seq, manifest_json) "
                "VALUES (?, ?, (SELECT COALESCE(MAX(seq), 0) + 1 FROM checkpoint_manifests), ?)",
                (manifest.manifest_id, manifest.job_id, payload),
            )

    def save(self, manifest: CheckpointManifest) -> None:
        payload = manifest.model_dump_json()
        with self._write() as cur:
            cur.execute(
                "UPDATE checkpoint_manifests SET scope = ?, manifest_json = ? WHERE manifest_id = ?",
                (manifest.job_id, payload, manifest.manifest_id),
            )
            if cur.rowcount == 0:
                cur.execute(
                    "INSERT INTO checkpoint_manifests (manifest_id, scope, seq, manifest_json) "
                    "VALUES (?, ?, (SELECT COALESCE(MAX(seq), 0) + 1 FROM checkpoint_manifests), ?)",
                    (manifest.manifest_id, manifest.job_id, payload),
                )

    def get(self, manifest_id: str) -> CheckpointManifest | None:
        rows = self._query("SELECT manifest_json FROM checkpoint_manifests WHERE manifest_id = ?", (manifest_id,))
        return CheckpointManifest.model_validate_json(rows[0][0]) if rows else None  # type: ignore[arg-type]

    def all(self, scope: str | None = None) -> list[CheckpointManifest]:
        if scope is None:
            rows = self._query("SELECT manifest_json FROM checkpoint_manifests ORDER BY seq")
        else:
            rows = self._query("SELECT manifest_json FROM checkpoint_manifests WHERE scope = ? ORDER BY seq", (scope,))
        return [CheckpointManifest.model_validate_json(row[0]) for row in rows]  # type: ignore[arg-type]

    # --- part registry -----------------------------------------------------------

    def put_part(self, job_id: str, attempt_id: str, step: int, part: CheckpointPart) -> None:
        for name, value in (("step", step), ("size_bytes", part.size_bytes)):
            if not _fits_sqlite_integer(value):
                raise ValueError(
                    f"checkpoint part {part.key!r}: {name} {value} is beyond the largest integer the part registry "
                    f"can hold ({_SQLITE_INT_MAX}); a real {name} is far smaller, so check what computed it"
                )
        with self._write() as cur:
            cur.execute(
                "INSERT OR REPLACE INTO checkpoint_parts (job_id, attempt_id, step, key, sha256, size_bytes) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (job_id, attempt_id, int(step), part.key, part.sha256, int(part.size_bytes)),
            )

    def parts(self, job_id: str, attempt_id: str, step: int) -> dict[str, tuple[str, int]]:
        if not _fits_sqlite_integer(step):
            return {}  # put_part never registers such a step
        rows = self._query(
            "SELECT key, sha256, size_bytes FROM checkpoint_parts "
            "WHERE job_id = ? AND attempt_id = ? AND step = ? ORDER BY key",
            (job_id, attempt_id, int(step)),
        )
        return {str(key): (str(sha), int(size)) for key, sha, size in rows}  # type: ignore[call-overload]


_SQLITE_INT_MAX = 2**63 - 1


def _fits_sqlite_integer(value: int) -> bool:
    """Whether SQLite's INTEGER (signed 64-bit) holds ``value``; the wire models leave steps and
    sizes unbounded, and sqlite3 raises a bare OverflowError beyond that range."""
    return -_SQLITE_INT_MAX - 1 <= int(value) <= _SQLITE_INT_MAX
