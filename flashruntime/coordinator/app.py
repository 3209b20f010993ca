"""The coordinator's FastAPI app; the only module that needs the ``service`` extra.

Importing this module has no side effects: ``app`` is built on first access (once,
cached) when ``FLASHML_SERVICE_AUTOINIT`` is ``"1"`` (the default), else it is None.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import time
import warnings
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from flashruntime.coordinator.access import ROUTE_ACCESS
from flashruntime.coordinator.body_limit import BodyLimit
from flashruntime.coordinator.core import Coordinator
from flashruntime.coordinator.disk_space import is_disk_full
from flashruntime.coordinator.guard import Guard, client_address, route_key
from flashruntime.coordinator.openapi import add_security, add_value_rules
from flashruntime.coordinator.rate_limit import FailureCounter, RateLimiter
from flashruntime.coordinator.routes_fleet import fleet_router
from flashruntime.coordinator.routes_jobs import jobs_router
from flashruntime.coordinator.routes_meta import meta_router
from flashruntime.coordinator.settings import RuntimeSettings
from flashruntime.coordinator.url_tokens import RefuseURLTokens, install_access_log_redaction
from flashruntime.errors import FlashRuntimeError, PersistenceError, StorageFull

__all__ = ["create_app"]

log = logging.getLogger("flashruntime.service")

_ARTIFACT_PATH = "/v1alpha1/artifacts/"


def create_app(settings: RuntimeSettings | None = None) -> FastAPI:
    """Wire a coordinator from ``settings`` (None → ``RuntimeSettings.from_env()``) and
    return its app. With ``FLASHML_REQUIRE_NODE_AUTH=1`` and no tokens configured this
    raises ``RuntimeError`` rather than serving an open fleet by mistake."""
    if settings is None:
        settings = RuntimeSettings.from_env()
    # FastAPI passes each body parameter's name as a Field alias, which recent pydantic
    # reports once per route as "has no effect": noise in every coordinator log, not ours to fix.
    warnings.filterwarnings("ignore", message=r"The 'alias' attribute with value '\w+' was provided to the `Field\(\)`")
    coordinator = Coordinator(settings)
    if settings.require_node_auth and not coordinator.authenticator.enforcing:
        coordinator.close()
        raise RuntimeError(
            "FLASHML_REQUIRE_NODE_AUTH=1 but no tokens are configured: set FLASHML_NODE_TOKENS "
            "(node_id:token,...), FLASHML_SUBMITTER_TOKENS and/or FLASHML_OPERATOR_TOKENS (name:token,...)"
        )

    install_access_log_redaction()

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        install_access_log_redaction()  # again: a server's logging setup may have come after create_app
        _throttle_accept_errors(settings.accept_error_log_interval_s)
        try:
            await asyncio.to_thread(coordinator.start_backends)  # the Ray cluster, when one is set
        except BaseException:
            coordinator.close()
            raise
        sweeper = asyncio.create_task(_sweep_forever(coordinator), name="flashruntime-sweeper")
        try:
            yield
        finally:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
            coordinator.close()

    # No /docs or /redoc (their pages load assets from a CDN); the schema is /openapi.json,
    # served by a guarded route like every other.
    app = FastAPI(title="FlashRuntime", version=_version(), lifespan=lifespan, openapi_url=None, docs_url=None,
                  redoc_url=None)
    app.state.coordinator = coordinator
    rate = settings.rate_limit_for(coordinator.authenticator.enforcing)
    auth_failures = FailureCounter(settings.auth_failure_limit, settings.auth_failure_window_s) \
        if settings.auth_failure_limit > 0 else None
    guard = Guard(coordinator, rate_limiter=RateLimiter(rate) if rate > 0 else None, auth_failures=auth_failures,
                  metrics_public=settings.metrics_public)

    @app.exception_handler(FlashRuntimeError)
    async def _refused(request: Request, exc: FlashRuntimeError) -> JSONResponse:
        return _refusal(request, exc)

    @app.exception_handler(OSError)
    async def _os_error(request: Request, exc: OSError) -> JSONResponse:
        # ENOSPC and EDQUOT are an outage to wait out; any other OSError is a fault of the
        # server, answered 500 as it was raised.
        if not is_disk_full(exc):
            raise exc
        return _refusal(request, _disk_full(exc))

    @app.exception_handler(RequestValidationError)
    async def _invalid_body(_: Request, exc: RequestValidationError) -> JSONResponse:
        # The problems without the input they quote: a refused body is never echoed back.
        return JSONResponse({"detail": [_issue(error) for error in exc.errors()]}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> Response:
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=getattr(exc, "headers", None))


    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes,
                                 description="The FlashRuntime coordinator's HTTP API (v1alpha1).")
            app.openapi_schema = add_value_rules(add_security(schema, metrics_public=settings.metrics_public))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    routers = [meta_router(coordinator, guard, openapi), jobs_router(coordinator, guard),
               fleet_router(coordinator, guard)]
    _check_access_table([route for router in routers for route in router.routes])
    for router in routers:
        app.include_router(router)
    app.add_middleware(_Timed, metrics=coordinator.metrics)
    app.add_middleware(BodyLimit, limit_for=_body_limits(settings), empty_refusal=_empty_refusal)
    # Outermost: a token in the URL is refused before any other part of the app sees the request.
    app.add_middleware(RefuseURLTokens, on_refused=(lambda scope: auth_failures.record(client_address(scope)))
                       if auth_failures is not None else (lambda scope: None))
    return app


def _refusal(request: Request, exc: FlashRuntimeError) -> JSONResponse:
    """The one map from the error family to answers: ``http_status``, ``{"detail": ...}`` and
    the error's headers. An error without a status is no refusal: raised on, it is a 500."""
    if isinstance(exc, PersistenceError) and not isinstance(exc, StorageFull) and is_disk_full(exc):
        exc = _disk_full(exc)  # a database that says the disk is full: the outage StorageFull is
    if exc.http_status is None:
        raise exc
    if exc.public_detail is not None:
        # What the caller is not told (the file, the database's own words) is the operator's.
        log.error("%s %s: %s", request.method, request.url.path, exc,
                  exc_info=None if is_disk_full(exc) else exc.__cause__)
    return JSONResponse({"detail": exc.http_detail()}, status_code=exc.http_status, headers=exc.http_headers())


