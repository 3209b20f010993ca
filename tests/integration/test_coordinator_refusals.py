"""What a live coordinator refuses that it once took, and how it says so: a lease shorter
than a second, an empty artifact upload, a capability claimed with 0 or 1, checkpoint
parts and prefixes outside the task's own place, and an upload over the limit, which
the client reports as too large rather than as a broken connection."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_service_app import job_spec, registration
from tests.service_server import serve_in_thread, settings_for

pytestmark = pytest.mark.service
httpx = pytest.importorskip("httpx")


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Any]:
    with serve_in_thread(settings_for(tmp_path / "data", max_artifact_mb=1)) as url, \
            httpx.Client(base_url=url, timeout=30) as client:
        yield client


def test_a_job_asking_for_a_lease_shorter_than_a_second_is_refused_and_stores_nothing(api: Any) -> None:
    refused = api.post("/v1alpha1/jobs", json=job_spec(trials=1, lease_seconds=1e-6))
    assert refused.status_code == 422
    assert "lease_seconds must be at least 1 s" in refused.json()["detail"]
    assert api.get("/v1alpha1/jobs").json() == []
    assert api.post("/v1alpha1/jobs", json=job_spec(trials=1, lease_seconds=1)).status_code == 201


def test_an_empty_artifact_upload_is_refused_and_the_previous_content_stays(api: Any) -> None:
    key = "/v1alpha1/artifacts/users/alice/notes.txt"
    assert api.put(key, content=b"first").status_code == 200

    def nothing() -> Iterator[bytes]:
        yield from ()

    for body in (b"", nothing()):  # Content-Length: 0, and a chunked body that ends at once
        refused = api.put(key, content=body)
        assert refused.status_code == 400, refused.text
        assert "the artifact body is empty" in refused.json()["detail"]
    assert api.get(key).content == b"first"
    assert api.put("/v1alpha1/artifacts/users/alice/new.txt", content=b"").status_code == 400
    assert api.get("/v1alpha1/artifacts/users/alice/new.txt").status_code == 404


@pytest.mark.parametrize("value", [0, 1, "true"])
def test_a_capability_claimed_with_a_number_or_a_string_is_refused(api: Any, value: Any) -> None:
    refused = api.post("/v1alpha1/nodes/register", json={**registration(), "module_capable": value})
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["body", "module_capable"]
    assert api.get("/v1alpha1/nodes").json() == []
    assert api.post("/v1alpha1/nodes/register", json={**registration(), "module_capable": True}).status_code == 200


@pytest.mark.parametrize("field", ["network", "allowFallback"])
@pytest.mark.parametrize("value", [1, "true", "yes"])
def test_an_isolation_widened_by_a_number_or_a_string_is_refused(api: Any, field: str, value: Any) -> None:
    spec = job_spec(trials=1)
    spec["spec"]["isolation"] = {"tier": "sandboxed", field: value}
    refused = api.post("/v1alpha1/jobs", json=spec)
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"][-1] == field, refused.text
    assert api.get("/v1alpha1/jobs").json() == []


def test_checkpoint_parts_and_prefixes_outside_the_task_are_refused_and_nothing_is_registered(api: Any) -> None:
    job_id = api.post("/v1alpha1/jobs", json=job_spec(trials=1)).json()["job_id"]
    base = f"/v1alpha1/jobs/{job_id}/tasks/t1/checkpoints"
    foreign = {"key": "users/bob/model.pt", "sha256": "a" * 64, "size_bytes": 10}
    refused = api.post(f"{base}/parts", json={"attempt_id": "a1", "step": 5, "part": foreign})
    assert refused.status_code == 422 and "users/bob/model.pt" in refused.json()["detail"]
    part = {"key": "rank0.pt", "sha256": "a" * 64, "size_bytes": 10}
    assert api.post(f"{base}/parts", json={"attempt_id": "a1", "step": 5, "part": part}).status_code == 200
    for prefix in ("/etc", "../../users/bob/", "s3://bucket/5"):
        commit = {"attempt_id": "a1", "step": 5, "expected_parts": [part], "storage_prefix": prefix}
        refused = api.post(f"{base}/commit", json=commit)
        assert refused.status_code == 422 and "storage_prefix" in refused.json()["detail"], prefix
    commit = {"attempt_id": "a1", "step": 5, "expected_parts": [foreign], "storage_prefix": "ckpt/5/"}
    assert api.post(f"{base}/commit", json=commit).status_code == 422
    assert api.get(f"{base}/latest").status_code == 404  # no manifest was kept
    good = {"attempt_id": "a1", "step": 5, "expected_parts": [part], "storage_prefix": "ckpt/5/"}
    assert api.post(f"{base}/commit", json=good).json()["validation"] == "hash_verified"


@pytest.mark.parametrize("mib", [2, 8, 64])
@pytest.mark.parametrize("as_file", [False, True], ids=["bytes", "file"])
def test_an_upload_over_the_limit_reads_as_too_large_not_as_an_unreachable_coordinator(
        api: Any, tmp_path: Path, mib: int, as_file: bool) -> None:
    from flashruntime.client import NO_RETRY, CoordinatorClient
    from flashruntime.errors import CoordinatorHTTPError

    client = CoordinatorClient(str(api.base_url), retry=NO_RETRY)
    body: bytes | Path = b"x" * (mib << 20)
    if as_file:
        (tmp_path / "big.bin").write_bytes(body)  # type: ignore[arg-type]
        body = tmp_path / "big.bin"
    with pytest.raises(CoordinatorHTTPError) as refused:
        client.put_artifact("users/alice/big.bin", body)
    assert refused.value.status == 413
    assert "over the coordinator's limit of 1 MiB (FLASHML_MAX_ARTIFACT_MB)" in refused.value.detail
    assert client.put_artifact("users/alice/small.bin", b"y" * (1 << 19))["size_bytes"] == 1 << 19
