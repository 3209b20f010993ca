"""The coordinator over real HTTP with requests that could answer 500, grow without bound
or lose a write: command placeholders beyond plain ``{name}`` fields, artifact keys the
file system cannot take, cordons past year 9999, NaN in workload parameters, a request
histogram fed by any method token and blind to 500s, a terminal job whose event could be
lost, and duplicate completes racing one another."""

from __future__ import annotations

import contextlib
import hashlib
import re
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_service_app import job_spec, registration
from tests.service_server import CoordinatorProcess, serve_in_thread, settings_for

pytestmark = pytest.mark.service
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

# uvicorn closes the connection after a handler raised: a request expecting that 500 does not
# leave the client a pooled connection that is about to be reset.
CLOSE = {"Connection": "close"}
HANG_GUARD_S = 60.0  # never reached when the code is right; only stops a broken run from hanging


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Any]:
    with serve_in_thread(settings_for(tmp_path / "data")) as url, httpx.Client(base_url=url, timeout=30) as client:
        client.data_dir = tmp_path / "data"  # type: ignore[attr-defined]
        yield client


def command_job(command: list[str], task_params: list[dict[str, Any]]) -> dict[str, Any]:
    spec = job_spec()
    spec["spec"].update(isolation={"tier": "sandboxed"},
                        workload={"type": "command", "parameters": {"command": command, "task_params": task_params}})
    return spec


# --- command placeholders ----------------------------------------------------------------------------


@pytest.mark.parametrize(("token", "problem"), [("{x:>20000000}", "asks for a width or precision of 20000000"),
                                              ("{x.__class__.__mro__}", "reads an attribute")])
def test_command_placeholders_that_read_attributes_or_grow_tokens_are_422_and_store_nothing(
    api: Any, token: str, problem: str
) -> None:
    refused = api.post("/v1alpha1/jobs", json=command_job(["echo", token], [{"x": "a"}]))
    assert refused.status_code == 422, refused.text[:300]
    detail = refused.json()["detail"]
    assert detail.startswith(f"task 0: placeholder in argv token {token!r} is not allowed: {token} {problem}; ")
    assert api.get("/v1alpha1/jobs").json() == []
    legitimate = command_job(["echo", "--x={x}", "{x!r:>8}", "{y[0]:.2f}"], [{"x": "a", "y": [1]}])
    plain = api.post("/v1alpha1/jobs", json=legitimate)
    assert plain.status_code == 201, plain.text
    tasks = api.get(f"/v1alpha1/jobs/{plain.json()['job_id']}/tasks").json()
    assert [t["task_id"] for t in tasks] == ["task-000"]


# --- artifact keys the file system cannot take -------------------------------------------------------


def test_artifact_key_segments_over_255_bytes_are_400_naming_the_limit(api: Any) -> None:
    for segment in ("a" * 256, "é" * 128):  # 256 bytes either way
        for call in (api.put, api.get):
            kwargs = {"content": b"x"} if call is api.put else {}
            refused = call(f"/v1alpha1/artifacts/jobs/j/t/{segment}", **kwargs)
            assert refused.status_code == 400, (call, refused.text[:200])
            assert "is 256 bytes long" in refused.json()["detail"]
            assert "at most 255 bytes (UTF-8)" in refused.json()["detail"]
    longest = "b" * 255
    assert api.put(f"/v1alpha1/artifacts/jobs/j/t/{longest}", content=b"ok").status_code == 200
    assert api.get(f"/v1alpha1/artifacts/jobs/j/t/{longest}").content == b"ok"
    assert not list((api.data_dir / "artifacts").rglob(".upload-*"))


def test_an_artifact_key_too_long_as_a_whole_path_is_400(api: Any) -> None:
    key = "/".join(["s" * 250] * 20)  # every segment fine, the path (5 KB) beyond PATH_MAX
    for call in (api.put, api.get):
        kwargs = {"content": b"x"} if call is api.put else {}
        refused = call(f"/v1alpha1/artifacts/{key}", **kwargs)
        assert refused.status_code == 400, (call, refused.text[:200])
        assert "cannot be a path on the coordinator's disk" in refused.json()["detail"]
        assert "use a shorter key" in refused.json()["detail"]
    assert not list((api.data_dir / "artifacts").rglob(".upload-*"))


