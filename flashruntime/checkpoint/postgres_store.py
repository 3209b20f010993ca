"""Committed manifests and the registry of uploaded parts in PostgreSQL, shared by every
coordinator replica.

The SQLite store's tables on a server: a manifest row per id holding its JSON, in
insertion order (``seq``), and one row per registered part. Every write is one statement
(an insert or an upsert), so concurrent writers need no locks of their own; on a shared
``PostgresDatabase`` a write joins the transaction its thread has open, so a manifest
and the event that announces it commit together.
"""

from __future__ import annotations

from typing import Any

from flashruntime.db.owned import DatabaseStore
from flashruntime.db.postgres import PostgresDatabase
from flashruntime.protocol.v1alpha1 import CheckpointManifest, CheckpointPart

__all__ = ["SCHEMA_VERSION", "PostgresManifestStore", "stored_schema_version"]

SCHEMA_VERSION = "1"

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS checkpoint_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS checkpoint_manifests (
        manifest_id TEXT COLLATE "C" PRIMARY KEY,
        scope TEXT COLLATE "C" NOT NULL,
        seq BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
        manifest_json TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS checkpoint_manifests_scope_seq ON checkpoint_manifests (scope, seq)",
    """CREATE TABLE IF NOT EXISTS checkpoint_parts (
        job_id TEXT COLLATE "C" NOT NULL,
        attempt_id TEXT COLLATE "C" NOT NULL,
        step BIGINT NOT NULL,
        key TEXT COLLATE "C" NOT NULL,
        sha256 TEXT NOT NULL,
        size_bytes BIGINT NOT NULL,
        PRIMARY KEY (job_id, attempt_id, step, key)
    )""",
)
_ADD = (
    "INSERT INTO checkpoint_manifests (manifest_id, scope, manifest_json) VALUES (%s, %s, %s) "
    "ON CONFLICT (manifest_id) DO NOTHING"
)
# An update keeps the row, so its ``seq`` (the manifest's position) is kept too.
_SAVE = (
    "INSERT INTO checkpoint_manifests (manifest_id, scope, manifest_json) VALUES (%s, %s, %s) "
    "ON CONFLICT (manifest_id) DO UPDATE SET scope = EXCLUDED.scope, manifest_json = EXCLUDED.manifest_json"
)
_PUT_PART = (
    "INSERT INTO checkpoint_parts (job_id, attempt_id, step, key, sha256, size_bytes) VALUES (%s, %s, %s, %s, %s, %s) "
    "ON CONFLICT (job_id, attempt_id, step, key) DO UPDATE SET sha256 = EXCLUDED.sha256, "
    "size_bytes = EXCLUDED.size_bytes"
)
_BIGINT_MAX = 2**63 - 1


def _storable(*values: str) -> bool:
    """Whether PostgreSQL's ``text`` can hold every value (it cannot hold NUL)."""
    return not any("\x00" in value for value in values)


def stored_schema_version(database: PostgresDatabase) -> str | None:
    """The checkpoint store's schema version recorded in ``database``, or None where it has no
    checkpoint tables yet. Reads only."""
    return database.recorded_version("checkpoint_meta")


class PostgresManifestStore(DatabaseStore[PostgresDatabase]):
    """``ManifestStore`` plus the part registry, in PostgreSQL.

    ``database`` is a URL (the store opens and owns a ``PostgresDatabase``) or a
    ``PostgresDatabase`` shared with other stores (whose owner closes it). The
    constructor creates the schema; a database written with another schema version is
    refused (``RuntimeError`` naming it) rather than misread.
    """

    def __init__(self, database: str | PostgresDatabase, **options: Any) -> None:
        db = self._open_database(
            database, PostgresDatabase, lambda: PostgresDatabase(database, **options),  # type: ignore[arg-type]
            lambda db: db.ensure_schema(meta_table="checkpoint_meta", version=SCHEMA_VERSION, statements=_SCHEMA,
                                        what="checkpoint"))
        self.where = db.where

    # --- ManifestStore -----------------------------------------------------------

    def add(self, manifest: CheckpointManifest) -> None:
        _check_text(manifest)
        added = self.database.execute(_ADD, (manifest.manifest_id, manifest.job_id, manifest.model_dump_json()))
        if not added:
            raise ValueError(f"manifest {manifest.manifest_id!r} is already stored; use save() to update it")

    def save(self, manifest: CheckpointManifest) -> None:
        _check_text(manifest)
        self.database.execute(_SAVE, (manifest.manifest_id, manifest.job_id, manifest.model_dump_json()))

    def get(self, manifest_id: str) -> CheckpointManifest | None:
        if not _storable(manifest_id):
            return None
        row = self.database.fetchone("SELECT manifest_json FROM checkpoint_manifests WHERE manifest_id = %s",
                                     (manifest_id,))
        return None if row is None else CheckpointManifest.model_validate_json(row[0])

    def all(self, scope: str | None = None) -> list[CheckpointManifest]:
        if scope is None:
            rows = self.database.fetchall("SELECT manifest_json FROM checkpoint_manifests ORDER BY seq")
        elif _storable(scope):
            rows = self.database.fetchall(
                "SELECT manifest_json FROM checkpoint_manifests WHERE scope = %s ORDER BY seq", (scope,))
        else:
            rows = []
        return [CheckpointManifest.model_validate_json(row[0]) for row in rows]

    # --- part registry -----------------------------------------------------------

    def put_part(self, job_id: str, attempt_id: str, step: int, part: CheckpointPart) -> None:
        for name, value in (("step", step), ("size_bytes", part.size_bytes)):
            if not -_BIGINT_MAX - 1 <= int(value) <= _BIGINT_MAX:
                raise ValueError(
                    f"checkpoint part {part.key!r}: {name} {value} is beyond the largest integer the part registry "
                    f"can hold ({_BIGINT_MAX}); a real {name} is far smaller, so check what computed it"
                )
        if not _storable(job_id, attempt_id, part.key, part.sha256):
            raise ValueError(f"checkpoint part {part.key!r} of job {job_id!r}: ids cannot contain NUL characters")
        self.database.execute(_PUT_PART, (job_id, attempt_id, int(step), part.key, part.sha256, int(part.size_bytes)))

    def parts(self, job_id: str, attempt_id: str, step: int) -> dict[str, tuple[str, int]]:
        if not -_BIGINT_MAX - 1 <= int(step) <= _BIGINT_MAX or not _storable(job_id, attempt_id):
            return {}  # put_part never registers such a part
        rows = self.database.fetchall(
            "SELECT key, sha256, size_bytes FROM checkpoint_parts "
            "WHERE job_id = %s AND attempt_id = %s AND step = %s ORDER BY key",
            (job_id, attempt_id, int(step)),
        )
        return {str(key): (str(sha), int(size)) for key, sha, size in rows}


def _check_text(manifest: CheckpointManifest) -> None:
    if not _storable(manifest.manifest_id, manifest.job_id):
        raise ValueError(f"manifest {manifest.manifest_id!r} of job {manifest.job_id!r}: "
                         "ids cannot contain NUL characters")
