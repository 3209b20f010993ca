"""Compatibility import path: database URLs live in ``flashruntime.db.url`` now."""

from flashruntime.db.url import FORMS, DatabaseURL, mask_password, parse_database_url, sqlite_url

__all__ = ["FORMS", "DatabaseURL", "mask_password", "parse_database_url", "sqlite_url"]
