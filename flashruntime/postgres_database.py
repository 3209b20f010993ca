"""Compatibility import path: ``PostgresDatabase`` lives in ``flashruntime.db.postgres`` now,
``SessionLock`` in ``flashruntime.db.session_lock`` and the error translation in
``flashruntime.db.postgres_errors``."""

from flashruntime.db.postgres import PostgresDatabase
from flashruntime.db.postgres_errors import is_retryable, translate_postgres_errors
from flashruntime.db.session_lock import SessionLock
from flashruntime.errors import StoreError

__all__ = ["PostgresDatabase", "SessionLock", "StoreError", "is_retryable", "translate_postgres_errors"]
