"""``GET /v1alpha1/jobs/{id}/metrics`` over real HTTP (uvicorn on 127.0.0.1, tokens): each
task's curves from the ``metrics.jsonl`` its node uploaded, ``?task=`` and ``?points=``,
their refusals, and who may read them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flashruntime.protocol.task_metrics import MAX_POINTS
from tests.integration.test_service_app import job_spec, registration
from tests.service_server import serve_in_thread, settings_for

pytestmark = pytest.mark.service
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

TOKENS = {
    "FLASHML_NODE_TOKENS": "node-a:tok-node",
    "FLASHML_SUBMITTER_TOKENS": "alice:tok-alice,bob:tok-bob",
    "FLASHML_OPERATOR_TOKENS": "root:tok-root",
}
NODE, ALICE, BOB, ROOT = ({"Authorization": f"Bearer {token}"} for token in
                          ("tok-node", "tok-alice", "tok-bob", "tok-root"))
RECORDS = "".join(json.dumps({"step": step, "loss": 1.0 / step, "ts": 1000.0 + step}) + "\n" for step in range(1, 301))


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, str]]:
    """Alice's two-task job; node A holds trial-000 and uploaded its step records."""
    for name, value in TOKENS.items():
        monkeypatch.setenv(name, value)
    with serve_in_thread(settings_for(tmp_path / "data", rate_limit_per_s=0.0)) as url, \
            httpx.Client(base_url=url, timeout=30) as api:
        assert api.post("/v1alpha1/nodes/register", json=registration(), headers=NODE).status_code == 200
        job_id = api.post("/v1alpha1/jobs", json=job_spec(trials=2), headers=ALICE).json()["job_id"]
        lease = api.post("/v1alpha1/leases/claim", json={"node_id": "node-a"}, headers=NODE).json()
        assert lease["task_id"] == "trial-000"
        put = api.put(f"/v1alpha1/artifacts/jobs/{job_id}/trial-000/metrics.jsonl", content=RECORDS.encode(),
                      headers=NODE)
        assert put.status_code == 200, put.text
        yield api, job_id


def test_every_task_s_curve_thinned_to_the_points_asked_for(world: tuple[Any, str]) -> None:
    api, job_id = world
    answer = api.get(f"/v1alpha1/jobs/{job_id}/metrics", params={"points": 4}, headers=ALICE)
    assert answer.status_code == 200, answer.text
    first, second = answer.json()["tasks"]
    assert (first["task_id"], first["state"], first["node_id"], first["keys"]) == ("trial-000", "LEASED", "node-a", ["loss"])
    assert [point["step"] for point in first["points"]] == [1, 101, 200, 300]
    assert first["points"][-1] == {"step": 300, "ts": 1300.0, "values": {"loss": 1.0 / 300}}
    assert (first["records"], first["truncated"]) == (300, False)
    assert second == {"task_id": "trial-001", "state": "PENDING", "node_id": None, "keys": [], "points": [],
                      "records": 0, "truncated": False}
    assert api.get(f"/v1alpha1/jobs/{job_id}/metrics", params={"points": 4}, headers=ROOT).json() == answer.json()


def test_one_task_and_the_refusals(world: tuple[Any, str]) -> None:
    api, job_id = world
    one = api.get(f"/v1alpha1/jobs/{job_id}/metrics", params={"task": "trial-000"}, headers=ALICE).json()["tasks"]
    assert [entry["task_id"] for entry in one] == ["trial-000"] and len(one[0]["points"]) == 120  # the default
    missing = api.get(f"/v1alpha1/jobs/{job_id}/metrics", params={"task": "trial-9"}, headers=ALICE)
    assert missing.status_code == 404 and "has no task 'trial-9'" in missing.text
    for points in (1, MAX_POINTS + 1, "many"):
        bad = api.get(f"/v1alpha1/jobs/{job_id}/metrics", params={"points": points}, headers=ALICE)
        assert bad.status_code == 422, (points, bad.text)
    assert api.get(f"/v1alpha1/jobs/{job_id}/metrics", headers=BOB).status_code == 404  # another's job: unknown
    assert api.get(f"/v1alpha1/jobs/{job_id}/metrics", headers=NODE).status_code == 403
    assert api.get(f"/v1alpha1/jobs/{job_id}/metrics").status_code == 401
