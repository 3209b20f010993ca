"""HttpCoordinator over real HTTP on 127.0.0.1.

The server here is the stdlib fake in ``tests/fedavg_fakes.py`` serving the same routes, so
error paths (5xx, retries, missing artifacts) can be injected; the driver against the real
``flashruntime serve`` with real workers is ``tests/e2e/test_fedavg_over_http.py``.
"""

from __future__ import annotations

import json
import socket

import pytest

from flashml_workloads.fedavg_driver import (
    ArtifactNotFound,
    CoordinatorUnavailable,
    HttpCoordinator,
    run_fedavg,
)
from flashruntime.errors import CoordinatorHTTPError
from tests.fedavg_fakes import FakeCoordinator, FakeHttpServer, quadratic_worker

TARGETS = [[1.0, 2.0], [1.5, 1.0], [0.5, 3.0]]
ZEROS = {"w": {"shape": [2], "data": [0.0, 0.0]}}
TOKEN = {"Authorization": "Bearer operator-secret"}


@pytest.fixture
def served():
    backend = FakeCoordinator(quadratic_worker(TARGETS))
    with FakeHttpServer(backend) as server:
        yield server, backend


def test_each_method_uses_its_route_and_sends_headers(served):
    server, backend = served
    coord = HttpCoordinator(server.url + "/", headers=TOKEN)
    body = {"spec": {"workload": {"parameters": {"round": 0, "num_shards": 3, "lr": 0.5}}}}
    job = coord.submit(body)["job_id"]
    assert coord.job_state(job) == "RUNNING"
    keys = [a["key"] for a in coord.artifacts(job)]
    assert f"jobs/{job}/shard-001/metrics.json" in keys
    assert {t["task_id"]: t["state"] for t in coord.tasks(job)} == {
        "shard-000": "COMPLETED", "shard-001": "COMPLETED", "shard-002": "COMPLETED"}
    record = coord.put_artifact(f"jobs/{job}/round-000/weights.json", ZEROS)
    assert record["key"] == f"jobs/{job}/round-000/weights.json"
    assert json.loads(coord.get_artifact(f"jobs/{job}/round-000/weights.json")) == ZEROS
    assert [(m, p) for m, p, _ in server.requests] == [
        ("POST", "/v1alpha1/jobs"),
        ("GET", f"/v1alpha1/jobs/{job}"),
        ("GET", f"/v1alpha1/jobs/{job}/artifacts"),
        ("GET", f"/v1alpha1/jobs/{job}/tasks"),
        ("PUT", f"/v1alpha1/artifacts/jobs/{job}/round-000/weights.json"),
        ("GET", f"/v1alpha1/artifacts/jobs/{job}/round-000/weights.json"),
    ]
    assert all(h.get("Authorization") == "Bearer operator-secret" for _, _, h in server.requests)
    assert server.requests[0][2]["Content-Type"] == "application/json"
    assert "operator-secret" not in repr(coord)


def test_missing_artifact_is_artifact_not_found_and_4xx_are_typed_errors_with_their_detail(served):
    server, _ = served
    coord = HttpCoordinator(server.url)
    with pytest.raises(ArtifactNotFound, match="jobs/none/round-000/weights.json"):
        coord.get_artifact("jobs/none/round-000/weights.json")
    server.fail_next.append(("POST", "/v1alpha1/jobs", 422))
    with pytest.raises(CoordinatorHTTPError, match="POST /v1alpha1/jobs -> 422: .*injected 422") as info:
        coord.submit({})
    assert info.value.status == 422 and info.value.detail == "injected 422"


def test_full_run_over_http_retries_5xx(served):
    server, backend = served
    server.fail_next += [("GET", "/v1alpha1/jobs/", 503), ("GET", "/v1alpha1/jobs/", 502)]
    coord = HttpCoordinator(server.url, headers=TOKEN)
    out = run_fedavg(coord, rounds=3, num_shards=3, min_participants=3, worker_params={"lr": 0.5},
                     initial_weights=ZEROS, poll_seconds=0.01, poll_backoff_s=0.01)
    reference = run_fedavg(FakeCoordinator(quadratic_worker(TARGETS)), rounds=3, num_shards=3, min_participants=3,
                           worker_params={"lr": 0.5}, initial_weights=ZEROS, poll_seconds=0.0)
    assert out["weights"] == reference["weights"]
    assert [h["mean_loss"] for h in out["history"]] == [h["mean_loss"] for h in reference["history"]]
    assert server.fail_next == []  # both injected 5xx were answered and retried past


def test_unreachable_coordinator_raises_coordinator_unavailable():
    with socket.socket() as s:  # a port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    coord = HttpCoordinator(f"http://127.0.0.1:{port}")
    with pytest.raises(CoordinatorUnavailable, match="submitting round 0 failed"):
        run_fedavg(coord, rounds=1, num_shards=1, min_participants=1, worker_params={}, initial_weights=ZEROS)


def test_base_url_must_be_http():
    with pytest.raises(ValueError, match="base_url must be an http"):
        HttpCoordinator("localhost:8100")
