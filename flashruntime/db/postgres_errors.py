"""psycopg's errors stop at the database layer: each becomes a ``StoreError`` whose message
says what went wrong with the server and how to fix it, with psycopg's error (and its
``sqlstate``) as the cause. ``translate_postgres_errors`` does that for every public method
of a class. psycopg (the ``postgres`` extra) is imported when an error is read, not with
this module."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any, TypeVar

from flashruntime.db._wrapping import wrap_public_methods
from flashruntime.errors import StoreError

__all__ = ["describe", "is_retryable", "translate_postgres_errors"]

_INSTALL = "install the PostgreSQL driver with pip install 'flashruntime[postgres]' (psycopg, psycopg-pool)"
_C = TypeVar("_C", bound=type)
# SQLSTATE classes and codes that say a transaction lost a race and may simply be run again.
_RETRYABLE = {"40001": "a serialization failure", "40P01": "a deadlock"}
# What the server says when it refuses a connection, and the SQLSTATE it means.
_CONNECT_REFUSALS = (
    ("3D000", re.compile(r'FATAL:\s+database ".*" does not exist')),
    ("28000", re.compile(r'FATAL:\s+(role ".*" does not exist|no pg_hba\.conf entry)')),
    ("28P01", re.compile(r"FATAL:\s+password authentication failed|no password supplied")),
)


def _driver() -> tuple[Any, Any]:
    """``(psycopg, psycopg_pool)``; ``StoreError`` saying what to install when they are missing."""
    try:
        import psycopg
        import psycopg_pool
    except ImportError as exc:
        raise StoreError(f"PostgreSQL needs psycopg and psycopg-pool, which are not installed: {_INSTALL}") from exc
    return psycopg, psycopg_pool


def is_retryable(exc: BaseException) -> bool:
    """Whether ``exc`` (a ``StoreError`` of this layer, or psycopg's own error) says that its
    transaction lost a race with another (a deadlock, a serialization failure) and was rolled
    back: running the whole transaction again is then correct, and likely to succeed."""
    return any(getattr(error, "sqlstate", None) in _RETRYABLE for error in (exc, exc.__cause__))


def describe(exc: BaseException, where: str, source: str) -> str | None:
    """The message of the ``StoreError`` that replaces psycopg's ``exc`` (``where`` names the
    database, ``source`` the setting its URL came from); None when ``exc`` is not psycopg's."""
    module = type(exc).__module__
    if not module.startswith(("psycopg", "psycopg_pool")):
        return None
    psycopg, psycopg_pool = _driver()
    if not isinstance(exc, psycopg.Error):
        return None
    detail = str(exc).strip().replace("\n", " ") or type(exc).__name__
    sqlstate = getattr(exc, "sqlstate", None) or ""
    if isinstance(exc, psycopg_pool.PoolTimeout):
        return (f"{where}: no connection came free in time ({detail}); the server may be down or unreachable, "
                f"or every connection of the pool busy (raise its max_size, or the server's max_connections)")
    if sqlstate in _RETRYABLE:
        return f"{where}: the transaction was rolled back after {_RETRYABLE[sqlstate]} ({detail}); run it again"
    if not sqlstate and isinstance(exc, psycopg.OperationalError):
        # A refused connection carries no SQLSTATE, only the server's message.
        sqlstate = next((code for code, pattern in _CONNECT_REFUSALS if pattern.search(detail)), "")
    if sqlstate == "3D000":
        return f"{where}: the database does not exist ({detail}); create it (createdb), or correct {source}"
    if sqlstate.startswith("28"):
        return f"{where}: the server refused the login ({detail}); correct the user or password in {source}"
    if sqlstate == "57014":
        return f"{where}: a statement was cancelled ({detail})"
    if isinstance(exc, psycopg.OperationalError) and not sqlstate:
        return (f"{where}: the server cannot be reached or the connection was lost ({detail}); check that "
                f"PostgreSQL is running and that {source} names the right host and port")
    return f"{where}: PostgreSQL failed ({type(exc).__name__}{f' {sqlstate}' if sqlstate else ''}: {detail})"


def translated(exc: Exception, where: str, source: str) -> Exception:
    """What to raise for ``exc``: a ``StoreError`` (``exc`` its cause) when it is psycopg's,
    else ``exc`` itself."""
    message = describe(exc, where, source)
    if message is None:
        return exc
    error = StoreError(message)
    error.__cause__ = exc
    return error


def _translating(method: Callable[..., Any], where: Callable[[Any], str],
                 source: Callable[[Any], str]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except StoreError:
            raise
        except Exception as exc:
            error = translated(exc, where(self), source(self))
            if error is exc:
                raise
            raise error from exc

    return call


def _the_url(instance: object) -> str:
    return "the database URL"


def translate_postgres_errors(where: Callable[[Any], str],
                              source: Callable[[Any], str] = _the_url) -> Callable[[_C], _C]:
    """A class decorator: its public methods, inherited ones included (and ``__enter__``/
    ``__exit__``), raise ``StoreError`` instead of psycopg's errors; ``where(instance)`` names
    the database, ``source(instance)`` the setting its URL came from."""

    def decorate(cls: _C) -> _C:
        return wrap_public_methods(cls, "postgres", lambda method: _translating(method, where, source))

    return decorate
