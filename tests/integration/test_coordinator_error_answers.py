"""How a live coordinator answers each refusal of the error family: every class of
``flashruntime.errors`` with an ``http_status`` is raised from a route added to an app
``create_app`` built, served by uvicorn on 127.0.0.1, and its answer's status,
``{"detail": ...}`` body and headers are checked against what clients read today."""

from __future__ import annotations

import errno
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from flashruntime import errors
from tests.service_server import serve_app_in_thread, settings_for

pytestmark = pytest.mark.service
httpx = pytest.importorskip("httpx")

DATABASE_DOWN = "the coordinator's database did not answer; retry shortly"
DISK_FULL = ("the coordinator's disk is full: nothing was stored; retry later (an operator frees space on its data "
             "directory)")


def _store_error() -> errors.StoreError:
    error = errors.StoreError("/data/flashruntime.db: database is locked; stop the other writer")
    error.__cause__ = sqlite3.OperationalError("database is locked")
    return error


def _disk_full_store_error() -> errors.StoreError:
    error = errors.StoreError("/data/flashruntime.db: database or disk is full")
    cause = sqlite3.OperationalError("database or disk is full")
    cause.sqlite_errorcode = 13  # type: ignore[attr-defined]  (SQLITE_FULL, as sqlite3 sets it)
    error.__cause__ = cause
    return error


# name -> (the error raised, status, the body's detail, headers the answer must carry). A
# header not listed must be absent: Retry-After and WWW-Authenticate are sent where listed only.
ANSWERS: dict[str, tuple[Callable[[], errors.FlashRuntimeError], int, Any, dict[str, str]]] = {
    "NoBackend": (lambda: errors.NoBackend("the job asks for backend 'ray'; set FLASHML_RAY_ADDRESS"), 503,
                  "the job asks for backend 'ray'; set FLASHML_RAY_ADDRESS", {}),
    "ExpansionError": (lambda: errors.ExpansionError("duplicate task ids ('t')"), 422, "duplicate task ids ('t')", {}),
    "TooManyTasks": (lambda: errors.TooManyTasks("20000 tasks, over 10000"), 422, "20000 tasks, over 10000", {}),
    "JobTooLarge": (lambda: errors.JobTooLarge("65 MiB of tasks, over 64"), 413, "65 MiB of tasks, over 64", {}),
    "BodyProblem": (lambda: errors.BodyProblem(["spec", 0], "nan is not a finite number", "finite_number"), 422,
                    [{"loc": ["body", "spec", 0], "msg": "nan is not a finite number", "type": "finite_number"}], {}),
    "BodyTooLarge": (lambda: errors.BodyTooLarge("over 64 KiB (FLASHML_MAX_JSON_KB)"), 413,
                     "over 64 KiB (FLASHML_MAX_JSON_KB)", {}),
    "InvalidRequest": (lambda: errors.InvalidRequest("seconds must be > 0, got -1"), 422,
                       "seconds must be > 0, got -1", {}),
    "BadArtifactKey": (lambda: errors.BadArtifactKey("'../x' is not a safe key"), 400, "'../x' is not a safe key", {}),
    "ArtifactTooLarge": (lambda: errors.ArtifactTooLarge("over 1 MiB"), 413, "over 1 MiB", {}),
    "ArtifactConflict": (lambda: errors.ArtifactConflict("'a' is a directory"), 409, "'a' is a directory", {}),
    "EmptyArtifact": (lambda: errors.EmptyArtifact("the artifact body is empty"), 400, "the artifact body is empty", {}),
    "NotFound": (lambda: errors.NotFound("unknown job 'j'"), 404, "unknown job 'j'", {}),
    "AccessDenied": (lambda: errors.AccessDenied("not yours"), 403, "not yours", {}),
    "AuthFailure": (lambda: errors.AuthFailure(403, "writing 'k' needs a live lease"), 403,
                    "writing 'k' needs a live lease", {}),
    "RateLimited": (lambda: errors.RateLimited(2.5), 429, "too many requests from this credential; retry in 3 s",
                    {"Retry-After": "3"}),
    "CodeExecutionNotPermitted": (lambda: errors.CodeExecutionNotPermitted("argv needs FLASHML_ARGV_SUBMITTERS"),
                                  403, "argv needs FLASHML_ARGV_SUBMITTERS", {}),
    "SubmitterOverQuota": (lambda: errors.SubmitterOverQuota("100 jobs in flight", 30), 429, "100 jobs in flight",
                           {"Retry-After": "30"}),
    "StoreError": (_store_error, 503, DATABASE_DOWN, {"Retry-After": "1"}),
    "StorageFull": (lambda: errors.StorageFull(errno.ENOSPC, "artifact 'k' was not stored: below the floor"), 503,
                    DISK_FULL, {"Retry-After": "5"}),
    "LeaseError": (lambda: errors.LeaseError("lease l-1 is no longer live: expired"), 410,
                   "lease l-1 is no longer live: expired", {}),
    "CheckpointError": (lambda: errors.CheckpointError("step 3 already committed"), 409, "step 3 already committed",
                        {}),
}

