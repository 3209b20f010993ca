"""``DatabaseStore``: the lifecycle every store on a database shares. A store opens its own
database (and closes it with the store) or is given one shared with other stores (whose
owner closes it); a database it opened is closed again when setting the store up fails."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["Closable", "DatabaseStore"]


class Closable(Protocol):
    """What a store needs of its database to own it: a label for messages, and ``close()``."""

    @property
    def label(self) -> str: ...

    def close(self) -> None: ...


D = TypeVar("D", bound=Closable)


class DatabaseStore(Generic[D]):
    """A store on ``database``, which it owns (``close()`` closes it) or shares."""

    database: D
    _owns_db: bool

    def _open_database(self, given: object, kind: type[D], open_database: Callable[[], D],
                       set_up: Callable[[D], None]) -> D:
        """``given`` when it is a ``kind`` (shared), else ``open_database()`` (owned); then
        ``set_up(database)`` (the schema), closing an owned database again when that raises."""
        if isinstance(given, kind):
            database, owns = given, False
        else:
            database, owns = open_database(), True
        self.database, self._owns_db = database, owns
        try:
            set_up(database)
        except BaseException:
            if owns:
                database.close()
            raise
        return database

    def close(self) -> None:
        """Close the database this store opened; a shared one is its owner's to close."""
        if self._owns_db:
            self.database.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.database.label!r})"
