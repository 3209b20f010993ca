"""SQLite's own errors stop at the stores: ``translate_sqlite_errors`` makes every public
method of a store class raise ``StoreError`` (naming the database file, with the
original as its cause) where SQLite raised ``sqlite3.Error``. Standard library only."""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar

from flashruntime.db._wrapping import wrap_public_methods
from flashruntime.errors import StoreError

__all__ = ["translate_sqlite_errors"]

_C = TypeVar("_C", bound=type)


def _translating(method: Callable[..., Any], where: Callable[[Any], str]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except sqlite3.Error as exc:
            raise StoreError(
                f"{where(self)}: SQLite failed ({type(exc).__name__}: {exc}); the file may be locked by another "
                "process past the busy timeout, on a full disk, or damaged"
            ) from exc

    return call


def translate_sqlite_errors(where: Callable[[Any], str]) -> Callable[[_C], _C]:
    """A class decorator: its public methods, inherited ones included (and ``__enter__``/
    ``__exit__``), raise ``StoreError`` instead of ``sqlite3.Error``; ``where(instance)``
    names the database."""

    def decorate(cls: _C) -> _C:
        return wrap_public_methods(cls, "sqlite", lambda method: _translating(method, where))

    return decorate
