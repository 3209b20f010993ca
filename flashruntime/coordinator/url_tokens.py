"""Tokens in URLs: refused before anything logs them.

A URL is written to access logs, proxy logs and browser history, so a credential in its
query string (``?token=``, ``?access_token=``, ``?api_key=``, ``?key=``) is answered 401
saying to send it in the ``Authorization`` header instead, and the server's access log
line for such a request shows the path with its query string replaced by ``?<redacted>``.
"""

from __future__ import annotations

import json
import logging
import urllib.parse
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["ACCESS_LOGGER", "REDACTED", "TOKEN_PARAMETERS", "RedactURLTokens", "RefuseURLTokens",
           "install_access_log_redaction", "names_a_token", "redacted_path"]

TOKEN_PARAMETERS = frozenset({"token", "access_token", "api_key", "key"})
# Spellings compared with '-', '_' and '.' taken out and in lower case: ``apiKey``,
# ``access-token`` and ``X-Auth-Token`` are the same mistake as the names above.
_CREDENTIAL_WORDS = frozenset({"token", "accesstoken", "apikey", "key", "authtoken", "authorization", "bearer",
                               "password", "passwd", "secret", "clientsecret", "joincode", "jwt", "session"})
ACCESS_LOGGER = "uvicorn.access"
REDACTED = "?<redacted>"
REFUSAL = ("a token in the URL is refused: URLs are written to logs and browser history; send it as the header "
           "'Authorization: Bearer <token>' and drop the query parameter (token, access_token, api_key, key or any other credential name)")


def names_a_token(query: str | bytes) -> bool:
    """Whether a query string carries a credential's name (``TOKEN_PARAMETERS``, other spellings of
    them, any name ending in "token"), with a value or not."""
    text = query.decode("latin-1") if isinstance(query, bytes) else query
    if not text:
        return False
    # Some servers and proxies split a query at ';' as well as '&': a name after either counts.
    for field in text.replace(";", "&").split("&"):
        name = urllib.parse.unquote_plus(field.partition("=")[0])
        word = "".join(char for char in name.lower() if char not in "-_. ")
        if word in _CREDENTIAL_WORDS or word.endswith("token"):
            return True
    return False


def redacted_path(path_with_query: str) -> str:
    """``path_with_query`` with its query string hidden when it names a token."""
    path, mark, query = path_with_query.partition("?")
    return f"{path}{REDACTED}" if mark and names_a_token(query) else path_with_query


class RefuseURLTokens:
    """ASGI middleware: a request whose query string names a token is answered 401 without
    reaching the app; ``on_refused(scope)`` is told of each (a failed authentication)."""

    def __init__(self, app: ASGIApp, on_refused: Callable[[Scope], None] = lambda scope: None) -> None:
        self.app = app
        self.on_refused = on_refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not names_a_token(scope.get("query_string", b"")):
            await self.app(scope, receive, send)
            return
        self.on_refused(scope)
        body = json.dumps({"detail": REFUSAL}).encode("utf-8")
        headers: list[Any] = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                              (b"www-authenticate", b"Bearer")]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class RedactURLTokens(logging.Filter):
    """Rewrites uvicorn's access log records (``client, method, path, version, status``) so
    a path whose query string names a token is logged as ``path?<redacted>``."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str) and "?" in args[2]:
            record.args = (*args[:2], redacted_path(args[2]), *args[3:])
        return True


def install_access_log_redaction() -> None:
    """Add ``RedactURLTokens`` to the access logger, once (uvicorn's logging setup keeps it)."""
    logger = logging.getLogger(ACCESS_LOGGER)
    if not any(isinstance(existing, RedactURLTokens) for existing in logger.filters):
        logger.addFilter(RedactURLTokens())
