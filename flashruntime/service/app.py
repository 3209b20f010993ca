"""The coordinator's FastAPI app (SPEC §9.1); the only module that needs the ``service`` extra.

Importing this module has no side effects: ``app`` is built on first access (once,
cached) when ``FLASHML_SERVICE_AUTOINIT`` is ``"1"`` (the default), else it is None.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import warnings
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from flashruntime.service._coordinator import Coordinator
from flashruntime.service._routes_fleet import fleet_router
from flashruntime.service._routes_jobs import jobs_router
from flashruntime.service.auth import AuthFailure
from flashruntime.service.settings import RuntimeSettings

__all__ = ["create_app"]

log = logging.getLogger("flashruntime.service")


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
    if os.environ.get("FLASHML_REQUIRE_NODE_AUTH") == "1" and not coordinator.authenticator.enforcing:
        coordinator.close()
        raise RuntimeError(
            "FLASHML_REQUIRE_NODE_AUTH=1 but no tokens are configured: set FLASHML_NODE_TOKENS "
            "(node_id:token,...) and/or FLASHML_OPERATOR_TOKENS (name:token,...)"
        )

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        sweeper = asyncio.create_task(_sweep_forever(coordinator), name="flashruntime-sweeper")
        try:
            yield
        finally:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
            coordinator.close()

    app = FastAPI(title="FlashRuntime", lifespan=lifespan)
    app.state.coordinator = coordinator

    @app.exception_handler(AuthFailure)
    async def _auth_failure(_: Request, exc: AuthFailure) -> JSONResponse:
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    @app.middleware("http")
    async def _timed(request: Request, call_next: Any) -> Response:
        start = time.perf_counter()

        def observe(status: int) -> None:
            route = request.scope.get("route")
            template = getattr(route, "path", None) or "<unmatched>"
            coordinator.metrics.observe_request(request.method, template, status, time.perf_counter() - start)

        try:
            response: Response = await call_next(request)
        except Exception:
            observe(500)  # the server answers a handler's exception with 500, outside this middleware
            raise
        observe(response.status_code)
        return response

    app.include_router(jobs_router(coordinator))
    app.include_router(fleet_router(coordinator))
    return app


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
