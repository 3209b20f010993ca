"""A multi-node job on a real coordinator (uvicorn on 127.0.0.1) driven over HTTP by two
nodes: refused with nothing stored where no rendezvous store is served, one node task per
machine, and the end of the job when its group finishes on one node while the other node's
task, lost with its machine, comes back to the queue."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from tests._support import wait_until
from tests.service_server import serve_in_thread, settings_for

pytestmark = pytest.mark.service
httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")


def _spec() -> dict[str, Any]:
    return {"metadata": {"name": "nodes"}, "spec": {
        "workload": {"type": "command", "parameters": {
            "command": ["python", "train.py"], "nodes": {"min": 1, "max": 2}, "lease_seconds": 1}},
        "isolation": {"tier": "sandboxed", "allowFallback": True}, "placement": {"pool": "team"}}}


def _register(http: Any, node_id: str) -> None:
    registration = {"node_id": node_id, "kubernetes_node": "", "hostname": f"{node_id}.local",
                    "unsandboxed_argv_capable": True, "capabilities": {"cpu_cores": 1, "pools": ["team"]}}
    assert http.post("/v1alpha1/nodes/register", json=registration).status_code == 200


def _claim(http: Any, node_id: str) -> dict[str, Any] | None:
    answer = http.post("/v1alpha1/leases/claim", json={"node_id": node_id})
    assert answer.status_code in (200, 204), answer.text
    return answer.json() if answer.status_code == 200 else None


def test_without_a_rendezvous_store_a_multi_node_job_is_refused_and_nothing_stored(tmp_path: Path) -> None:
    with serve_in_thread(settings_for(tmp_path / "data")) as url, httpx.Client(base_url=url, timeout=30) as http:
        refused = http.post("/v1alpha1/jobs", json=_spec())
        assert refused.status_code == 422, refused.text
        assert "--rendezvous-port PORT" in refused.text
        assert http.get("/v1alpha1/jobs").json() == []


def test_one_node_per_machine_and_the_job_ends_with_its_group(tmp_path: Path) -> None:
    with serve_in_thread(settings_for(tmp_path / "data", rendezvous_port=29499)) as url, \
            httpx.Client(base_url=url, timeout=30) as http:
        created = http.post("/v1alpha1/jobs", json=_spec())
        assert created.status_code == 201, created.text
        job_id = created.json()["job_id"]
        _register(http, "box-a")
        _register(http, "box-b")
        first = _claim(http, "box-a")
        assert first is not None and first["payload"]["gang"]["port"] == 29499
        assert _claim(http, "box-a") is None  # the job's other node is not for a machine running one
        second = _claim(http, "box-b")
        assert second is not None and {first["task_id"], second["task_id"]} == {"node-000", "node-001"}
        # One group: the second node joins the rendezvous the first started, under an id no
        # other job can derive from this one's.
        group = first["payload"]["gang"]["rdzv_id"]
        assert second["payload"]["gang"]["rdzv_id"] == group and group.startswith(job_id + "-") and group != job_id

        # box-a's group finishes: its node commits. box-b's machine is gone: its lease lapses,
        # its task comes back to the queue, and is cancelled, the run being over.
        body = json.dumps({"final_loss": 0.1}).encode()
        key = first["payload"]["output_prefix"] + "metrics.json"
        assert http.put(f"/v1alpha1/artifacts/{key}", content=body).status_code == 200
        done = http.post(f"/v1alpha1/attempts/{first['lease_id']}/complete",
                         json={"output_sha256": hashlib.sha256(body).hexdigest()})
        assert done.status_code == 200 and done.json()["accepted"] is True
        wait_until(lambda: http.get(f"/v1alpha1/jobs/{job_id}").json()["state"] != "RUNNING", "the job to end")
        job = http.get(f"/v1alpha1/jobs/{job_id}").json()
        tasks = {t["task_id"]: t["state"] for t in http.get(f"/v1alpha1/jobs/{job_id}/tasks").json()}
        events = http.get(f"/v1alpha1/jobs/{job_id}/events").json()
    assert job["state"] == "SUCCEEDED", job
    assert tasks == {first["task_id"]: "COMPLETED", second["task_id"]: "CANCELLED"}
    kinds = [e["type"] for e in events if e["data"].get("task_id") == second["task_id"]]
    assert kinds.index("LEASE_EXPIRED") < kinds.index("TASK_CANCELLED")
    cancelled = next(e for e in events if e["type"] == "TASK_CANCELLED")
    assert cancelled["data"]["reason"].startswith("not needed")


def _commit(http: Any, lease: dict[str, Any], metrics: dict[str, Any]) -> None:
    body = json.dumps(metrics).encode()
    key = lease["payload"]["output_prefix"] + "metrics.json"
    assert http.put(f"/v1alpha1/artifacts/{key}", content=body).status_code == 200
    done = http.post(f"/v1alpha1/attempts/{lease['lease_id']}/complete",
                     json={"output_sha256": hashlib.sha256(body).hexdigest()})
    assert done.status_code == 200 and done.json()["accepted"] is True


def test_nodes_that_all_end_without_the_runs_metrics_fail_the_job_and_a_new_group_meets_anew(
        tmp_path: Path) -> None:
    with serve_in_thread(settings_for(tmp_path / "data", rendezvous_port=29499)) as url, \
            httpx.Client(base_url=url, timeout=30) as http:
        job_id = http.post("/v1alpha1/jobs", json=_spec()).json()["job_id"]
        _register(http, "box-a")
        _register(http, "box-b")
        first = _claim(http, "box-a")
        assert first is not None
        # The group ends (its node gives the lease back, as after a preemption): the next node
        # to come meets under a new id, the first group's rendezvous being closed.
        released = http.post(f"/v1alpha1/attempts/{first['lease_id']}/release", json={"reason": "preempted"})
        assert released.status_code == 200, released.text
        again = _claim(http, "box-a")
        other = _claim(http, "box-b")
        assert again is not None and other is not None
        assert again["payload"]["gang"]["rdzv_id"] != first["payload"]["gang"]["rdzv_id"]
        assert other["payload"]["gang"]["rdzv_id"] == again["payload"]["gang"]["rdzv_id"]
        # Both nodes commit an empty object (no rank 0 wrote metrics): no result, no success.
        _commit(http, again, {})
        assert http.get(f"/v1alpha1/jobs/{job_id}").json()["state"] == "RUNNING"  # not closed by an empty commit
        _commit(http, other, {})
        wait_until(lambda: http.get(f"/v1alpha1/jobs/{job_id}").json()["state"] != "RUNNING", "the job to end")
        job = http.get(f"/v1alpha1/jobs/{job_id}").json()
        joined = [e for e in http.get(f"/v1alpha1/jobs/{job_id}/events").json() if e["type"] == "GANG_JOINED"]
    assert job["state"] == "FAILED" and job["error"].startswith("no node committed the run's metrics"), job
    assert [e["data"]["peers"] for e in joined] == [0, 0, 1]
