"""The database layer under every store: one SQLite file or one PostgreSQL server behind a
shared, re-entrant transaction (``SqliteDatabase``, ``PostgresDatabase``), their errors
translated into ``StoreError``, schema versions, database URLs, the owned-database lifecycle
of a store (``DatabaseStore``), and PostgreSQL's ``SessionLock``. psycopg is imported only
when a PostgreSQL database is opened."""

from flashruntime.db.owned import DatabaseStore
from flashruntime.db.postgres import PostgresDatabase
from flashruntime.db.postgres_errors import is_retryable, translate_postgres_errors
from flashruntime.db.session_lock import SessionLock
from flashruntime.db.sqlite import SqliteDatabase, has_table, recorded_version
from flashruntime.db.sqlite_errors import translate_sqlite_errors
from flashruntime.db.url import DatabaseURL, mask_password, parse_database_url, sqlite_url

__all__ = [
    "DatabaseStore",
    "DatabaseURL",
    "PostgresDatabase",
    "SessionLock",
    "SqliteDatabase",
    "has_table",
    "is_retryable",
    "mask_password",
    "parse_database_url",
    "recorded_version",
    "sqlite_url",
    "translate_postgres_errors",
    "translate_sqlite_errors",
]
