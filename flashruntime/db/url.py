"""Database URLs: which database the coordinator keeps its state in, and how to show one
without its password.

``sqlite:///absolute/path/flashruntime.db`` names a SQLite file;
``postgresql://user:password@host:port/database`` (or ``postgres://``, libpq's URL, query
parameters allowed) a PostgreSQL database. ``parse_database_url`` checks the form only;
opening the database is the stores' job. Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

from flashruntime.errors import BadDatabaseURL

__all__ = ["DatabaseURL", "mask_password", "parse_database_url", "sqlite_url"]

FORMS = "sqlite:///absolute/path/flashruntime.db or postgresql://user:password@host:port/database"
_POSTGRES_SCHEMES = ("postgresql", "postgres")
_MASK = "***"
# libpq also takes the password as a query parameter.
_QUERY_PASSWORD = re.compile(r"(?i)(\bpassword=)[^&]*")


@dataclass(frozen=True)
class DatabaseURL:
    """A checked database URL. ``kind`` is ``"sqlite"`` (``path``: the file) or
    ``"postgresql"`` (``url``: what libpq connects to). ``str()`` and ``repr()`` show it
    with the password masked; ``url`` itself keeps it."""

    kind: str
    url: str
    path: Path | None = None

    @property
    def masked(self) -> str:
        return mask_password(self.url)

    def __str__(self) -> str:
        return self.masked

    def __repr__(self) -> str:
        return f"DatabaseURL({self.masked!r})"


def sqlite_url(path: str | Path) -> DatabaseURL:
    """The SQLite file at ``path`` (made absolute; ``":memory:"``: a private in-memory database)."""
    if str(path) == ":memory:":
        return DatabaseURL("sqlite", "sqlite:///:memory:", Path(":memory:"))
    absolute = Path(path).expanduser().absolute()
    return DatabaseURL("sqlite", f"sqlite://{absolute.as_posix()}", absolute)


def parse_database_url(url: str, *, source: str = "the database URL") -> DatabaseURL:
    """``url`` checked: ``BadDatabaseURL`` naming ``source`` (the setting it came from) when
    it is not one of the two forms. Never quotes the password."""
    if not isinstance(url, str):
        raise BadDatabaseURL(f"{source} must be a string, got {type(url).__name__}")
    text = url.strip()
    scheme, sep, rest = text.partition("://")
    scheme = scheme.lower()
    if not sep:
        raise BadDatabaseURL(f"{source} is not a URL ({mask_password(text)!r}); write it as {FORMS}")
    if scheme == "sqlite":
        path = unquote(rest.split("?", 1)[0])
        if not path.startswith("/") or path.rstrip("/") == "":
            raise BadDatabaseURL(
                f"{source} {mask_password(text)!r} does not name an absolute file path; write it as "
                "sqlite:///absolute/path/flashruntime.db (three slashes, then the path)")
        return sqlite_url(path)
    if scheme in _POSTGRES_SCHEMES:
        parts = urlsplit(text)
        try:
            parts.port  # noqa: B018  (a port that is not a number raises here)
        except ValueError:
            raise BadDatabaseURL(f"{source} {mask_password(text)!r} has a port that is not a number; "
                                 f"write it as {FORMS}") from None
        return DatabaseURL("postgresql", "postgresql://" + rest)
    raise BadDatabaseURL(f"{source} has the scheme {scheme + '://'!r}, which is not a database this coordinator "
                         f"opens; write it as {FORMS}")


def mask_password(url: str) -> str:
    """``url`` with its password (in the user part or a ``password=`` parameter) replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return _QUERY_PASSWORD.sub(rf"\g<1>{_MASK}", url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        if ":" in userinfo:
            netloc = f"{userinfo.split(':', 1)[0]}:{_MASK}@{hostport}"
    query = _QUERY_PASSWORD.sub(rf"\g<1>{_MASK}", parts.query)
    if (netloc, query) == (parts.netloc, parts.query):
        return url  # nothing to hide (and urlunsplit would drop the empty host of sqlite:///path)
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
