"""``ProfileCache`` implementations: in memory, and SQLite (one table, WAL, a busy timeout,
a schema version table), so a profile measured once is reused until its key changes.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

from flashruntime.errors import InvalidProfileRequest, StoreError
from flashruntime.protocol.profile_v1alpha1 import ProfileResult

__all__ = ["InMemoryProfileCache", "SqliteProfileCache"]

SCHEMA_VERSION = 1


class InMemoryProfileCache:
    """Results in a dict; for tests and one-process use."""

    def __init__(self) -> None:
        self._results: dict[str, str] = {}
        self._lock = threading.Lock()

    def get(self, key: str) -> ProfileResult | None:
        with self._lock:
            raw = self._results.get(key)
        return None if raw is None else ProfileResult.model_validate_json(raw)

    def put(self, key: str, result: ProfileResult) -> None:
        _check_key(key)
        with self._lock:
            self._results[key] = result.model_dump_json()


def _check_key(key: object) -> None:
    if not isinstance(key, str) or not key:
        raise InvalidProfileRequest(
            f"a profile cache key must be a non-empty string, got {key!r}; build it with profile_key(...)"
        )


class SqliteProfileCache:
    """Results in a SQLite file: ``profiles(key PRIMARY KEY, result JSON)``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(os.path.expanduser(str(path)))
        if self.path.is_dir():
            raise InvalidProfileRequest(
                f"profile cache path {str(self.path)!r} is a directory; give a file path such as "
                f"{str(self.path / 'profiles.sqlite')!r}"
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        try:
            with self._connect() as db:
                db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
                db.execute("CREATE TABLE IF NOT EXISTS profiles (key TEXT PRIMARY KEY, result TEXT NOT NULL)")
                if db.execute("SELECT COUNT(*) FROM schema_version").fetchone()[0] == 0:
                    db.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
        except sqlite3.Error as exc:
            raise StoreError(f"profile cache {str(self.path)!r} cannot be opened: {exc}") from exc

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        return _Transaction(db)

    def get(self, key: str) -> ProfileResult | None:
        try:
            with self._lock, self._connect() as db:
                row = db.execute("SELECT result FROM profiles WHERE key = ?", (key,)).fetchone()
        except sqlite3.Error as exc:
            raise StoreError(f"profile cache {str(self.path)!r} cannot be read: {exc}") from exc
        return None if row is None else ProfileResult.model_validate_json(row[0])

    def put(self, key: str, result: ProfileResult) -> None:
        _check_key(key)
        try:
            with self._lock, self._connect() as db:
                db.execute("INSERT OR REPLACE INTO profiles (key, result) VALUES (?, ?)",
                           (key, result.model_dump_json()))
        except sqlite3.Error as exc:
            raise StoreError(f"profile cache {str(self.path)!r} cannot be written: {exc}") from exc


class _Transaction:
    """``with``: BEGIN IMMEDIATE, COMMIT or ROLLBACK, then close."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> sqlite3.Connection:
        self._db.execute("BEGIN IMMEDIATE")
        return self._db

    def __exit__(self, kind: object, value: object, traceback: object) -> None:
        try:
            self._db.execute("COMMIT" if kind is None else "ROLLBACK")
        finally:
            self._db.close()
