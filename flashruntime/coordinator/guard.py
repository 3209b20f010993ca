"""The coordinator's front door: who is calling, may they call this route, and is the
request body something the coordinator will read.

``Guard`` resolves the caller's ``Identity`` once per request, applies the per-credential
rate limit and checks the route's roles in ``access.ROUTE_ACCESS``. A client address that
failed to authenticate too often is answered 429 before its token is even looked at, so
a wrong guess and a right one look the same while it is blocked. ``StrictJSONRoute``
parses request bodies as strict JSON: NaN and infinities (not JSON), strings that are
not valid Unicode (lone surrogates) and nesting too deep are refused with 422 naming
where, before any model sees them, so nothing stored can later fail to render.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Depends, Request, Response
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from flashruntime.coordinator.access import ROUTE_ACCESS, RouteAccess
from flashruntime.coordinator.auth import ON_BEHALF_OF_HEADER, AuthFailure, Identity, require_role, resolve_identity
from flashruntime.errors import BodyProblem, FlashRuntimeError, RateLimited  # BodyProblem, RateLimited: re-exported

__all__ = ["AUTH_FAILURES_REASON", "BodyProblem", "Guard", "RateLimited", "StrictJSONRoute", "client_address",
           "parse_strict_json", "route_key"]

_CONVERTER = re.compile(r"\{(\w+):\w+\}")
_MAX_DEPTH = 64  # JSON objects and arrays nested deeper than any wire model needs


AUTH_FAILURES_REASON = "too many failed authentications from this address"


def client_address(scope: Any) -> str:
    """The client's address as the server saw it ("" when unknown, e.g. a Unix socket)."""
    client = scope.get("client")
    return str(client[0]) if client else ""


def route_key(method: str, path: str) -> tuple[str, str]:
    """``(METHOD, template)`` as ``ROUTE_ACCESS`` and the OpenAPI schema write it
    (``{key:path}`` → ``{key}``)."""
    return method.upper(), _CONVERTER.sub(r"{\1}", path)


def _walk_problem(value: Any) -> BodyProblem | None:
    """The first value no stored record could render again: a non-finite number (NaN and
    Infinity are not JSON, 1e999 overflows), a string that is not valid Unicode (a lone
    surrogate), nesting beyond ``_MAX_DEPTH``. None if there is none."""
    stack: list[tuple[Any, list[str | int]]] = [(value, [])]
    while stack:
        item, loc = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return BodyProblem(loc, f"{item} is not a finite number: JSON has no NaN or Infinity; send a finite "
                                        "number, or null", "finite_number")
        elif isinstance(item, str):
            if not _encodable(item):
                return BodyProblem(loc, "this string is not valid Unicode (it holds a lone surrogate); send UTF-8 "
                                        "text", "unicode")
        elif isinstance(item, (dict, list)):
            if len(loc) >= _MAX_DEPTH:
                return BodyProblem(loc, f"objects and arrays are nested more than {_MAX_DEPTH} deep", "too_deep")
            if isinstance(item, dict):
                for key, inner in reversed(list(item.items())):
                    if not _encodable(key):
                        return BodyProblem(loc, "a key of this object is not valid Unicode (it holds a lone "
                                                "surrogate); send UTF-8 text", "unicode")
                    stack.append((inner, [*loc, key]))
            else:
                stack.extend((inner, [*loc, index]) for index, inner in reversed(list(enumerate(item))))
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse_strict_json(body: bytes) -> Any:
    """``body`` parsed as strict JSON. Invalid JSON raises ``json.JSONDecodeError`` (FastAPI
    answers 422); JSON that parses but holds a value no record could render again raises
    ``BodyProblem`` naming where (see ``_walk_problem``)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise json.JSONDecodeError(f"the body is not UTF-8 ({exc.reason})", "", exc.start) from None
    try:
        value = json.loads(text)
    except RecursionError:
        raise BodyProblem([], f"objects and arrays are nested more than {_MAX_DEPTH} deep", "too_deep") from None
    if _certainly_clean(value):
        return value
    problem = _walk_problem(value)
    if problem is not None:
        raise problem
    return value


_CONTAINERS = (dict, list)


def _certainly_clean(value: Any) -> bool:
    """Whether ``value`` holds none of ``_walk_problem``'s problems, found without a Python
    step per value: the C encoder refuses non-finite numbers (``allow_nan=False``) and the
    UTF-8 codec lone surrogates, and the depth is counted a level of containers at a time.
    False only sends the body to the walk, which names where the problem is."""
    try:
        json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except (ValueError, UnicodeEncodeError, RecursionError):
        return False
    level = [value] if value.__class__ in _CONTAINERS else []
    depth = 0
    while level:
        if depth >= _MAX_DEPTH:
            return False
        below: list[Any] = []
        for item in level:
            below.extend([inner for inner in (item.values() if item.__class__ is dict else item)
                          if inner.__class__ in _CONTAINERS])
        level = below
        depth += 1
    return True


class _StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            # On a worker thread: walking a large body is CPU work the event loop must not wait
            # on, or every other request (the nodes' heartbeats among them) waits with it.
            self._json = await run_in_threadpool(parse_strict_json, await self.body())
        return self._json


class StrictJSONRoute(APIRoute):
    """An ``APIRoute`` whose JSON bodies are parsed by ``parse_strict_json``, and whose
    refusals raised while FastAPI reads the body (``BodyProblem``, ``BodyTooLarge``) reach
    the app's handler as themselves."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            try:
                return await handler(_StrictJSONRequest(request.scope, request.receive))
            except HTTPException as exc:
                # FastAPI answers any error but its own raised while it reads a body with a bare
                # 400, the error as its cause: a refusal of ours is raised again to be answered.
                refusal = exc.__cause__
                if isinstance(refusal, FlashRuntimeError) and refusal.http_status is not None:
                    raise refusal from refusal.__cause__
                raise

        return strict


