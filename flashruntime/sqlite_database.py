"""Compatibility import path: ``SqliteDatabase`` lives in ``flashruntime.db.sqlite`` now."""

from flashruntime.db.sqlite import SqliteDatabase, has_table, recorded_version

__all__ = ["SqliteDatabase", "has_table", "recorded_version"]
