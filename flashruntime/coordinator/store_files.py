"""Data directories that keep one SQLite file per store (``leases.db`` with tasks,
leases and cordons, ``checkpoints.db`` with manifests and parts, beside the ledger's
file) join the coordinator's one database on its first start.

Each file is copied in one transaction that also records it in ``store_imports``, so
an import interrupted by a crash left nothing and runs again, and a finished one never
runs twice. Only then is the file renamed ``<name>.imported``: the coordinator no
longer reads it, and nothing in it is lost if you keep it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path

from flashruntime.checkpoint.sqlite_store import SqliteManifestStore
from flashruntime.db.sqlite import SqliteDatabase
from flashruntime.files import fsync_directory
from flashruntime.leases.sqlite_store import SqliteLeaseStore

__all__ = ["IMPORTED_SUFFIX", "import_store_files"]

log = logging.getLogger("flashruntime.service")

IMPORTED_SUFFIX = ".imported"
_SIDECARS = ("-wal", "-shm")  # SQLite's files beside a WAL database, named after it
_IMPORTS = ("CREATE TABLE IF NOT EXISTS store_imports ("
            " file TEXT PRIMARY KEY, imported_at TEXT NOT NULL, rows INTEGER NOT NULL)")

# The tables each file holds, with their columns, in the order they are copied. Rows go in
# in rowid order, so what a store reads in insertion order (lease history) keeps its order.
TABLES: dict[str, tuple[tuple[str, str], ...]] = {
    "leases.db": (
        ("lease_tasks", "job_id, task_id, seq, spec_json, state, attempts_used, failures_seen, expiries_seen, "
                        "active_lease_id, active_node_id, deadline, active_lease_json, accepted_attempt_id, "
                        "accepted_output_sha256, releases_seen"),
        ("lease_history", "lease_id, job_id, task_id, lease_json"),
        ("lease_cordons", "node_id, until, reason"),
    ),
    "checkpoints.db": (
        ("checkpoint_manifests", "manifest_id, scope, seq, manifest_json"),
        ("checkpoint_parts", "job_id, attempt_id, step, key, sha256, size_bytes"),
    ),
}


def import_store_files(db: SqliteDatabase, files: Mapping[str, Path]) -> dict[str, int]:
    """Copy each file of ``files`` (``{"leases.db": path, "checkpoints.db": path}``) that
    exists into ``db``, whose tables must already exist; → rows copied per file name (0 for
    a file imported before). ``RuntimeError`` naming the file when ``db`` already holds rows
    of that file's tables that did not come from it: the two cannot be merged safely."""
    copied: dict[str, int] = {}
    with db.transaction():
        db.connection.execute(_IMPORTS)
    for name, path in files.items():
        path = Path(path)
        if not path.is_file() or _same_file(path, db.path):
            continue
        if _imported(db, name):
            _set_aside(path, already=True)
            copied[name] = 0
            continue
        _open_as_current_schema(name, path)
        copied[name] = _copy(db, name, path)
        log.info("imported %s (%d rows) into %s; the file is kept as %s%s", path, copied[name], db.path, path.name,
                 IMPORTED_SUFFIX)
        _set_aside(path, already=False)
    return copied


def _same_file(path: Path, other: Path) -> bool:
    try:
        return path.resolve() == other.resolve()
    except OSError:
        return False


def _imported(db: SqliteDatabase, name: str) -> bool:
    with db.lock:
        return db.connection.execute("SELECT 1 FROM store_imports WHERE file = ?", (name,)).fetchone() is not None


def _open_as_current_schema(name: str, path: Path) -> None:
    """Open the file with its own store once, so an older layout of it is migrated in place
    (in that file, in one transaction) and a newer one is refused, before anything is copied."""
    store = SqliteLeaseStore(path) if name == "leases.db" else SqliteManifestStore(path)
    store.close()


def _copy(db: SqliteDatabase, name: str, path: Path) -> int:
    conn = db.connection
    with db.lock:
        conn.execute("ATTACH DATABASE ? AS imported", (str(path),))  # SQLite refuses ATTACH inside a transaction
        try:
            with db.transaction():
                if conn.execute("SELECT 1 FROM store_imports WHERE file = ?", (name,)).fetchone() is not None:
                    return 0  # another process sharing the database imported it meanwhile
                for table, _ in TABLES[name]:
                    if conn.execute(f"SELECT EXISTS (SELECT 1 FROM main.{table})").fetchone()[0]:
                        raise RuntimeError(
                            f"{path} holds {table} rows, and so does {db.path}, which did not import them from "
                            f"this file: the two cannot be merged. Move {path.name} out of {path.parent} to start "
                            f"with what {db.path.name} holds, or move {db.path.name} away to start from {path.name}"
                        )
                rows = 0
                for table, columns in TABLES[name]:
                    rows += conn.execute(f"INSERT INTO main.{table} ({columns}) "
                                         f"SELECT {columns} FROM imported.{table} ORDER BY rowid").rowcount
                conn.execute("INSERT INTO store_imports (file, imported_at, rows) VALUES (?, ?, ?)",
                             (name, datetime.now(timezone.utc).isoformat(timespec="microseconds"), rows))
                return rows
        finally:
            conn.execute("DETACH DATABASE imported")


def _set_aside(path: Path, *, already: bool) -> None:
    """Rename an imported file (and the SQLite files beside it, if any) to ``<name>.imported``.
    A second file of the same name, found after the first was set aside, is left where it is."""
    target = path.with_name(path.name + IMPORTED_SUFFIX)
    if already and target.exists():
        log.warning("%s was imported before (it is kept as %s); this %s is not read: move it away", path.name,
                    target.name, path.name)
        return
    for sidecar in _SIDECARS:
        beside = path.with_name(path.name + sidecar)
        if beside.exists():
            os.replace(beside, target.with_name(target.name + sidecar))
    os.replace(path, target)
    fsync_directory(path.parent)