# --- cordon ------------------------------------------------------------------------------------------


def test_a_cordon_past_year_9999_is_422_and_cordons_nothing(api: Any) -> None:
    api.post("/v1alpha1/nodes/register", json=registration())
    for seconds in (1e12, 1e300):
        refused = api.post("/v1alpha1/nodes/node-a/cordon", json={"seconds": seconds})
        assert refused.status_code == 422, refused.text
        assert refused.json()["detail"] == (
            f"seconds {seconds:g} puts the cordon's end past the last date the coordinator can hold (year 9999); "
            "give fewer seconds, or neither seconds nor until to cordon until uncordoned")
    assert api.get("/v1alpha1/nodes").json()[0]["cordon_reason"] is None
    ok = api.post("/v1alpha1/nodes/node-a/cordon", json={"seconds": 1e9, "reason": "r"})
    assert ok.status_code == 200 and ok.json()["cordoned_until"].startswith("20")


# --- NaN and infinities in workload parameters -------------------------------------------------------


@pytest.mark.parametrize(("raw", "shown"), [("NaN", "nan"), ("Infinity", "inf"), ("-Infinity", "-inf"),
                                            ("1e999", "inf")])
def test_non_finite_workload_parameters_are_422_naming_the_field(api: Any, raw: str, shown: str) -> None:
    body = (
        '{"metadata": {"name": "s"}, "spec": {"execution": {"backend": "leases"}, '
        '"image": {"repository": "r", "tag": "t"}, "workload": {"type": "hyperparameter_search", '
        f'"parameters": {{"trials": [{{"C": 1.0}}, {{"C": {raw}}}]}}}}}}}}'
    )
    refused = api.post("/v1alpha1/jobs", content=body, headers={"content-type": "application/json"})
    assert refused.status_code == 422, refused.text
    [issue] = refused.json()["detail"]
    assert issue["loc"] == ["body", "spec", "workload", "parameters", "trials", 1, "C"]
    assert issue["msg"].startswith(f"{shown} is not a finite number: JSON has no NaN or Infinity")
    assert api.get("/v1alpha1/jobs").json() == []
    finite = api.post("/v1alpha1/jobs", content=body.replace(raw, "0.5"), headers={"content-type": "application/json"})
    assert finite.status_code == 201 and finite.json()["spec"]["spec"]["workload"]["parameters"]["trials"][1] == {
        "C": 0.5}


# --- a terminal job and its event are written together -----------------------------------------------


def _refuse_job_events(ledger_path: Path, refuse: bool) -> None:
    """Fault injection in the ledger file itself: while the trigger exists, SQLite refuses to
    store a JOB_SUCCEEDED event (written in the same transaction as the terminal record)."""
    with contextlib.closing(sqlite3.connect(ledger_path, timeout=30)) as conn, conn:
        if refuse:
            conn.execute("CREATE TRIGGER refuse_job_succeeded BEFORE INSERT ON events "
                         "WHEN NEW.type = 'JOB_SUCCEEDED' BEGIN SELECT RAISE(ABORT, 'injected fault'); END")
        else:
            conn.execute("DROP TRIGGER refuse_job_succeeded")


def _stored(ledger_path: Path, job_id: str) -> tuple[str, list[str]]:
    with contextlib.closing(sqlite3.connect(ledger_path, timeout=30)) as conn:
        state = conn.execute("SELECT state FROM jobs WHERE job_id = ?", (job_id,)).fetchone()[0]
        types = [row[0] for row in conn.execute("SELECT type FROM events WHERE job_id = ? ORDER BY seq", (job_id,))]
    return state, types


