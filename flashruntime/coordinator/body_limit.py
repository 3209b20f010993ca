"""Request body limits, enforced before a body is read whole.

An ASGI middleware in front of the whole app: a request whose ``Content-Length`` is over
its route's limit is answered 413 at once, without reading its body; one that arrives
without a length (chunked) is cut off with 413 as soon as what was received passes the
limit. Artifact uploads have their own, larger limit; every other body is JSON. A route
that needs content (an artifact upload) refuses an empty body when it reads it
(``EmptyArtifact``, answered 400 by the app).

A body cut off as it is read raises ``BodyTooLarge``, which the app answers like every
refusal of the family; one refused by its length is answered here, before the app runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from flashruntime.errors import BodyTooLarge, EmptyArtifact  # BodyTooLarge is defined there, re-exported here

__all__ = ["BodyLimit", "BodyTooLarge"]


class BodyLimit:
    """Refuse bodies over ``limit_for(scope) -> (bytes, message)`` with 413, and empty ones
    where ``empty_refusal(scope)`` gives a message (None: an empty body is fine)."""

    def __init__(self, app: ASGIApp, limit_for: Callable[[Scope], tuple[int, str]],
                 empty_refusal: Callable[[Scope], str | None] = lambda scope: None) -> None:
        self.app = app
        self.limit_for = limit_for
        self.empty_refusal = empty_refusal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, message = self.limit_for(scope)
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _refuse(send, message)  # the body is never read
            return
        empty = self.empty_refusal(scope)  # refused as the body is read: after the route's own checks of the key
        received = 0

        async def limited() -> Message:
            nonlocal received
            event = await receive()
            if event["type"] == "http.request":
                received += len(event.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(message)
                if empty is not None and received == 0 and not event.get("more_body", False):
                    raise EmptyArtifact(empty)
            return event

        await self.app(scope, limited, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _refuse(send: Send, message: str) -> None:
    body = json.dumps({"detail": BodyTooLarge(message).http_detail()}).encode("utf-8")
    headers: list[Any] = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                          (b"connection", b"close")]
    await send({"type": "http.response.start", "status": BodyTooLarge.http_status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
