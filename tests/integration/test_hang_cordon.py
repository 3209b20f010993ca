"""A node whose attempts hang repeatedly is cordoned by a real coordinator: each hang its
worker reports is recorded against the node, and the ``FLASHML_HANG_CORDON_AFTER``-th within
the window, of any job, cordons it for the window, so no further task is leased to it; a
node whose attempts fail otherwise, or hang once, keeps working."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_service_app import job_spec, registration
from tests.service_server import serve_in_thread, settings_for

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")


def _spec(name: str, attempts: int = 5) -> dict[str, Any]:
    spec = job_spec(trials=1)
    spec["metadata"]["name"] = name
    spec["spec"]["retryPolicy"] = {"maxTaskAttempts": attempts}
    return spec


def _claim(api: Any, node_id: str) -> dict[str, Any] | None:
    answer = api.post("/v1alpha1/leases/claim", json={"node_id": node_id})
    assert answer.status_code in (200, 204), answer.text
    return answer.json() if answer.status_code == 200 else None


def _fail(api: Any, lease: dict[str, Any], **body: Any) -> None:
    answer = api.post(f"/v1alpha1/attempts/{lease['lease_id']}/fail",
                      json={"reason": "hang: no progress for 60 s; rank 0 last at step 3", **body})
    assert answer.status_code == 200, answer.text


def _node(api: Any, node_id: str) -> dict[str, Any]:
    return next(row for row in api.get("/v1alpha1/nodes").json() if row["node_id"] == node_id)


def test_a_node_whose_attempts_hang_twice_in_two_jobs_is_cordoned(tmp_path: Path) -> None:
    with serve_in_thread(settings_for(tmp_path / "data", hang_cordon_after=2)) as url, \
            httpx.Client(base_url=url, timeout=10) as api:
        for node_id in ("node-a", "node-b"):
            assert api.post("/v1alpha1/nodes/register", json=registration(node_id)).status_code == 200
        first = api.post("/v1alpha1/jobs", json=_spec("first", attempts=2)).json()["job_id"]
        lease = _claim(api, "node-a")
        assert lease is not None and lease["job_id"] == first
        _fail(api, lease, reason="exit 1: a plain crash", exit_code=1)  # not a hang: not counted
        lease = _claim(api, "node-a")
        assert lease is not None
        _fail(api, lease, hung=True)
        assert _node(api, "node-a")["cordoned_until"] is None  # one hang is not a pattern
        assert api.get(f"/v1alpha1/jobs/{first}").json()["state"] == "FAILED"  # its two attempts are spent

        second = api.post("/v1alpha1/jobs", json=_spec("second")).json()["job_id"]
        lease = _claim(api, "node-a")
        assert lease is not None and lease["job_id"] == second
        _fail(api, lease, hung=True)
        row = _node(api, "node-a")
        assert row["cordoned_until"] is not None
        assert row["cordon_reason"].startswith("2 attempts hung within 3600 s (the last: "), row
        assert "DELETE /v1alpha1/nodes/node-a/cordon" in row["cordon_reason"]
        assert _claim(api, "node-a") is None  # nothing more is leased to it
        taken = _claim(api, "node-b")
        assert taken is not None and taken["job_id"] == second
        assert _node(api, "node-b")["cordoned_until"] is None
        judged = [event["data"]["failure_class"] for job in (first, second)
                  for event in api.get(f"/v1alpha1/jobs/{job}/events").json() if event["type"] == "FAILURE_CLASSIFIED"]
        assert judged == ["worker_crash", "hang", "hang"], judged


def test_no_node_is_cordoned_for_hangs_when_the_rule_is_off(tmp_path: Path) -> None:
    with serve_in_thread(settings_for(tmp_path / "data", hang_cordon_after=0)) as url, \
            httpx.Client(base_url=url, timeout=10) as api:
        assert api.post("/v1alpha1/nodes/register", json=registration("node-a")).status_code == 200
        api.post("/v1alpha1/jobs", json=_spec("only"))
        for _ in range(3):
            lease = _claim(api, "node-a")
            assert lease is not None
            _fail(api, lease, hung=True)
        assert _node(api, "node-a")["cordoned_until"] is None
