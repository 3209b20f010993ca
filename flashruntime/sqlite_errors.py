"""Compatibility import path: ``translate_sqlite_errors`` lives in ``flashruntime.db.sqlite_errors`` now."""

from flashruntime.db.sqlite_errors import translate_sqlite_errors

__all__ = ["translate_sqlite_errors"]
