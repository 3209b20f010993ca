"""The coordinator over real HTTP: uvicorn on 127.0.0.1, SQLite files on disk.

Lifecycle of a lease job (submit → register → claim → heartbeat → upload → complete →
SUCCEEDED), output validation, expiry, the status code of each refused request, checkpoints, metrics,
and a kill -9 of the coordinator process between a claim and its commit.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from tests.service_server import CoordinatorProcess, serve_in_thread, settings_for

pytestmark = pytest.mark.service
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")


def job_spec(trials: int = 2, lease_seconds: float = 60.0, backend: str = "leases") -> dict[str, Any]:
    return {
        "apiVersion": "flashml.dev/v1alpha1", "kind": "Job", "metadata": {"name": "sweep"},
        "spec": {"execution": {"backend": backend}, "image": {"repository": "local/tier1", "tag": "dev"},
                 "workload": {"type": "hyperparameter_search",
                              "parameters": {"trials": [{"C": 10.0**-i} for i in range(trials)],
                                             "lease_seconds": lease_seconds}}},
    }


def registration(node_id: str = "node-a") -> dict[str, Any]:
    return {"node_id": node_id, "kubernetes_node": "", "hostname": f"{node_id}.local", "module_capable": True,
            "capabilities": {"cpu_cores": 2, "pools": []}}


@pytest.fixture
def api(tmp_path: Path):
    with serve_in_thread(settings_for(tmp_path / "data")) as url, httpx.Client(base_url=url, timeout=10) as client:
        client.data_dir = tmp_path / "data"  # type: ignore[attr-defined]
        yield client


def _finish(api: Any, lease: dict[str, Any], payload: bytes = b'{"score": 1.0}') -> dict[str, Any]:
    key = lease["payload"]["output_prefix"] + "metrics.json"
    put = api.put(f"/v1alpha1/artifacts/{key}", content=payload)
    assert put.status_code == 200, put.text
    assert put.json()["sha256"] == hashlib.sha256(payload).hexdigest() and put.json()["uri"] == f"artifact://{key}"
    done = api.post(f"/v1alpha1/attempts/{lease['lease_id']}/complete",
                    json={"output_sha256": hashlib.sha256(payload).hexdigest(),
                          "evidence": {"exit_code": 0, "wall_seconds": 1.5}})
    assert done.status_code == 200, done.text
    return done.json()


def test_a_lease_job_runs_to_success_over_http(api: Any) -> None:
    assert api.get("/healthz").json() == {"status": "ok", "profile": "local"}
    created = api.post("/v1alpha1/jobs", json=job_spec(trials=2))
    assert created.status_code == 201, created.text
    job = created.json()
    job_id = job["job_id"]
    assert len(job_id) == 12 and all(c in "0123456789abcdef" for c in job_id)
    assert (job["state"], job["backend"], job["deployment_profile"]) == ("RUNNING", "leases", "local")

    assert api.post("/v1alpha1/nodes/register", json=registration()).json() == {"node_id": "node-a",
                                                                                "status": "registered"}
    assert api.post("/v1alpha1/nodes/node-a/heartbeat", json={"node_id": "node-a", "pools": ["team-7"]}).json() == {
        "status": "ok"}
    for _ in range(2):
        claimed = api.post("/v1alpha1/leases/claim", json={"node_id": "node-a"})
        assert claimed.status_code == 200, claimed.text
        lease = claimed.json()
        assert lease["node_id"] == "node-a" and lease["job_id"] == job_id
        renewed = api.post(f"/v1alpha1/attempts/{lease['lease_id']}/heartbeat")
        assert renewed.status_code == 200 and renewed.json()["lease_id"] == lease["lease_id"]
        assert _finish(api, lease) == {"accepted": True}
        assert _finish(api, lease) == {"accepted": True}  # the winner's retry is idempotent
    assert api.post("/v1alpha1/leases/claim", json={"node_id": "node-a"}).status_code == 204

    final = api.get(f"/v1alpha1/jobs/{job_id}").json()
    assert final["state"] == "SUCCEEDED" and final["finished_at"] is not None
    tasks = api.get(f"/v1alpha1/jobs/{job_id}/tasks").json()
    assert [t["task_id"] for t in tasks] == ["trial-000", "trial-001"]
    assert all(t["state"] == "COMPLETED" and t["node_id"] == "node-a" and t["attempts"] == 1 for t in tasks)
    assert tasks[0]["evidence"]["exit_code"] == 0 and tasks[0]["evidence"]["wall_seconds"] == 1.5
    types = [e["type"] for e in api.get(f"/v1alpha1/jobs/{job_id}/events").json()]
    assert types[:2] == ["JOB_ACCEPTED", "BACKEND_SELECTED"] and types.count("TASK_CREATED") == 2
    assert types.count("LEASE_CLAIMED") == 2 and types.count("TASK_COMMIT_ACCEPTED") == 2
    assert types[-1] == "JOB_SUCCEEDED" and types.count("JOB_SUCCEEDED") == 1
    events = api.get(f"/v1alpha1/jobs/{job_id}/events").json()
    assert events[1]["message"] == "backend: leases (2 independent tasks)" and events[1]["source"] == "flashruntime.service"
    artifacts = api.get(f"/v1alpha1/jobs/{job_id}/artifacts").json()
    assert [a["key"] for a in artifacts] == [f"jobs/{job_id}/trial-000/metrics.json",
                                            f"jobs/{job_id}/trial-001/metrics.json"]
    assert api.get(f"/v1alpha1/artifacts/{artifacts[0]['key']}").content == b'{"score": 1.0}'
    node = api.get("/v1alpha1/nodes").json()[0]
    assert (node["node_id"], node["online"], node["accepted_tasks"]) == ("node-a", True, 2)
    assert node["capabilities"]["pools"] == ["team-7"] and node["cordon_reason"] is None
    assert [j["job_id"] for j in api.get("/v1alpha1/jobs").json()] == [job_id]
    logs = api.get(f"/v1alpha1/jobs/{job_id}/logs").json()  # no worker uploaded a log: headers only
    assert logs["logs"] == "--- trial-000 (COMPLETED) ---\n--- trial-001 (COMPLETED) ---\n"
    assert [(t["task_id"], t["node_id"], t["log"], t["truncated"]) for t in logs["tasks"]] == [
        ("trial-000", "node-a", "", False), ("trial-001", "node-a", "", False)]

    metrics = api.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = metrics.text
    assert 'flashruntime_tasks{state="COMPLETED"} 2' in text and "flashruntime_live_leases 0" in text
    assert 'flashruntime_claims_total{result="leased"} 2' in text and 'flashruntime_claims_total{result="empty"} 1' in text
    assert 'flashruntime_commits_total{result="accepted"} 2' in text
    assert 'route="/v1alpha1/attempts/{lease_id}/heartbeat"' in text  # the template, never the raw path
    assert "<title>FlashRuntime coordinator</title>" in api.get("/").text


def test_a_wrong_or_missing_output_fails_the_attempt_and_requeues(api: Any) -> None:
    job_id = api.post("/v1alpha1/jobs", json=job_spec(trials=1)).json()["job_id"]
    api.post("/v1alpha1/nodes/register", json=registration())
    lease = api.post("/v1alpha1/leases/claim", json={"node_id": "node-a"}).json()
    missing = api.post(f"/v1alpha1/attempts/{lease['lease_id']}/complete", json={"output_sha256": "0" * 64}).json()
    assert missing["accepted"] is False and "was not uploaded" in missing["detail"]
    assert api.get(f"/v1alpha1/jobs/{job_id}/tasks").json()[0]["state"] == "PENDING"

    lease = api.post("/v1alpha1/leases/claim", json={"node_id": "node-a"}).json()
    key = lease["payload"]["output_prefix"] + "metrics.json"
    api.put(f"/v1alpha1/artifacts/{key}", content=b"{}")
    wrong = api.post(f"/v1alpha1/attempts/{lease['lease_id']}/complete", json={"output_sha256": "1" * 64}).json()
    assert wrong["accepted"] is False and "not the claimed" in wrong["detail"]
    task = api.get(f"/v1alpha1/jobs/{job_id}/tasks").json()[0]
    assert (task["state"], task["failures"], task["attempts"]) == ("PENDING", 2, 2)
    assert 'flashruntime_commits_total{result="invalid_output"} 2' in api.get("/metrics").text
    # a failed attempt's lease is dead: heartbeat and fail answer 410
    assert api.post(f"/v1alpha1/attempts/{lease['lease_id']}/heartbeat").status_code == 410
    assert api.post(f"/v1alpha1/attempts/{lease['lease_id']}/fail", json={"reason": "x"}).status_code == 410


def test_an_expired_lease_is_swept_and_its_late_commit_rejected(api: Any) -> None:
    job_id = api.post("/v1alpha1/jobs", json=job_spec(trials=1, lease_seconds=1)).json()["job_id"]
    api.post("/v1alpha1/nodes/register", json=registration())
    lease = api.post("/v1alpha1/leases/claim", json={"node_id": "node-a"}).json()
    deadline = time.monotonic() + 10
    while api.get(f"/v1alpha1/jobs/{job_id}/tasks").json()[0]["state"] != "PENDING":  # the sweeper, not a claim
        assert time.monotonic() < deadline, "the sweeper never expired the lease"
        time.sleep(0.1)
    assert api.get(f"/v1alpha1/jobs/{job_id}/tasks").json()[0]["expiries"] == 1
    assert api.post(f"/v1alpha1/attempts/{lease['lease_id']}/heartbeat").status_code == 410
    late = _finish(api, lease)
    assert late == {"accepted": False, "detail": "lease is no longer live"}
    types = [e["type"] for e in api.get(f"/v1alpha1/jobs/{job_id}/events").json()]
    assert "LEASE_EXPIRED" in types and "TASK_COMMIT_REJECTED" in types
    assert "flashruntime_lease_expiries_total 1" in api.get("/metrics").text


def test_a_released_lease_requeues_without_a_budget_and_an_abandoned_one_is_an_expiry(api: Any) -> None:
    spec = job_spec(trials=1)
    spec["spec"]["retryPolicy"] = {"maxTaskAttempts": 1}
    job_id = api.post("/v1alpha1/jobs", json=spec).json()["job_id"]
    api.post("/v1alpha1/nodes/register", json=registration())
    lease = api.post("/v1alpha1/leases/claim", json={"node_id": "node-a"}).json()
    released = api.post(f"/v1alpha1/attempts/{lease['lease_id']}/release", json={"reason": "agent shutdown"})
    assert released.status_code == 200 and released.json() == {"status": "requeued"}
    # a repeat of an applied release finds the lease gone, as a repeated fail does
    again = api.post(f"/v1alpha1/attempts/{lease['lease_id']}/release", json={})
    assert again.status_code == 410 and "no longer live" in again.json()["detail"]
    task = api.get(f"/v1alpha1/jobs/{job_id}/tasks").json()[0]
    assert (task["state"], task["failures"], task["expiries"], task["released"]) == ("PENDING", 0, 0, 1)

    lease = api.post("/v1alpha1/leases/claim", json={"node_id": "node-a"}).json()
    abandoned = api.post(f"/v1alpha1/attempts/{lease['lease_id']}/release",
                         json={"reason": "its worker restarted", "abandoned": True})
    assert abandoned.status_code == 200 and abandoned.json() == {"status": "requeued"}
    task = api.get(f"/v1alpha1/jobs/{job_id}/tasks").json()[0]
    assert (task["state"], task["failures"], task["expiries"], task["released"]) == ("PENDING", 0, 1, 1)
    assert api.get(f"/v1alpha1/jobs/{job_id}").json()["state"] == "RUNNING"

    lease = api.post("/v1alpha1/leases/claim", json={"node_id": "node-a"}).json()
    assert lease["attempt_number"] == 3
    assert _finish(api, lease) == {"accepted": True}
    assert api.get(f"/v1alpha1/jobs/{job_id}").json()["state"] == "SUCCEEDED"
    events = api.get(f"/v1alpha1/jobs/{job_id}/events").json()
    assert [e["type"] for e in events if e["type"] in ("LEASE_RELEASED", "LEASE_EXPIRED", "TASK_REQUEUED")] == [
        "LEASE_RELEASED", "TASK_REQUEUED", "LEASE_EXPIRED", "TASK_REQUEUED"]
    assert "flashruntime_lease_expiries_total 1" in api.get("/metrics").text
    assert api.post("/v1alpha1/attempts/ls-000000000000/release", json={}).status_code == 404


def test_status_codes_of_bad_requests(api: Any) -> None:
    assert api.post("/v1alpha1/jobs", json={"kind": "Job"}).status_code == 422
    refused = api.post("/v1alpha1/jobs", json={**job_spec(), "spec": {**job_spec()["spec"], "workload": {
        "type": "no_such_workload", "parameters": {}}}})
    assert refused.status_code == 422 and "no_such_workload" in refused.json()["detail"]
    assert api.post("/v1alpha1/jobs", json=job_spec(backend="ray")).status_code == 503
    assert api.get("/v1alpha1/jobs/000000000000").status_code == 404
    assert api.get("/v1alpha1/jobs/000000000000/events").status_code == 404
    assert api.post("/v1alpha1/jobs/000000000000/cancel").status_code == 404
    assert api.post("/v1alpha1/nodes/ghost/heartbeat", json={"node_id": "ghost"}).status_code == 404
    assert api.post("/v1alpha1/leases/claim", json={"node_id": "ghost"}).status_code == 403
    assert api.post("/v1alpha1/attempts/ls-000000000000/heartbeat").status_code == 404
    assert api.post("/v1alpha1/attempts/ls-000000000000/complete", json={"output_sha256": "0" * 64}).status_code == 404
    assert api.put("/v1alpha1/artifacts/a/%2E%2E/b", content=b"x").status_code == 400
    assert api.put("/v1alpha1/artifacts/a%5Cb", content=b"x").status_code == 400
    assert api.get("/v1alpha1/artifacts/nothing/here").status_code == 404
    api.post("/v1alpha1/nodes/register", json=registration())
    assert api.post("/v1alpha1/nodes/node-a/cordon", json={"seconds": 5, "until": "2999-01-01T00:00:00Z"}).status_code == 422
    assert api.post("/v1alpha1/nodes/node-a/cordon", json={"until": "2000-01-01T00:00:00Z"}).status_code == 422
    assert api.post("/v1alpha1/nodes/ghost/cordon", json={"seconds": 5}).status_code == 404


def test_cordon_stops_claims_and_cancel_ends_the_job(api: Any) -> None:
    job_id = api.post("/v1alpha1/jobs", json=job_spec(trials=2)).json()["job_id"]
    api.post("/v1alpha1/nodes/register", json=registration())
    cordoned = api.post("/v1alpha1/nodes/node-a/cordon", json={"reason": "disk failing"}).json()
    assert cordoned == {"node_id": "node-a", "cordoned_until": None, "reason": "disk failing"}
    assert api.get("/v1alpha1/nodes").json()[0]["cordon_reason"] == "disk failing"
    assert api.post("/v1alpha1/leases/claim", json={"node_id": "node-a"}).status_code == 204
    assert api.delete("/v1alpha1/nodes/node-a/cordon").json() == {"node_id": "node-a", "uncordoned": True}
    lease = api.post("/v1alpha1/leases/claim", json={"node_id": "node-a"}).json()
    cancelled = api.post(f"/v1alpha1/jobs/{job_id}/cancel").json()
    assert cancelled["state"] == "CANCELLED" and cancelled["finished_at"] is not None
    assert {t["state"] for t in api.get(f"/v1alpha1/jobs/{job_id}/tasks").json()} == {"CANCELLED"}
    assert api.post(f"/v1alpha1/attempts/{lease['lease_id']}/heartbeat").status_code == 410
    assert api.post(f"/v1alpha1/jobs/{job_id}/cancel").json()["finished_at"] == cancelled["finished_at"]


def test_checkpoint_routes(api: Any) -> None:
    part = {"key": "rank0.pt", "sha256": "a" * 64, "size_bytes": 10}
    job_id = api.post("/v1alpha1/jobs", json=job_spec(trials=1)).json()["job_id"]
    base = f"/v1alpha1/jobs/{job_id}/tasks/t1/checkpoints"
    assert api.get(f"{base}/latest").status_code == 404
    assert api.get(f"{base}/lost-work", params={"failed_at_step": 7}).json() == {"lost_steps": None, "latest_step": None}
    assert api.post(f"{base}/parts", json={"attempt_id": "a1", "step": 5, "part": part}).json() == {
        "status": "registered", "key": "rank0.pt"}
    commit = {"attempt_id": "a1", "step": 5, "expected_parts": [part], "storage_prefix": f"ckpt/{job_id}/t1/5/"}
    manifest = api.post(f"{base}/commit", json=commit)
    assert manifest.status_code == 200 and manifest.json()["step"] == 5
    assert api.get(f"{base}/latest").json()["manifest_id"] == manifest.json()["manifest_id"]
    assert api.get(f"{base}/lost-work", params={"failed_at_step": 7}).json() == {"lost_steps": 2, "latest_step": 5}
    mismatch = {**commit, "step": 6, "expected_parts": [{**part, "sha256": "b" * 64}]}
    refused = api.post(f"{base}/commit", json=mismatch)
    assert refused.status_code == 409 and "not registered" in refused.json()["detail"]


def test_checkpoint_routes_of_an_unknown_job_are_404_and_keep_nothing(api: Any) -> None:
    part = {"key": "rank0.pt", "sha256": "a" * 64, "size_bytes": 10}
    base = "/v1alpha1/jobs/3f9c2a7b1d04/tasks/t1/checkpoints"
    commit = {"attempt_id": "a1", "step": 5, "expected_parts": [part], "storage_prefix": "ckpt/5/"}
    answers = [api.post(f"{base}/parts", json={"attempt_id": "a1", "step": 5, "part": part}),
               api.post(f"{base}/commit", json=commit), api.get(f"{base}/latest"),
               api.get(f"{base}/lost-work", params={"failed_at_step": 7})]
    assert [a.status_code for a in answers] == [404, 404, 404, 404]
    assert {a.json()["detail"] for a in answers} == {"unknown job '3f9c2a7b1d04'"}
    job_id = api.post("/v1alpha1/jobs", json=job_spec(trials=1)).json()["job_id"]
    # Nothing was registered for the unknown job: the same part under a real job still needs registering.
    refused = api.post(f"/v1alpha1/jobs/{job_id}/tasks/t1/checkpoints/commit", json=commit)
    assert refused.status_code == 409 and "not registered" in refused.json()["detail"]


def test_artifact_size_limit(tmp_path: Path) -> None:
    with serve_in_thread(settings_for(tmp_path / "data", max_artifact_mb=1)) as url:
        too_big = httpx.put(f"{url}/v1alpha1/artifacts/jobs/j/t/blob.bin", content=b"x" * (1024 * 1024 + 1))
        assert too_big.status_code == 413
        assert not (tmp_path / "data" / "artifacts" / "jobs" / "j" / "t" / "blob.bin").exists()
        assert httpx.put(f"{url}/v1alpha1/artifacts/jobs/j/t/blob.bin", content=b"x" * 1024).status_code == 200


def test_artifact_keys_that_clash_as_file_and_directory_are_409(api: Any) -> None:
    assert api.put("/v1alpha1/artifacts/col/a", content=b"file").status_code == 200
    assert api.put("/v1alpha1/artifacts/col2/d/e", content=b"inner").status_code == 200
    under_file = api.put("/v1alpha1/artifacts/col/a/b", content=b"x")
    assert under_file.status_code == 409, under_file.text
    assert under_file.json()["detail"] == (
        "artifact key 'col/a/b' clashes with the existing artifact 'col/a': a key cannot lie under another "
        "artifact's key; choose a key that does not start with 'col/a/'")
    assert api.put("/v1alpha1/artifacts/col/a/x/y", content=b"x").status_code == 409
    over_dir = api.put("/v1alpha1/artifacts/col2/d", content=b"x")
    assert over_dir.status_code == 409, over_dir.text
    assert "existing artifacts under 'col2/d/' (such as 'col2/d/e')" in over_dir.json()["detail"]
    assert api.get("/v1alpha1/artifacts/col/a").content == b"file"
    assert api.get("/v1alpha1/artifacts/col2/d/e").content == b"inner"
    assert not list((api.data_dir / "artifacts").rglob(".upload-*"))  # no temp file left behind


def test_job_artifact_listings_need_a_known_job(api: Any) -> None:
    """Only a job's own ``jobs/<id>/`` is listed: an id like '..' is no job (404), never the store."""
    job_id = api.post("/v1alpha1/jobs", json=job_spec(trials=1)).json()["job_id"]
    for key in ("secret/x.txt", "jobs/abc/t/m.json", f"jobs/{job_id}/trial-000/m.json"):
        assert api.put(f"/v1alpha1/artifacts/{key}", content=b"1").status_code == 200
    for other in ("%2E%2E", "%2E", "abc", "000000000000"):
        listed = api.get(f"/v1alpha1/jobs/{other}/artifacts")
        assert listed.status_code == 404, (other, listed.text)
        assert listed.json()["detail"].startswith("unknown job")
    assert [a["key"] for a in api.get(f"/v1alpha1/jobs/{job_id}/artifacts").json()] == [
        f"jobs/{job_id}/trial-000/m.json"]