# More than one answer of one class: the status an AuthFailure carries, a database's full disk.
MORE_ANSWERS: dict[str, tuple[Callable[[], BaseException], int, Any, dict[str, str]]] = {
    "AuthFailure-401": (lambda: errors.AuthFailure(401, "authentication required"), 401, "authentication required",
                        {"WWW-Authenticate": "Bearer"}),
    "AuthFailure-400": (lambda: errors.AuthFailure(400, "header sent more than once"), 400,
                        "header sent more than once", {}),
    "StoreError-disk-full": (_disk_full_store_error, 503, DISK_FULL, {"Retry-After": "5"}),
    "OSError-ENOSPC": (lambda: OSError(errno.ENOSPC, "No space left on device"), 503, DISK_FULL,
                       {"Retry-After": "5"}),
}

NOT_REFUSALS: dict[str, Callable[[], BaseException]] = {
    "CompileError": lambda: errors.CompileError("no plan for /secret/path"),
    "SchemaVersionError": lambda: errors.SchemaVersionError("/secret/path holds schema 9"),
    "CoordinatorHTTPError": lambda: errors.CoordinatorHTTPError("GET", "/x", 404, "/secret/path"),
}

_RAISED = {**{name: make for name, (make, *_) in ANSWERS.items()},
           **{name: make for name, (make, *_) in MORE_ANSWERS.items()}, **NOT_REFUSALS}


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from flashruntime.coordinator.app import create_app

    app = create_app(settings_for(Path(tmp_path_factory.mktemp("answers")) / "data"))

    def refuse(name: str) -> None:
        raise _RAISED[name]()

    async def refuse_async(name: str) -> None:
        raise _RAISED[name]()

    app.add_api_route("/test-refusals/{name}", refuse, methods=["GET"])
    app.add_api_route("/test-refusals-async/{name}", refuse_async, methods=["GET"])
    with serve_app_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield client


def test_every_class_with_a_status_is_checked() -> None:
    with_status = {name for name in errors.__all__ if getattr(errors, name).http_status is not None}
    assert with_status == set(ANSWERS)


def _check(answer: Any, status: int, detail: Any, headers: dict[str, str]) -> None:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == "application/json"
    assert answer.json() == {"detail": detail}
    for header in ("Retry-After", "WWW-Authenticate"):
        assert answer.headers.get(header) == headers.get(header), header


@pytest.mark.parametrize("name", sorted(ANSWERS))
@pytest.mark.parametrize("route", ["/test-refusals", "/test-refusals-async"])
def test_each_refusal_is_answered_with_its_status_body_and_headers(api: Any, route: str, name: str) -> None:
    _, status, detail, headers = ANSWERS[name]
    _check(api.get(f"{route}/{name}"), status, detail, headers)


@pytest.mark.parametrize("name", sorted(MORE_ANSWERS))
def test_one_class_answers_as_its_instance_or_its_cause_says(api: Any, name: str) -> None:
    _, status, detail, headers = MORE_ANSWERS[name]
    _check(api.get(f"/test-refusals/{name}"), status, detail, headers)


@pytest.mark.parametrize("name", sorted(NOT_REFUSALS))
def test_an_error_without_a_status_is_a_server_fault_that_tells_nothing(api: Any, name: str) -> None:
    # The server drops a connection whose request raised: this one is not kept for the next.
    answer = api.get(f"/test-refusals/{name}", headers={"Connection": "close"})
    assert answer.status_code == 500
    assert "/secret/path" not in answer.text


def test_the_coordinator_still_serves_its_own_routes(api: Any) -> None:
    assert api.get("/healthz").status_code == 200
    unknown = api.get("/v1alpha1/jobs/nope")
    assert unknown.status_code == 404 and unknown.json() == {"detail": "unknown job 'nope'"}
    assert api.get("/no-such-route").status_code == 404