class Guard:
    """FastAPI dependencies for every route: ``caller`` (the identity, resolved once per
    request) and ``check`` (rate limit, then the route's roles)."""

    def __init__(self, coordinator: Any, *, rate_limiter: Any = None, auth_failures: Any = None,
                 metrics_public: bool = False) -> None:
        self._coordinator = coordinator
        self._authenticator = coordinator.authenticator
        self._rate_limiter = rate_limiter
        self._auth_failures = auth_failures
        self._metrics_public = metrics_public

    @property
    def enforcing(self) -> bool:
        return bool(self._authenticator.enforcing)

    def access_of(self, request: Request) -> RouteAccess:
        route = request.scope.get("route")
        key = route_key(request.method, getattr(route, "path", request.url.path))
        if key == ("HEAD", key[1]):
            key = ("GET", key[1])
        access = ROUTE_ACCESS.get(key)
        if access is None:  # create_app refuses routes without a row, so only a bug gets here
            raise AuthFailure(403, f"{key[0]} {key[1]} has no access rule")
        if key == ("GET", "/metrics") and self._metrics_public:
            return RouteAccess(frozenset(), access.scope)
        return access

    async def caller(self, request: Request) -> Identity:
        """The caller's identity; 401 when tokens are configured and none valid was sent
        on a route that needs one. Open routes resolve nobody."""
        access = self.access_of(request)
        if access.open:
            return Identity(None, False)
        address = client_address(request.scope)
        if self._auth_failures is not None:
            wait_s = self._auth_failures.blocked(address)
            if wait_s is not None:
                raise RateLimited(wait_s, AUTH_FAILURES_REASON)
        try:
            return resolve_identity(
                self._authenticator, request.headers.get("authorization"),
                request.headers.getlist(ON_BEHALF_OF_HEADER)
            )
        except AuthFailure as failure:
            # A token that is not known counts; a request without one (a page's first load) does not.
            if failure.status_code == 401 and self._auth_failures is not None and request.headers.get("authorization"):
                self._auth_failures.record(address)
            raise

    def dependency(self) -> Any:
        """The router-level dependency: ``check`` with the identity from ``caller``."""

        async def guard(request: Request, identity: Identity = Depends(self.caller)) -> None:
            self.check(request, identity)

        return Depends(guard)

    def check(self, request: Request, identity: Identity) -> None:
        access = self.access_of(request)
        if access.open:
            return
        if self._rate_limiter is not None:
            key = _limit_key(identity, request)
            wait_s = self._rate_limiter.acquire(key)
            if wait_s is not None:
                raise RateLimited(wait_s)
        require_role(identity, access.roles, enforcing=self.enforcing)


def _limit_key(identity: Identity, request: Request) -> tuple[str, str]:
    if identity.node_id is not None:
        return ("node", identity.node_id)
    if identity.role is not None:
        return (identity.role.value, identity.name or "")
    client = request.client
    return ("address", client.host if client is not None else "")
