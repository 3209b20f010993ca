"""Routes of jobs, artifacts and checkpoints (SPEC §9.2), plus health, metrics and the
dashboard."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request, Response
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse

from flashruntime.errors import CheckpointError, ExpansionError
from flashruntime.protocol.v1alpha1 import (
    ArtifactRecord,
    CommitRequest,
    JobRecord,
    JobSpec,
    RegisterPartRequest,
    TaskState,
)
from flashruntime.service._artifacts import ArtifactConflict, ArtifactTooLarge, BadArtifactKey, check_key
from flashruntime.service._coordinator import Coordinator, NoBackend
from flashruntime.service._dashboard import DASHBOARD_HTML
from flashruntime.service._metrics import CONTENT_TYPE
from flashruntime.service._routes_fleet import identity_of
from flashruntime.service.auth import AuthFailure, Identity, task_write_allowed, write_allowed

__all__ = ["jobs_router"]


def _record_json(record: JobRecord, status_code: int = 200) -> JSONResponse:
    return JSONResponse(record.model_dump(mode="json"), status_code=status_code)


def jobs_router(coordinator: Coordinator) -> APIRouter:
    router = APIRouter()
    enforcing = coordinator.authenticator.enforcing

    def job_or_404(job_id: str) -> JobRecord:
        record = coordinator.job(job_id)
        if record is None:
            raise HTTPException(404, f"unknown job {job_id!r}")
        return record

    def live_pairs(identity: Identity) -> set[tuple[str, str]]:
        if identity.node_id is None:
            return set()
        return coordinator.manager.live_leases_for_node(identity.node_id, now=coordinator.now())

    def check_artifact_write(request: Request, key: str, *, received: bool = False) -> None:
        if not enforcing:
            return
        identity = identity_of(coordinator, request)
        if not write_allowed(identity, key, live_pairs(identity)):
            late = "; the lease ended while the body was uploading, so nothing was stored" if received else ""
            raise AuthFailure(403, f"writing {key!r} needs a live lease on its jobs/<job>/<task>/ prefix{late}")

    def check_task_write(request: Request, job_id: str, task_id: str) -> None:
        if not enforcing:
            return
        identity = identity_of(coordinator, request)
        if not task_write_allowed(identity, job_id, task_id, live_pairs(identity)):
            raise AuthFailure(403, f"checkpoint writes for {job_id}/{task_id} need a live lease on that task")

    @router.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok", "profile": coordinator.settings.profile}

    @router.post("/v1alpha1/jobs", status_code=201, response_model=None)
    def submit(spec: JobSpec) -> JSONResponse:
        try:
            record = coordinator.submit(spec)
        except ExpansionError as exc:
            raise HTTPException(422, str(exc)) from None
        except NoBackend as exc:
            raise HTTPException(503, str(exc)) from None
        return _record_json(record, 201)

    @router.get("/v1alpha1/jobs", response_model=None)
    def jobs() -> JSONResponse:
        return JSONResponse([record.model_dump(mode="json") for record in coordinator.jobs()])

    @router.get("/v1alpha1/jobs/{job_id}", response_model=None)
    def job(job_id: str) -> JSONResponse:
        return _record_json(job_or_404(job_id))

    @router.get("/v1alpha1/jobs/{job_id}/events", response_model=None)
    def events(job_id: str) -> JSONResponse:
        job_or_404(job_id)
        return JSONResponse([event.model_dump(mode="json") for event in coordinator.ledger.events_for(job_id)])

    @router.get("/v1alpha1/jobs/{job_id}/logs")
    def logs(job_id: str) -> dict[str, str]:
        job_or_404(job_id)
        return {"logs": ""}  # lease jobs run on their workers; their logs are the workers'

    @router.post("/v1alpha1/jobs/{job_id}/cancel", response_model=None)
    def cancel(job_id: str) -> JSONResponse:
        record = coordinator.cancel(job_id)
        if record is None:
            raise HTTPException(404, f"unknown job {job_id!r}")
        return _record_json(record)

    @router.get("/v1alpha1/jobs/{job_id}/tasks")
    def tasks(job_id: str) -> list[dict[str, Any]]:
        job_or_404(job_id)
        return coordinator.tasks(job_id)

    @router.get("/v1alpha1/jobs/{job_id}/artifacts")
    def job_artifacts(job_id: str) -> list[dict[str, Any]]:
        job_or_404(job_id)  # only a job's own directory: an id like '..' is no job
        try:
            listed = coordinator.artifacts.list(f"jobs/{job_id}/")
        except BadArtifactKey as exc:
            raise HTTPException(400, str(exc)) from None
        return [{"uri": f"artifact://{key}", "key": key, "size_bytes": size} for key, size in listed]

    @router.put("/v1alpha1/artifacts/{key:path}", response_model=None)
    async def put_artifact(key: str, request: Request) -> JSONResponse:
        try:
            check_key(key)
        except BadArtifactKey as exc:
            raise HTTPException(400, str(exc)) from None
        check_artifact_write(request, key)  # before reading the body ...
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > coordinator.artifacts.max_bytes:
            raise HTTPException(413, f"artifact {key!r} ({declared} bytes) is over the coordinator's limit of "
                                     f"{coordinator.settings.max_artifact_mb} MiB")
        try:  # ... and after, before the rename: the lease may have ended during the upload
            sha256, size = await coordinator.artifacts.write(
                key, request.stream(), commit_check=lambda: check_artifact_write(request, key, received=True)
            )
        except ArtifactTooLarge as exc:
            raise HTTPException(413, str(exc)) from None
        except ArtifactConflict as exc:
            raise HTTPException(409, str(exc)) from None
        except BadArtifactKey as exc:  # a path the file system refuses, e.g. too long as a whole
            raise HTTPException(400, str(exc)) from None
        record = ArtifactRecord(uri=f"artifact://{key}", backend="local", bucket=str(coordinator.artifacts.root),
                                object_key=key, sha256=sha256, size_bytes=size)
        return JSONResponse(record.model_dump(mode="json"))

    @router.get("/v1alpha1/artifacts/{key:path}", response_model=None)
    def get_artifact(key: str) -> FileResponse:
        try:
            path = coordinator.artifacts.read_path(key)
        except BadArtifactKey as exc:
            raise HTTPException(400, str(exc)) from None
        if path is None:
            raise HTTPException(404, f"no artifact {key!r}")
        return FileResponse(path, media_type="application/octet-stream")

    @router.post("/v1alpha1/jobs/{job_id}/tasks/{task_id}/checkpoints/parts")
    def register_part(job_id: str, task_id: str, body: RegisterPartRequest, request: Request) -> dict[str, str]:
        check_task_write(request, job_id, task_id)
        job_or_404(job_id)  # a checkpoint belongs to a job: none is kept for an id the ledger never had
        try:
            coordinator.catalog.register_part(f"{job_id}::{task_id}", body.attempt_id, body.step, body.part)
        except ValueError as exc:  # a value the registry cannot hold (beyond SQLite's 64-bit integers)
            raise HTTPException(422, str(exc)) from None
        return {"status": "registered", "key": body.part.key}

    @router.post("/v1alpha1/jobs/{job_id}/tasks/{task_id}/checkpoints/commit", response_model=None)
    def commit_checkpoint(job_id: str, task_id: str, body: CommitRequest, request: Request) -> JSONResponse:
        check_task_write(request, job_id, task_id)
        job_or_404(job_id)
        try:
            manifest = coordinator.catalog.commit(
                job_id=f"{job_id}::{task_id}", attempt_id=body.attempt_id, step=body.step,
                expected_parts=body.expected_parts, storage_prefix=body.storage_prefix, world_size=body.world_size,
                framework=body.framework, strategy_family=body.strategy_family,
            )
        except CheckpointError as exc:
            raise HTTPException(409, str(exc)) from None
        return JSONResponse(manifest.model_dump(mode="json"))

    @router.get("/v1alpha1/jobs/{job_id}/tasks/{task_id}/checkpoints/latest", response_model=None)
    def latest_checkpoint(job_id: str, task_id: str, world_size: int | None = Query(None)) -> JSONResponse:
        job_or_404(job_id)
        manifest = coordinator.catalog.latest_valid(f"{job_id}::{task_id}", world_size=world_size)
        if manifest is None:
            raise HTTPException(404, f"no selectable checkpoint for {job_id}/{task_id}")
        return JSONResponse(manifest.model_dump(mode="json"))

    @router.get("/v1alpha1/jobs/{job_id}/tasks/{task_id}/checkpoints/lost-work")
    def lost_work(job_id: str, task_id: str, failed_at_step: int = Query(...)) -> dict[str, int | None]:
        job_or_404(job_id)
        scope = f"{job_id}::{task_id}"
        latest = coordinator.catalog.latest_valid(scope)
        return {
            "lost_steps": coordinator.catalog.lost_work(scope, failed_at_step),
            "latest_step": latest.step if latest is not None else None,
        }

    @router.get("/metrics", response_model=None)
    def metrics() -> Response:
        now = coordinator.now()
        manager = coordinator.manager
        counts = manager.store.counts()  # type: ignore[attr-defined]
        tasks_by_state = {state.value: int(counts.get(state.value, 0)) for state in TaskState}
        live = sum(1 for record in manager.store.leased()  # type: ignore[attr-defined]
                   if record.active_lease is not None and record.active_lease.deadline > now)
        nodes = coordinator.nodes.status_counts(manager.cordoned(now), now)
        return Response(coordinator.metrics.render(tasks_by_state, live, nodes), media_type=CONTENT_TYPE)

    @router.get("/", response_class=HTMLResponse)
    def dashboard() -> str:
        return DASHBOARD_HTML

    return router