def test_a_refused_submit_stores_no_job_no_event_and_no_task(api: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """a refused expansion is a 422 and leaves no trace, even when the
    refusal comes from the lease store part-way through queueing the tasks."""
    from flashruntime.protocol.v1alpha1 import TaskSpec
    from flashruntime.recipes import WorkloadRecipe, base, register_recipe
    from flashruntime.recipes.base import lease_task

    class Recipe(WorkloadRecipe):
        def __init__(self, kind: str, build: Any) -> None:
            self.kind, self.build = kind, build

        def expand(self, job_id: str, spec: Any) -> list[TaskSpec]:
            return self.build(job_id, spec)

        def validate_output(self, metrics: Any) -> None:
            return None

    def unqueueable(job_id: str, spec: Any) -> list[TaskSpec]:  # the lease store refuses the second task
        good = lease_task(job_id, "task-000", spec, {}, 60.0)
        return [good, TaskSpec.model_construct(**{**dict(good), "task_id": "task-001", "lease_seconds": -1.0})]

    monkeypatch.setattr(base, "_RECIPES", dict(base._RECIPES))
    register_recipe(Recipe("dup_ids", lambda job_id, spec: [lease_task(job_id, "t", spec, {}, 60.0)] * 2))
    register_recipe(Recipe("other_job", lambda job_id, spec: [lease_task("0" * 12, "t", spec, {}, 60.0)]))
    register_recipe(Recipe("nested_id", lambda job_id, spec: [lease_task(job_id, "a/b", spec, {}, 60.0)]))
    register_recipe(Recipe("unqueueable", unqueueable))

    def submit(kind: str) -> Any:
        body = job_spec()
        body["spec"]["workload"] = {"type": kind, "parameters": {}}
        return api.post("/v1alpha1/jobs", json=body)

    expected = {
        "dup_ids": "returned duplicate task ids ('t') among its 2 tasks: task ids must be unique within a job",
        "other_job": "for job '000000000000', not for the submitted job",
        "nested_id": "returned task id 'a/b': a task id must be a non-empty name without '/'",
        "unqueueable": "task 'task-001' of workload.type 'unqueueable' cannot be queued: lease_seconds must be",
    }
    for kind, detail in expected.items():
        refused = submit(kind)
        assert refused.status_code == 422, (kind, refused.text)
        assert detail in refused.json()["detail"], (kind, refused.json())
    assert api.get("/v1alpha1/jobs").json() == []
    assert 'flashruntime_tasks{state="PENDING"} 0' in api.get("/metrics").text
    with contextlib.closing(sqlite3.connect(api.data_dir / "flashruntime.db")) as ledger:
        assert ledger.execute("SELECT COUNT(*) FROM events").fetchone()[0] == 0
    # a good submit afterwards is whole: its job, its events in order, its tasks
    job_id = api.post("/v1alpha1/jobs", json=job_spec(trials=2)).json()["job_id"]
    types = [e["type"] for e in api.get(f"/v1alpha1/jobs/{job_id}/events").json()]
    assert types == ["JOB_ACCEPTED", "BACKEND_SELECTED", "TASK_CREATED", "TASK_CREATED"]
    assert [t["task_id"] for t in api.get(f"/v1alpha1/jobs/{job_id}/tasks").json()] == ["trial-000", "trial-001"]


TOKENS = {"FLASHML_NODE_TOKENS": "node-a:tok-a,node-b:tok-b", "FLASHML_OPERATOR_TOKENS": "driver:tok-op"}


def test_auth_when_enforcing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in TOKENS.items():
        monkeypatch.setenv(name, value)

    def as_(token: str, **headers: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}", **headers}

    with serve_in_thread(settings_for(tmp_path / "data")) as url, httpx.Client(base_url=url) as api:
        assert api.post("/v1alpha1/nodes/register", json=registration()).status_code == 401
        assert api.post("/v1alpha1/nodes/register", json=registration(), headers=as_("nope")).status_code == 401
        # the body's node id is replaced by the acting node's
        reg = api.post("/v1alpha1/nodes/register", json=registration("spoofed"), headers=as_("tok-a"))
        assert reg.json() == {"node_id": "node-a", "status": "registered"}
        api.post("/v1alpha1/nodes/register", json=registration("node-b"), headers=as_("tok-b"))
        assert api.post("/v1alpha1/nodes/register", json=registration(), headers=as_("tok-op")).status_code == 401
        assert api.post("/v1alpha1/nodes/node-b/heartbeat", json={"node_id": "node-b"},
                        headers=as_("tok-a")).status_code == 403
        assert api.post("/v1alpha1/jobs", json=job_spec(trials=2)).status_code == 401
        job_id = api.post("/v1alpha1/jobs", json=job_spec(trials=2), headers=as_("tok-op")).json()["job_id"]
        lease = api.post("/v1alpha1/leases/claim", json={"node_id": "node-b"}, headers=as_("tok-a")).json()
        assert lease["node_id"] == "node-a"
        prefix = lease["payload"]["output_prefix"]
        # writes are confined to the acting node's live leases
        assert api.put(f"/v1alpha1/artifacts/{prefix}metrics.json", content=b"{}", headers=as_("tok-b")).status_code == 403
        assert api.put(f"/v1alpha1/artifacts/jobs/{job_id}/other/x", content=b"{}", headers=as_("tok-a")).status_code == 403
        assert api.put(f"/v1alpha1/artifacts/{prefix}metrics.json", content=b"{}", headers=as_("tok-a")).status_code == 200
        # another node may not act on the lease, nor learn whether an id exists
        assert api.post(f"/v1alpha1/attempts/{lease['lease_id']}/heartbeat", headers=as_("tok-b")).status_code == 403
        assert api.post("/v1alpha1/attempts/ls-000000000000/heartbeat", headers=as_("tok-b")).status_code == 403
        # an operator acts exactly as a node through the delegation header
        on_behalf = as_("tok-op", **{"X-FlashML-On-Behalf-Of": "node-a"})
        assert api.post(f"/v1alpha1/attempts/{lease['lease_id']}/heartbeat", headers=on_behalf).status_code == 200
        assert api.post("/v1alpha1/nodes/node-a/cordon", json={"seconds": 60}, headers=on_behalf).status_code == 403
        assert api.post("/v1alpha1/nodes/node-a/cordon", json={"seconds": 60}, headers=as_("tok-a")).status_code == 403
        assert api.post("/v1alpha1/nodes/node-a/cordon", json={"seconds": 60}).status_code == 401
        assert api.post("/v1alpha1/nodes/node-a/cordon", json={"seconds": 60}, headers=as_("tok-op")).status_code == 200
        twice = api.post(f"/v1alpha1/attempts/{lease['lease_id']}/heartbeat",
                         headers=[("Authorization", "Bearer tok-op"), ("X-FlashML-On-Behalf-Of", "node-a"),
                                  ("X-FlashML-On-Behalf-Of", "node-b")])
        assert twice.status_code == 400
        done = api.post(f"/v1alpha1/attempts/{lease['lease_id']}/complete",
                        json={"output_sha256": hashlib.sha256(b"{}").hexdigest()}, headers=as_("tok-a"))
        assert done.json() == {"accepted": True}
        # a header-less operator writes anywhere (the FedAvg driver publishing weights)
        assert api.put(f"/v1alpha1/artifacts/jobs/{job_id}/round-1/weights.json", content=b"{}",
                       headers=as_("tok-op")).status_code == 200


def test_an_upload_refused_after_its_body_arrived_changes_nothing(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """the write scope is checked again once the body is in, before the
    rename, so a node whose lease ends mid-upload gets a 403 and the old content stays."""
    for name, value in TOKENS.items():
        monkeypatch.setenv(name, value)
    node_a = {"Authorization": "Bearer tok-a"}
    data = tmp_path / "data"
    with serve_in_thread(settings_for(data)) as url, httpx.Client(base_url=url, timeout=10) as api:
        api.post("/v1alpha1/nodes/register", json=registration(), headers=node_a)
        operator = {"Authorization": "Bearer tok-op"}
        job_id = api.post("/v1alpha1/jobs", json=job_spec(trials=1), headers=operator).json()["job_id"]
        lease = api.post("/v1alpha1/leases/claim", json={"node_id": "node-a"}, headers=node_a).json()
        key = lease["payload"]["output_prefix"] + "metrics.json"
        assert api.put(f"/v1alpha1/artifacts/{key}", content=b'{"v": 1}', headers=node_a).status_code == 200
        task_dir = data / "artifacts" / lease["payload"]["output_prefix"]

        def body_outliving_the_lease() -> Any:
            yield b'{"v": '
            deadline = time.monotonic() + 10
            while not list(task_dir.glob(".upload-*")):  # the first check passed: the body is being received
                assert time.monotonic() < deadline, "the upload never started"
                time.sleep(0.01)
            cancelled = httpx.post(f"{url}/v1alpha1/jobs/{job_id}/cancel", headers=operator)
            assert cancelled.json()["state"] == "CANCELLED"
            yield b"2}"

        late = api.put(f"/v1alpha1/artifacts/{key}", content=body_outliving_the_lease(), headers=node_a)
        assert late.status_code == 403, late.text
        assert api.get(f"/v1alpha1/artifacts/{key}", headers=operator).content == b'{"v": 1}'  # the old content stays
        assert sorted(p.name for p in task_dir.iterdir()) == ["metrics.json"]  # and no temp file
        assert "the lease ended while the body was uploading, so nothing was stored" in late.json()["detail"]


def test_join_code_gates_registration(tmp_path: Path) -> None:
    with serve_in_thread(settings_for(tmp_path / "data", join_code="s3cret")) as url:
        assert httpx.post(f"{url}/v1alpha1/nodes/register", json=registration()).status_code == 403
        wrong = httpx.post(f"{url}/v1alpha1/nodes/register", json=registration(), headers={"X-FlashML-Join-Code": "x"})
        assert wrong.status_code == 403
        ok = httpx.post(f"{url}/v1alpha1/nodes/register", json=registration(), headers={"X-FlashML-Join-Code": "s3cret"})
        assert ok.status_code == 200


def test_required_auth_without_tokens_refuses_to_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flashruntime.coordinator.app import create_app

    monkeypatch.setenv("FLASHML_REQUIRE_NODE_AUTH", "1")
    monkeypatch.delenv("FLASHML_NODE_TOKENS", raising=False)
    monkeypatch.delenv("FLASHML_OPERATOR_TOKENS", raising=False)
    with pytest.raises(RuntimeError, match="FLASHML_REQUIRE_NODE_AUTH=1 but no tokens"):
        create_app(settings_for(tmp_path / "data"))


def test_a_lease_survives_a_kill9_of_the_coordinator(tmp_path: Path) -> None:
    """a lease issued before a coordinator restart can still be renewed and
    committed afterwards; the job, its events and the artifact are all still there."""
    data = tmp_path / "data"
    first = CoordinatorProcess(data).start()
    try:
        api = httpx.Client(base_url=first.url, timeout=10)
        job_id = api.post("/v1alpha1/jobs", json=job_spec(trials=1)).json()["job_id"]
        api.post("/v1alpha1/nodes/register", json=registration())
        lease = api.post("/v1alpha1/leases/claim", json={"node_id": "node-a"}).json()
        key = lease["payload"]["output_prefix"] + "metrics.json"
        assert api.put(f"/v1alpha1/artifacts/{key}", content=b'{"score": 2}').status_code == 200
        first.kill9()
    finally:
        first.stop()
    second = CoordinatorProcess(data).start()
    try:
        api = httpx.Client(base_url=second.url, timeout=10)
        assert api.get(f"/v1alpha1/jobs/{job_id}").json()["state"] == "RUNNING"
        assert api.post(f"/v1alpha1/attempts/{lease['lease_id']}/heartbeat").status_code == 200
        done = api.post(f"/v1alpha1/attempts/{lease['lease_id']}/complete",
                        json={"output_sha256": hashlib.sha256(b'{"score": 2}').hexdigest()})
        assert done.json() == {"accepted": True}
        assert api.get(f"/v1alpha1/jobs/{job_id}").json()["state"] == "SUCCEEDED"
        types = [e["type"] for e in api.get(f"/v1alpha1/jobs/{job_id}/events").json()]
        assert types[:2] == ["JOB_ACCEPTED", "BACKEND_SELECTED"] and "LEASE_CLAIMED" in types
    finally:
        second.stop()
    assert json.loads((data / "artifacts" / key).read_text()) == {"score": 2}


def test_a_restart_keeps_every_registration_and_cordon(tmp_path: Path) -> None:
    """After a ``kill -9`` of the coordinator, a registered node heartbeats and claims without
    registering again, its registration (pools from its last heartbeat), accepted count and
    last heartbeat are kept, and a cordoned node stays cordoned: it gets no lease."""
    data = tmp_path / "data"
    first = CoordinatorProcess(data).start()
    try:
        api = httpx.Client(base_url=first.url, timeout=10)
        job_id = api.post("/v1alpha1/jobs", json=job_spec(trials=3)).json()["job_id"]
        for node_id in ("node-a", "node-b"):
            assert api.post("/v1alpha1/nodes/register", json=registration(node_id)).status_code == 200
        assert api.post("/v1alpha1/nodes/node-a/heartbeat",
                        json={"node_id": "node-a", "pools": ["team-7"]}).status_code == 200
        lease = api.post("/v1alpha1/leases/claim", json={"node_id": "node-a"}).json()
        output = b'{"score": 1}'
        assert api.put(f"/v1alpha1/artifacts/{lease['payload']['output_prefix']}metrics.json",
                       content=output).status_code == 200
        assert api.post(f"/v1alpha1/attempts/{lease['lease_id']}/complete",
                        json={"output_sha256": hashlib.sha256(output).hexdigest()}).json() == {"accepted": True}
        cordoned = api.post("/v1alpha1/nodes/node-b/cordon", json={"reason": "disk"})
        assert cordoned.status_code == 200, cordoned.text
        before = {row["node_id"]: row for row in api.get("/v1alpha1/nodes").json()}
        first.kill9()
    finally:
        first.stop()
    second = CoordinatorProcess(data).start()
    try:
        api = httpx.Client(base_url=second.url, timeout=10)
        after = {row["node_id"]: row for row in api.get("/v1alpha1/nodes").json()}
        assert sorted(after) == ["node-a", "node-b"]
        for node_id in after:  # everything but liveness, which only a heartbeat re-establishes
            assert {k: v for k, v in after[node_id].items() if k not in ("online", "last_heartbeat_age_s")} == {
                k: v for k, v in before[node_id].items() if k not in ("online", "last_heartbeat_age_s")}
        assert after["node-a"]["capabilities"]["pools"] == ["team-7"] and after["node-a"]["accepted_tasks"] == 1
        assert after["node-b"]["cordon_reason"] == "disk"
        # its last heartbeat was stored: still online, from the age the stored one gives
        assert after["node-a"]["online"] and after["node-a"]["last_heartbeat_age_s"] < 15
        assert api.post("/v1alpha1/nodes/node-a/heartbeat", json={"node_id": "node-a"}).status_code == 200
        assert api.post("/v1alpha1/leases/claim", json={"node_id": "node-b"}).status_code == 204  # still cordoned
        claimed = api.post("/v1alpha1/leases/claim", json={"node_id": "node-a"})  # no new registration
        assert claimed.status_code == 200 and claimed.json()["job_id"] == job_id
    finally:
        second.stop()


def test_importing_the_app_module_has_no_side_effects_and_app_is_built_on_access(tmp_path: Path) -> None:
    """``flashruntime.coordinator.app.app`` is built lazily (once), or is None with
    ``FLASHML_SERVICE_AUTOINIT=0``; the import alone creates nothing."""
    import subprocess
    import sys

    from tests.service_server import process_env

    code = (
        "import pathlib, sys; import flashruntime.coordinator.app as m; d = pathlib.Path(sys.argv[1]);"
        "assert not d.exists(), 'import created files'; a = m.app; assert a is m.app;"
        "print(type(a).__name__, d.joinpath('flashruntime.db').exists(), d.joinpath('artifacts').exists())"
    )
    data = tmp_path / "data"
    env = process_env(FLASHML_LEDGER_PATH=str(data / "flashruntime.db"),
                      FLASHML_LOCAL_ARTIFACTS_DIR=str(data / "artifacts"))
    built = subprocess.run([sys.executable, "-c", code, str(data)], env=env, capture_output=True, text=True,
                           timeout=120, check=False)
    assert built.returncode == 0 and built.stdout.split() == ["FastAPI", "True", "True"], built.stderr
    off = subprocess.run([sys.executable, "-c", code.replace("True", "False"), str(tmp_path / "off")],
                         env={**env, "FLASHML_SERVICE_AUTOINIT": "0"}, capture_output=True, text=True, timeout=120,
                         check=False)
    assert off.returncode == 0 and off.stdout.split() == ["NoneType", "False", "False"], off.stderr