def _claim_and_upload(api: Any, payload: bytes = b'{"score": 1.0}') -> tuple[str, dict[str, Any], dict[str, Any]]:
    """A one-task job claimed and its output uploaded → (job id, lease, the complete request's body)."""
    job_id = api.post("/v1alpha1/jobs", json=job_spec(trials=1)).json()["job_id"]
    api.post("/v1alpha1/nodes/register", json=registration())
    lease = api.post("/v1alpha1/leases/claim", json={"node_id": "node-a"}).json()
    key = lease["payload"]["output_prefix"] + "metrics.json"
    assert api.put(f"/v1alpha1/artifacts/{key}", content=payload).status_code == 200
    body = {"output_sha256": hashlib.sha256(payload).hexdigest(), "evidence": {"exit_code": 0, "wall_seconds": 1.5}}
    return str(job_id), lease, body


def test_a_failed_event_write_refuses_the_whole_commit_and_a_kill9_loses_nothing(tmp_path: Path) -> None:
    """A job's last commit, its TASK_COMMIT_ACCEPTED, the job's terminal record and its
    JOB_SUCCEEDED are one transaction: when the job's event cannot be stored, the commit is
    answered 503 and none of it is stored; after a kill -9 and a restart the worker's retry of
    the same commit is accepted, and every record is written once."""
    data = tmp_path / "data"
    ledger = data / "flashruntime.db"
    first = CoordinatorProcess(data).start()
    try:
        with httpx.Client(base_url=first.url, timeout=30) as api:
            _refuse_job_events(ledger, refuse=True)
            job_id, lease, body = _claim_and_upload(api)
            failed = api.post(f"/v1alpha1/attempts/{lease['lease_id']}/complete", json=body, headers=CLOSE)
            assert failed.status_code == 503  # retry shortly
            assert failed.headers["retry-after"] == "1" and "ledger" not in failed.text
            state, types = _stored(ledger, job_id)
            assert state == "RUNNING" and "JOB_SUCCEEDED" not in types and "TASK_COMMIT_ACCEPTED" not in types
        first.kill9()
    finally:
        first.stop()
    _refuse_job_events(ledger, refuse=False)
    second = CoordinatorProcess(data).start()
    try:
        with httpx.Client(base_url=second.url, timeout=30) as api:
            retried = api.post(f"/v1alpha1/attempts/{lease['lease_id']}/complete", json=body)
            assert retried.json() == {"accepted": True}
            job = api.get(f"/v1alpha1/jobs/{job_id}").json()
            assert job["state"] == "SUCCEEDED" and job["finished_at"] is not None
            types = [e["type"] for e in api.get(f"/v1alpha1/jobs/{job_id}/events").json()]
            assert types.count("TASK_COMMIT_ACCEPTED") == 1 and types.count("JOB_SUCCEEDED") == 1
            assert types[-1] == "JOB_SUCCEEDED"
            (task,) = api.get(f"/v1alpha1/jobs/{job_id}/tasks").json()
            assert task["evidence"]["wall_seconds"] == 1.5
    finally:
        second.stop()


# --- the request histogram ---------------------------------------------------------------------------


def _series(metrics: str, method: str) -> list[str]:
    return re.findall(rf'flashruntime_http_request_duration_seconds_count\{{method="{method}",route="([^"]*)",'
                      rf'status="(\d+)"\}} (\d+)', metrics)


def test_request_histogram_labels_unknown_methods_other(api: Any) -> None:
    """Any client can send any method token: each must not become a series of its own."""
    for method in ("FOO1", "FOO2", "PROPFIND"):
        assert api.request(method, "/healthz").status_code == 405
    metrics = api.get("/metrics").text
    assert "FOO" not in metrics and "PROPFIND" not in metrics
    assert ("/healthz", "405", "3") in _series(metrics, "other")
    assert ("/healthz", "405", "1") not in _series(metrics, "GET")


def test_request_histogram_counts_a_failed_database_write_as_503(api: Any) -> None:
    _refuse_job_events(api.data_dir / "flashruntime.db", refuse=True)
    try:
        _, lease, body = _claim_and_upload(api)
        complete = f"/v1alpha1/attempts/{lease['lease_id']}/complete"
        assert api.post(complete, json=body, headers=CLOSE).status_code == 503
    finally:
        _refuse_job_events(api.data_dir / "flashruntime.db", refuse=False)
    assert api.post(complete, json=body).json() == {"accepted": True}
    metrics = api.get("/metrics").text
    completes = [(status, n) for route, status, n in _series(metrics, "POST")
                 if route == "/v1alpha1/attempts/{lease_id}/complete"]
    assert ("503", "1") in completes and ("200", "1") in completes


