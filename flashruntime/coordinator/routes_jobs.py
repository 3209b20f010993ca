"""Routes of jobs, artifacts and checkpoints. Who may call each is in
``access.ROUTE_ACCESS``; the handlers narrow it to the caller's own jobs, leases and
artifact prefixes. A refusal is an error of the ``flashruntime.errors`` family, raised
here or by the coordinator, which ``app.py`` answers with the error's status."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import FileResponse, JSONResponse

from flashruntime.coordinator.access import (
    artifact_read_allowed,
    artifact_write_allowed,
    checkpoint_read_allowed,
    owns_job,
)
from flashruntime.coordinator.artifacts import check_key
from flashruntime.coordinator.auth import Identity, task_write_allowed
from flashruntime.coordinator.checkpoint_paths import checkpoint_path_problem
from flashruntime.coordinator.core import Coordinator
from flashruntime.coordinator.guard import Guard, StrictJSONRoute
from flashruntime.coordinator.job_views import task_logs, task_metrics, task_rows
from flashruntime.coordinator.openapi import BYTES_RESPONSE, ERRORS
from flashruntime.coordinator.task_logs import job_logs_text
from flashruntime.errors import ArtifactTooLarge, AuthFailure, InvalidRequest, NotFound
from flashruntime.protocol.api_v1alpha1 import (
    ArtifactListing,
    ErrorBody,
    JobLogs,
    JobMetrics,
    LostWork,
    PartRegistered,
    TaskRow,
)
from flashruntime.protocol.task_logs import JOB_LOGS_MAX_BYTES, MAX_TAIL_LINES, TASK_LOG_MAX_BYTES, TASK_LOG_NAME
from flashruntime.protocol.task_metrics import DEFAULT_POINTS, JOB_METRICS_MAX_BYTES, MAX_POINTS, TASK_METRICS_NAME
from flashruntime.protocol.v1alpha1 import (
    ArtifactRecord,
    CheckpointManifest,
    CommitRequest,
    Event,
    JobRecord,
    JobSpec,
    RegisterPartRequest,
)

__all__ = ["jobs_router"]


def _record_json(record: JobRecord, status_code: int = 200) -> JSONResponse:
    return JSONResponse(record.model_dump(mode="json"), status_code=status_code)


def jobs_router(coordinator: Coordinator, guard: Guard) -> APIRouter:
    router = APIRouter(route_class=StrictJSONRoute, dependencies=[guard.dependency()], responses=ERRORS)
    enforcing = coordinator.authenticator.enforcing
    caller = Depends(guard.caller)

    def job_or_404(job_id: str, identity: Identity) -> JobRecord:
        """The job, if it exists and the caller may see it: another submitter's job is
        answered exactly like an unknown one."""
        record = coordinator.job(job_id)
        if record is None or not owns_job(identity, record.submitted_by):
            raise NotFound(f"unknown job {job_id!r}")
        return record

    def scope_of(identity: Identity) -> dict[str, Any]:
        owned: Callable[[str], bool] = coordinator.job_owned_by(identity)
        return {"live": coordinator.live_leases(identity), "job_owned": owned}

    def check_artifact_write(identity: Identity, key: str, *, received: bool = False) -> None:
        if not enforcing:
            return
        if not artifact_write_allowed(identity, key, **scope_of(identity)):
            if identity.submitter:
                raise AuthFailure(403, f"writing {key!r} needs a key under users/{identity.name}/ or under "
                                       "jobs/<job>/ of a job you submitted")
            late = "; the lease ended while the body was uploading, so nothing was stored" if received else ""
            raise AuthFailure(403, f"writing {key!r} needs a live lease on its jobs/<job>/<task>/ prefix{late}")

    def check_task_write(identity: Identity, job_id: str, task_id: str) -> None:
        if not enforcing:
            return
        live = [(lease.job_id, lease.task_id) for lease in coordinator.live_leases(identity)]
        if not task_write_allowed(identity, job_id, task_id, live):
            raise AuthFailure(403, f"checkpoint writes for {job_id}/{task_id} need a live lease on that task")

    def check_task_read(identity: Identity, job_id: str, task_id: str) -> None:
        if enforcing and not checkpoint_read_allowed(identity, job_id, task_id, **scope_of(identity)):
            if identity.submitter:
                raise NotFound(f"unknown job {job_id!r}")
            raise AuthFailure(403, f"reading the checkpoints of {job_id}/{task_id} needs a live lease on that task")

    @router.post("/v1alpha1/jobs", status_code=201, response_model=JobRecord,
                 responses={413: {"model": ErrorBody, "description": "the job's tasks together are over "
                                                                    "FLASHML_MAX_JOB_MB"},
                            422: {"description": "the job cannot be expanded, or makes more tasks than "
                                                 "FLASHML_MAX_TASKS_PER_JOB"},
                            429: {"model": ErrorBody, "description": "the submitter is over FLASHML_MAX_JOBS_IN_FLIGHT "
                                                                     "or FLASHML_MAX_PENDING_TASKS (see Retry-After)"},
                            503: {"model": ErrorBody, "description": "the job's backend is not configured"}})
    def submit(spec: JobSpec, identity: Identity = caller) -> JSONResponse:
        return _record_json(coordinator.submit(spec, identity), 201)

    @router.get("/v1alpha1/jobs", response_model=list[JobRecord])
    def jobs(identity: Identity = caller) -> JSONResponse:
        return JSONResponse([record.model_dump(mode="json") for record in coordinator.jobs(identity)])

    @router.get("/v1alpha1/jobs/{job_id}", response_model=JobRecord)
    def job(job_id: str, identity: Identity = caller) -> JSONResponse:
        return _record_json(job_or_404(job_id, identity))

    @router.get("/v1alpha1/jobs/{job_id}/events", response_model=list[Event])
    def events(job_id: str, identity: Identity = caller) -> JSONResponse:
        job_or_404(job_id, identity)
        return JSONResponse([event.model_dump(mode="json") for event in coordinator.ledger.events_for(job_id)])

    @router.get("/v1alpha1/jobs/{job_id}/logs", response_model=JobLogs,
                description=f"The logs of the job's tasks, as their workers uploaded them ({TASK_LOG_NAME} under "
                            f"each task's output prefix, the last {TASK_LOG_MAX_BYTES} bytes of the task's stdout "
                            f"and stderr). One answer holds at most {JOB_LOGS_MAX_BYTES} bytes of logs, shared "
                            "evenly among the tasks it shows.")
    def logs(job_id: str, identity: Identity = caller,
             task: str | None = Query(None, description="only this task's log (404 when the job has no such task)"),
             tail: int | None = Query(None, ge=0, le=MAX_TAIL_LINES,
                                      description="only the last lines of each log")) -> dict[str, Any]:
        job_or_404(job_id, identity)
        entries = task_logs(coordinator, job_id, task=task, tail=tail)
        if task is not None and not entries:
            raise NotFound(f"job {job_id!r} has no task {task!r}; GET /v1alpha1/jobs/{job_id}/tasks lists its tasks")
        return {"logs": job_logs_text(entries), "tasks": [entry.as_json() for entry in entries]}

    @router.get("/v1alpha1/jobs/{job_id}/metrics", response_model=JobMetrics,
                description=f"The step records of the job's tasks ({TASK_METRICS_NAME} under each task's output "
                            "prefix, uploaded by its worker while it runs and replaced by the committed file), "
                            "thinned to curves: each record's top-level numbers under a few names, loss first. "
                            f"One answer reads at most {JOB_METRICS_MAX_BYTES} bytes, shared evenly among its tasks.")
    def metrics(job_id: str, identity: Identity = caller,
                task: str | None = Query(None, description="only this task's curves (404 when the job has no such task)"),
                points: int = Query(DEFAULT_POINTS, ge=2, le=MAX_POINTS,
                                    description="at most this many points per task, evenly spaced, the last kept")
                ) -> dict[str, Any]:
        job_or_404(job_id, identity)
        entries = task_metrics(coordinator, job_id, task=task, points=points)
        if task is not None and not entries:
            raise NotFound(f"job {job_id!r} has no task {task!r}; GET /v1alpha1/jobs/{job_id}/tasks lists its tasks")
        return {"tasks": entries}

    @router.post("/v1alpha1/jobs/{job_id}/cancel", response_model=JobRecord)
    def cancel(job_id: str, identity: Identity = caller) -> JSONResponse:
        job_or_404(job_id, identity)
        record = coordinator.cancel(job_id)
        if record is None:
            raise NotFound(f"unknown job {job_id!r}")
        return _record_json(record)

    @router.get("/v1alpha1/jobs/{job_id}/tasks", response_model=list[TaskRow])
    def tasks(job_id: str, identity: Identity = caller) -> JSONResponse:
        job_or_404(job_id, identity)
        return JSONResponse(task_rows(coordinator, job_id))

    @router.get("/v1alpha1/jobs/{job_id}/artifacts", response_model=list[ArtifactListing])
    def job_artifacts(job_id: str, identity: Identity = caller) -> list[dict[str, Any]]:
        job_or_404(job_id, identity)  # only a job's own directory: an id like '..' is no job
        listed = coordinator.artifacts.list(f"jobs/{job_id}/")
        return [{"uri": f"artifact://{key}", "key": key, "size_bytes": size, "sha256": coordinator.artifacts.sha256(key)}
                for key, size in listed]

    @router.put("/v1alpha1/artifacts/{key:path}", response_model=ArtifactRecord,
                openapi_extra={"requestBody": {"required": True, "content": {
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}})
    async def put_artifact(key: str, request: Request, identity: Identity = caller) -> JSONResponse:
        check_key(key)
        check_artifact_write(identity, key)  # before reading the body ...
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > coordinator.artifacts.max_bytes:
            raise ArtifactTooLarge(f"artifact {key!r} ({declared} bytes) is over the coordinator's limit of "
                                   f"{coordinator.settings.max_artifact_mb} MiB")
        # ... and after, before the rename: the lease may have ended during the upload. The write
        # refuses a key the file system will not take (too long as a whole) as a BadArtifactKey.
        sha256, size = await coordinator.artifacts.write(
            key, request.stream(), commit_check=lambda: check_artifact_write(identity, key, received=True)
        )
        record = ArtifactRecord(uri=f"artifact://{key}", backend="local", bucket=str(coordinator.artifacts.root),
                                object_key=key, sha256=sha256, size_bytes=size)
        return JSONResponse(record.model_dump(mode="json"))

    @router.get("/v1alpha1/artifacts/{key:path}", response_class=FileResponse, responses=BYTES_RESPONSE)
    def get_artifact(key: str, identity: Identity = caller) -> FileResponse:
        check_key(key)
        if enforcing and not artifact_read_allowed(identity, key, **scope_of(identity)):
            raise AuthFailure(403, f"reading {key!r} is outside what this token may read")
        path = coordinator.artifacts.read_path(key)
        if path is None:
            raise NotFound(f"no artifact {key!r}")
        return FileResponse(path, media_type="application/octet-stream")

    @router.post("/v1alpha1/jobs/{job_id}/tasks/{task_id}/checkpoints/parts", response_model=PartRegistered)
    def register_part(job_id: str, task_id: str, body: RegisterPartRequest,
                      identity: Identity = caller) -> dict[str, str]:
        check_task_write(identity, job_id, task_id)
        if coordinator.job(job_id) is None:  # a checkpoint belongs to a job: none is kept for an unknown id
            raise NotFound(f"unknown job {job_id!r}")
        misplaced = checkpoint_path_problem([body.part.key])
        if misplaced is not None:
            raise InvalidRequest(misplaced)
        try:
            coordinator.catalog.register_part(f"{job_id}::{task_id}", body.attempt_id, body.step, body.part)
        except ValueError as exc:  # a value the registry cannot hold (beyond SQLite's 64-bit integers)
            raise InvalidRequest(str(exc)) from None
        return {"status": "registered", "key": body.part.key}

    @router.post("/v1alpha1/jobs/{job_id}/tasks/{task_id}/checkpoints/commit", response_model=CheckpointManifest)
    def commit_checkpoint(job_id: str, task_id: str, body: CommitRequest,
                          identity: Identity = caller) -> JSONResponse:
        check_task_write(identity, job_id, task_id)
        if coordinator.job(job_id) is None:
            raise NotFound(f"unknown job {job_id!r}")
        misplaced = checkpoint_path_problem([part.key for part in body.expected_parts], body.storage_prefix)
        if misplaced is not None:
            raise InvalidRequest(misplaced)
        try:  # a refused commit raises CheckpointError (409)
            manifest = coordinator.catalog.commit(
                job_id=f"{job_id}::{task_id}", attempt_id=body.attempt_id, step=body.step,
                expected_parts=body.expected_parts, storage_prefix=body.storage_prefix, world_size=body.world_size,
                framework=body.framework, strategy_family=body.strategy_family,
            )
        except ValueError as exc:  # a value the catalog cannot hold
            raise InvalidRequest(str(exc)) from None
        return JSONResponse(manifest.model_dump(mode="json"))

    @router.get("/v1alpha1/jobs/{job_id}/tasks/{task_id}/checkpoints/latest", response_model=CheckpointManifest)
    def latest_checkpoint(job_id: str, task_id: str, world_size: int | None = Query(None),
                          identity: Identity = caller) -> JSONResponse:
        check_task_read(identity, job_id, task_id)
        if coordinator.job(job_id) is None:
            raise NotFound(f"unknown job {job_id!r}")
        manifest = coordinator.catalog.latest_valid(f"{job_id}::{task_id}", world_size=world_size)
        if manifest is None:
            raise NotFound(f"no selectable checkpoint for {job_id}/{task_id}")
        return JSONResponse(manifest.model_dump(mode="json"))

    @router.get("/v1alpha1/jobs/{job_id}/tasks/{task_id}/checkpoints/lost-work", response_model=LostWork)
    def lost_work(job_id: str, task_id: str, failed_at_step: int = Query(...),
                  identity: Identity = caller) -> dict[str, int | None]:
        check_task_read(identity, job_id, task_id)
        if coordinator.job(job_id) is None:
            raise NotFound(f"unknown job {job_id!r}")
        scope = f"{job_id}::{task_id}"
        latest = coordinator.catalog.latest_valid(scope)
        return {
            "lost_steps": coordinator.catalog.lost_work(scope, failed_at_step),
            "latest_step": latest.step if latest is not None else None,
        }

    return router
