"""Checkpoint routes over real HTTP with bodies the wire models accept but the catalog cannot
take: a step or size beyond SQLite's 64-bit integers (422), a world size below one (409 with
CHECKPOINT_REJECTED, like any refused commit). Before, both answered 500."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.service_server import serve_in_thread, settings_for

pytestmark = pytest.mark.service
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

PART = {"key": "rank0.pt", "sha256": "a" * 64, "size_bytes": 10}
JOB = {"apiVersion": "flashml.dev/v1alpha1", "kind": "Job", "metadata": {"name": "ckpt"},
       "spec": {"execution": {"backend": "leases"}, "image": {"repository": "local/tier1", "tag": "dev"},
                "workload": {"type": "hyperparameter_search", "parameters": {"trials": [{"C": 1.0}]}}}}


def test_checkpoint_bodies_the_catalog_cannot_take_get_4xx_and_change_nothing(tmp_path: Path) -> None:
    with serve_in_thread(settings_for(tmp_path / "data")) as url, httpx.Client(base_url=url, timeout=10) as api:
        base = f"/v1alpha1/jobs/{api.post('/v1alpha1/jobs', json=JOB).json()['job_id']}/tasks/t1/checkpoints"
        for body in ({"attempt_id": "a1", "step": 2**63, "part": PART},
                     {"attempt_id": "a1", "step": 5, "part": {**PART, "size_bytes": 2**63}}):
            refused = api.post(f"{base}/parts", json=body)
            assert refused.status_code == 422, refused.text
            assert "beyond the largest integer the part registry can hold" in refused.json()["detail"]
        assert api.post(f"{base}/parts", json={"attempt_id": "a1", "step": 5, "part": PART}).status_code == 200
        commit = {"attempt_id": "a1", "step": 5, "expected_parts": [PART], "storage_prefix": "ckpt/5/", "world_size": 0}
        refused = api.post(f"{base}/commit", json=commit)
        assert refused.status_code == 409 and "world sizes must be integers >= 1" in refused.json()["detail"]
        assert api.get(f"{base}/latest").status_code == 404  # nothing was committed
        huge_step = api.post(f"{base}/commit", json={**commit, "step": 2**63, "world_size": 1})
        assert huge_step.status_code == 409 and "not registered" in huge_step.json()["detail"]
        committed = api.post(f"{base}/commit", json={**commit, "world_size": 1})
        assert committed.status_code == 200 and committed.json()["step"] == 5