def test_request_histogram_counts_a_handler_that_raises_as_500() -> None:
    import asyncio

    from flashruntime.coordinator.app import _Timed
    from flashruntime.coordinator.metrics import Metrics

    async def broken(scope: Any, receive: Any, send: Any) -> None:
        scope["route"] = type("Route", (), {"path": "/v1alpha1/jobs/{job_id}"})()
        raise RuntimeError("a bug")

    metrics = Metrics()
    with pytest.raises(RuntimeError, match="a bug"):
        asyncio.run(_Timed(broken, metrics)({"type": "http", "method": "GET"}, None, None))
    assert [(route, status, n) for route, status, n in _series(metrics.render({}, 0, {}), "GET")] == [
        ("/v1alpha1/jobs/{job_id}", "500", "1")]


# --- duplicate completes racing one another ----------------------------------------------------------


class _HeldFirstLookup:
    """The coordinator's artifact store, with the first look-up of an output held until
    ``release``: one complete sits inside its checks while a duplicate runs."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.inside = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def read_path(self, key: str) -> Path | None:
        self.calls += 1
        if self.calls == 1:
            self.inside.set()
            assert self.release.wait(HANG_GUARD_S)
        return self.store.read_path(key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def test_a_duplicate_complete_racing_the_first_counts_and_records_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flashruntime.coordinator.core import Coordinator
    from flashruntime.protocol.v1alpha1 import CompleteRequest, EventType, JobSpec, NodeRegistration

    for name in ("FLASHML_NODE_TOKENS", "FLASHML_OPERATOR_TOKENS"):
        monkeypatch.delenv(name, raising=False)
    coordinator = Coordinator(settings_for(tmp_path / "data"))
    try:
        job_id = coordinator.submit(JobSpec.model_validate(job_spec(trials=1))).job_id
        coordinator.nodes.register(NodeRegistration.model_validate(registration()))
        lease = coordinator.manager.claim("node-a", now=coordinator.now(), policy=coordinator.placement,
                                          node=coordinator.nodes.claim_view("node-a"))
        assert lease is not None
        output = coordinator.artifacts.path_of(lease.payload["output_prefix"] + "metrics.json")
        output.parent.mkdir(parents=True)
        output.write_bytes(b'{"score": 1}')
        sha = hashlib.sha256(b'{"score": 1}').hexdigest()
        held = _HeldFirstLookup(coordinator.artifacts)
        coordinator.artifacts = held  # type: ignore[assignment]

        first: list[dict[str, Any]] = []
        thread = threading.Thread(target=lambda: first.append(coordinator.complete(
            lease, CompleteRequest(output_sha256=sha, evidence={"exit_code": 0, "wall_seconds": 1.0}))))
        thread.start()
        try:
            assert held.inside.wait(HANG_GUARD_S)  # the first call is past steps 2 and 3
            duplicate = coordinator.complete(
                lease, CompleteRequest(output_sha256=sha, evidence={"exit_code": 0, "wall_seconds": 2.0}))
        finally:
            held.release.set()
            thread.join(HANG_GUARD_S)
        assert first == [duplicate] == [{"accepted": True}]
        assert coordinator.metrics.commits == {"accepted": 1, "rejected": 0, "invalid_output": 0}
        assert coordinator.nodes.views({}, coordinator.now())[0]["accepted_tasks"] == 1
        events = coordinator.ledger.events_for(job_id)
        assert [e.type for e in events].count(EventType.TASK_COMMIT_ACCEPTED) == 1
        # the evidence is the call's that made the commit (the duplicate's), not overwritten after it
        assert coordinator.ledger.evidence_for(job_id)["trial-000"]["evidence"]["wall_seconds"] == 2.0
    finally:
        coordinator.close()
