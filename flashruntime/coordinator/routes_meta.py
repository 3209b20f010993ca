"""Routes about the coordinator itself: health probes, Prometheus metrics, the OpenAPI
schema and the dashboard page; and about the caller, as the coordinator sees it (``whoami``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Response
from fastapi.responses import HTMLResponse, JSONResponse

from flashruntime.coordinator.access import submitter_prefix
from flashruntime.coordinator.auth import Identity
from flashruntime.coordinator.core import Coordinator
from flashruntime.coordinator.dashboard import DASHBOARD_HTML
from flashruntime.coordinator.disk_space import space_problem
from flashruntime.coordinator.guard import Guard, StrictJSONRoute
from flashruntime.coordinator.metrics import CONTENT_TYPE
from flashruntime.coordinator.openapi import ERRORS
from flashruntime.protocol.api_v1alpha1 import Caller, Health
from flashruntime.protocol.v1alpha1 import TaskState

__all__ = ["meta_router"]


def meta_router(coordinator: Coordinator, guard: Guard, openapi: Callable[[], dict[str, Any]]) -> APIRouter:
    router = APIRouter(route_class=StrictJSONRoute, dependencies=[guard.dependency()], responses=ERRORS)
    settings = coordinator.settings
    caller = Depends(guard.caller)
    # The database's directory when it is a SQLite file, and the artifacts' directory.
    data_dirs = ([settings.database.path.parent] if settings.database.path is not None else []) + \
        [Path(settings.artifacts_dir)]

    def alive() -> JSONResponse:
        return JSONResponse({"status": "ok", "profile": coordinator.settings.profile})

    @router.get("/healthz", response_model=Health)
    def healthz() -> JSONResponse:
        return alive()

    @router.get("/livez", response_model=Health)
    def livez() -> JSONResponse:
        return alive()

    @router.get("/readyz", response_model=Health,
                responses={503: {"model": Health, "description": "a database does not answer, or a data "
                                                                "directory is below its free-space floor"}})
    def readyz() -> JSONResponse:
        problem = coordinator.readiness_problem() or space_problem(data_dirs, settings.min_free_bytes)
        if problem is not None:
            return JSONResponse({"status": "unavailable", "profile": coordinator.settings.profile,
                                 "detail": problem}, status_code=503)
        return JSONResponse({"status": "ok", "profile": coordinator.settings.profile})

    @router.get("/metrics", response_class=Response,
                responses={200: {"content": {CONTENT_TYPE: {"schema": {"type": "string"}}},
                                 "description": "Prometheus text exposition format 0.0.4"}})
    def metrics() -> Response:
        now = coordinator.now()
        manager = coordinator.manager
        counts = manager.store.counts()  # type: ignore[attr-defined]
        tasks_by_state = {state.value: int(counts.get(state.value, 0)) for state in TaskState}
        live = sum(1 for record in manager.store.leased()  # type: ignore[attr-defined]
                   if record.active_lease is not None and record.active_lease.deadline > now)
        nodes = coordinator.nodes.status_counts(manager.cordoned(now), now)
        return Response(coordinator.metrics.render(tasks_by_state, live, nodes), media_type=CONTENT_TYPE)

    @router.get("/v1alpha1/whoami", response_model=Caller,
                description="The caller as the coordinator sees it: role, name, whether its jobs may run "
                            "commands (FLASHML_ARGV_SUBMITTERS; anyone in open mode) and the artifact prefix a "
                            "submitter uploads inputs under before it has a job.")
    def whoami(identity: Identity = caller) -> JSONResponse:
        role = identity.role
        return JSONResponse(Caller(
            role=None if role is None else role.value, name=identity.name,
            may_run_code=role is None or identity.may_run_code,
            artifact_prefix=submitter_prefix(identity.name) if identity.submitter and identity.name else None,
        ).model_dump(mode="json"))

    @router.get("/openapi.json", include_in_schema=False)
    def openapi_schema() -> JSONResponse:
        return JSONResponse(openapi())

    @router.get("/", response_class=HTMLResponse, include_in_schema=False)
    def dashboard() -> str:
        return DASHBOARD_HTML

    return router