def _disk_full(cause: BaseException) -> StorageFull:
    full = StorageFull(errno.ENOSPC, f"the disk is full: {cause}")
    full.__cause__ = cause
    return full


def _throttle_accept_errors(interval_s: float) -> None:
    try:
        from flashruntime.coordinator.listener import install_accept_error_throttle  # needs uvicorn's h11 protocol
    except ImportError:  # served by another ASGI server: its accept loop is its own
        return
    install_accept_error_throttle(asyncio.get_running_loop(), interval_s)


def _empty_refusal(scope: Any) -> str | None:
    if scope.get("method") == "PUT" and str(scope.get("path", "")).startswith(_ARTIFACT_PATH):
        return ("the artifact body is empty: an artifact holds at least one byte; nothing was stored (send the "
                "file's content, or leave an empty file out)")
    return None


class _Timed:
    """Pure ASGI middleware: every request into the latency histogram, by route template.
    (Not ``BaseHTTPMiddleware``: that runs the app in a task group, which turns an error
    raised while a body is read into an exception group no handler recognises.)"""

    def __init__(self, app: Any, metrics: Any) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # what the server answers when the app raises before responding

        async def seen(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, seen)
        finally:
            template = getattr(scope.get("route"), "path", None) or "<unmatched>"
            self.metrics.observe_request(scope.get("method", ""), template, status, time.perf_counter() - start)


def _body_limits(settings: RuntimeSettings) -> Any:
    """``scope -> (limit in bytes, refusal)``: artifact uploads by ``max_artifact_mb``, every
    other body (JSON) by ``max_json_kb``."""
    artifact = (settings.max_artifact_mb * 1024 * 1024,
                (f"the artifact is over the coordinator's limit of {settings.max_artifact_mb} MiB "
                 "(FLASHML_MAX_ARTIFACT_MB)"))
    json_body = (settings.max_json_kb * 1024,
                 (f"the request body is over the coordinator's limit of {settings.max_json_kb} KiB "
                  "(FLASHML_MAX_JSON_KB); large data goes in an artifact (PUT /v1alpha1/artifacts/<key>)"))

    def limit_for(scope: Any) -> tuple[int, str]:
        is_upload = scope.get("method") == "PUT" and str(scope.get("path", "")).startswith(_ARTIFACT_PATH)
        return artifact if is_upload else json_body

    return limit_for


def _issue(error: dict[str, Any]) -> dict[str, Any]:
    message = str(error.get("msg", ""))
    reason = (error.get("ctx") or {}).get("error")
    if error.get("type") == "json_invalid" and reason:
        message = f"the body is not acceptable JSON: {reason}"
    return {"loc": [part if isinstance(part, (str, int)) else str(part) for part in error.get("loc", ())],
            "msg": message, "type": str(error.get("type", ""))}


def _check_access_table(routes: list[Any]) -> None:
    """Every route has exactly its row in ``ROUTE_ACCESS``, and every row its route: a
    route added without deciding who may call it stops the coordinator from starting."""
    served = {route_key(method, route.path) for route in routes if isinstance(route, APIRoute)
              for method in route.methods}
    missing = sorted(served - set(ROUTE_ACCESS))
    stale = sorted(set(ROUTE_ACCESS) - served)
    if missing or stale:
        raise RuntimeError(f"the access table does not match the routes: no row for {missing}, no route for {stale}")


def _version() -> str:
    import flashruntime

    return flashruntime.__version__


async def _sweep_forever(coordinator: Coordinator) -> None:
    """Every ``sweep_interval_s``: expire overdue leases, refresh derived job states. A
    failed round is logged and the loop goes on: the next round retries it."""
    interval = coordinator.settings.sweep_interval_s
    while True:
        try:
            await asyncio.to_thread(coordinator.sweep_once)
        except Exception:
            log.exception("sweep failed; retrying in %.1f s", interval)
        await asyncio.sleep(interval)


_cached: dict[str, Any] = {}


def __getattr__(name: str) -> Any:
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if "app" not in _cached:
        _cached["app"] = create_app() if os.environ.get("FLASHML_SERVICE_AUTOINIT", "1") == "1" else None
    return _cached["app"]
