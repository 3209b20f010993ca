"""Pieces of the coordinator's HTTP protocol that every stdlib client needs (the worker
agent, the FedAvg and K-means drivers): path quoting, the error detail of a response, and
which failures are worth retrying."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse

__all__ = ["error_detail", "is_transient", "quote_key", "quote_segment"]

_DETAIL_CHARS = 500


def quote_segment(value: object) -> str:
    """One path segment (a job, node or lease id): every ``/`` is escaped."""
    return urllib.parse.quote(str(value), safe="")


def quote_key(key: str) -> str:
    """An artifact key, whose ``/`` separators stay: ``/v1alpha1/artifacts/{key:path}``."""
    return urllib.parse.quote(key, safe="/")


def error_detail(exc: urllib.error.HTTPError) -> str:
    """FastAPI's ``{"detail": ...}`` of an error response, else its text (capped), else the reason."""
    try:
        raw = exc.read()
    except (OSError, http.client.HTTPException):
        return exc.reason if isinstance(exc.reason, str) else ""
    try:
        parsed = json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")[:_DETAIL_CHARS]
    if isinstance(parsed, dict) and "detail" in parsed:
        return str(parsed["detail"])[:_DETAIL_CHARS]
    return str(parsed)[:_DETAIL_CHARS]


def is_transient(exc: BaseException) -> bool:
    """Connection errors, HTTP 5xx and 429 (the coordinator's rate limit) are worth retrying;
    other 4xx and everything else is not."""
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code >= 500 or exc.code == 429
    return isinstance(exc, (urllib.error.URLError, ConnectionError, TimeoutError, http.client.HTTPException))
