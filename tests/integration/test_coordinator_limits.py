"""Bad and oversized input at the coordinator's door: a precise 4xx, nothing stored.

Real uvicorn on 127.0.0.1: body limits (a 50 MB JSON body is refused with 413 before it
is read; a 200 MB artifact streams to disk in bounded memory, measured on a coordinator
process of its own), strict JSON (NaN, lone surrogates, deep nesting), node ids, 422
bodies that never echo the input, and the per-credential rate limit.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_service_app import job_spec, registration
from tests.service_server import CoordinatorProcess, serve_in_thread, settings_for

pytestmark = pytest.mark.service
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

MIB = 1024 * 1024


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Any]:
    with serve_in_thread(settings_for(tmp_path / "data")) as url, httpx.Client(base_url=url, timeout=60) as client:
        client.data_dir = tmp_path / "data"  # type: ignore[attr-defined]
        yield client


def _chunks(total: int, size: int = MIB) -> Iterator[bytes]:
    block = b"x" * size
    sent = 0
    while sent < total:
        piece = block[: min(size, total - sent)]
        sent += len(piece)
        yield piece


def _peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc/<pid>/status")


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc/<pid>/status")


@pytest.mark.slow
def test_a_200_mb_artifact_streams_to_disk_and_a_50_mb_json_body_is_refused_unread(tmp_path: Path) -> None:
    coordinator = CoordinatorProcess(tmp_path / "data").start()
    try:
        assert coordinator.process is not None
        pid = coordinator.process.pid
        with httpx.Client(base_url=coordinator.url, timeout=300) as api:
            api.post("/v1alpha1/jobs", json=job_spec(trials=1)).raise_for_status()  # warm every code path
            api.put("/v1alpha1/artifacts/warm/up.bin", content=b"w" * MIB).raise_for_status()
            before = _peak_rss_kib(pid)

            stored = api.put("/v1alpha1/artifacts/big/blob.bin", content=_chunks(200 * MIB))
            assert stored.status_code == 200, stored.text
            assert stored.json()["size_bytes"] == 200 * MIB
            growth_mib = (_peak_rss_kib(pid) - before) / 1024
            assert growth_mib < 64, f"peak RSS grew {growth_mib:.0f} MiB while storing 200 MiB"
            assert (tmp_path / "data" / "artifacts" / "big" / "blob.bin").stat().st_size == 200 * MIB

            rss_before_json = _rss_kib(pid)
            body = b'{"metadata": {"name": "' + b"x" * (50 * MIB) + b'"}}'
            started = time.monotonic()
            refused = api.post("/v1alpha1/jobs", content=body, headers={"content-type": "application/json"})
            assert refused.status_code == 413, refused.text[:200]
            assert "FLASHML_MAX_JSON_KB" in refused.json()["detail"]
            assert (_rss_kib(pid) - rss_before_json) / 1024 < 32  # the body was never held
            assert time.monotonic() - started < 120  # a hang guard only
            assert api.get("/v1alpha1/jobs").json()[0]["spec"]["metadata"]["name"] == "sweep"  # nothing added
            assert len(api.get("/v1alpha1/jobs").json()) == 1
    finally:
        coordinator.stop()


def test_a_json_body_without_content_length_is_cut_at_the_limit(tmp_path: Path) -> None:
    with serve_in_thread(settings_for(tmp_path / "data", max_json_kb=64)) as url, httpx.Client(base_url=url) as api:
        refused = api.post("/v1alpha1/jobs", content=_chunks(2 * MIB, 8192),
                           headers={"content-type": "application/json"})
        assert refused.status_code == 413 and "64 KiB" in refused.json()["detail"]
        assert api.get("/v1alpha1/jobs").json() == []
        small = api.post("/v1alpha1/jobs", json=job_spec(trials=1))
        assert small.status_code == 201  # the limit leaves ordinary bodies alone


def test_an_artifact_over_its_limit_is_413_without_a_content_length_too(tmp_path: Path) -> None:
    with serve_in_thread(settings_for(tmp_path / "data", max_artifact_mb=1)) as url, httpx.Client(base_url=url) as api:
        refused = api.put("/v1alpha1/artifacts/jobs/j/t/big.bin", content=_chunks(3 * MIB))
        assert refused.status_code == 413 and "1 MiB" in refused.json()["detail"]
        assert not list((tmp_path / "data" / "artifacts").rglob("*.bin"))


def test_a_node_whose_hostname_is_not_unicode_is_refused_and_the_node_list_keeps_working(api: Any) -> None:
    body = json.dumps(registration("node-a")).replace('"node-a.local"', '"\\ud800"')
    refused = api.post("/v1alpha1/nodes/register", content=body, headers={"content-type": "application/json"})
    assert refused.status_code == 422
    assert refused.json()["detail"][0]["loc"] == ["body", "hostname"]
    assert api.get("/v1alpha1/nodes").status_code == 200 and api.get("/v1alpha1/nodes").json() == []


@pytest.mark.parametrize("node_id", ["", "\x00", "a/b", "-x", "x" * 129, "x" * 500_000, "name with spaces"])
def test_unusable_node_ids_are_refused_in_open_mode_and_nothing_is_stored(api: Any, node_id: str) -> None:
    refused = api.post("/v1alpha1/nodes/register", json=registration(node_id))
    assert refused.status_code == 422, refused.text[:200]
    assert len(refused.text) < 1000  # the detail quotes at most a short prefix of the id
    assert api.get("/v1alpha1/nodes").json() == []
    assert api.post("/v1alpha1/leases/claim", json={"node_id": node_id}).status_code in (403, 422)


@pytest.mark.parametrize("raw", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_a_cordon_for_a_non_finite_number_of_seconds_is_422_and_the_connection_stays_usable(
        api: Any, raw: str) -> None:
    api.post("/v1alpha1/nodes/register", json=registration()).raise_for_status()
    refused = api.post("/v1alpha1/nodes/node-a/cordon", content=f'{{"seconds": {raw}}}',
                       headers={"content-type": "application/json"})
    assert refused.status_code == 422
    assert refused.json()["detail"][0]["loc"] == ["body", "seconds"]
    assert api.get("/v1alpha1/nodes").json()[0]["cordon_reason"] is None  # the same connection, still fine


def test_a_refused_body_is_never_echoed_back(api: Any) -> None:
    marker = "echo-me-" + "z" * 2000
    refused = api.post("/v1alpha1/jobs", json={"apiVersion": marker, "kind": marker, "metadata": marker})
    assert refused.status_code == 422
    assert marker not in refused.text
    assert all(set(issue) == {"loc", "msg", "type"} for issue in refused.json()["detail"])


def test_json_nested_too_deeply_is_422(api: Any) -> None:
    body = '{"metadata": {"name": "x", "labels": ' + "[" * 5000 + "]" * 5000 + "}}"
    refused = api.post("/v1alpha1/jobs", content=body, headers={"content-type": "application/json"})
    assert refused.status_code == 422 and "nested" in json.dumps(refused.json())
    assert api.get("/v1alpha1/jobs").json() == []


def test_each_credential_is_held_to_its_rate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLASHML_SUBMITTER_TOKENS", "alice:tok-alice,bob:tok-bob")
    with serve_in_thread(settings_for(tmp_path / "data", rate_limit_per_s=1.0)) as url, \
            httpx.Client(base_url=url) as api:
        alice, bob = {"Authorization": "Bearer tok-alice"}, {"Authorization": "Bearer tok-bob"}
        answers = [api.get("/v1alpha1/jobs", headers=alice).status_code for _ in range(3)]
        assert answers == [200, 200, 429]  # a burst of twice the rate
        limited = api.get("/v1alpha1/jobs", headers=alice)
        assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
        assert "too many requests" in limited.json()["detail"]
        assert api.get("/v1alpha1/jobs", headers=bob).status_code == 200  # every credential has its own
        assert api.get("/healthz").status_code == 200  # the open probes are never limited


def test_tokens_configured_mean_a_rate_limit_by_default_and_open_mode_none(tmp_path: Path) -> None:
    from flashruntime.coordinator.settings import DEFAULT_RATE_LIMIT

    settings = settings_for(tmp_path / "data")
    assert settings.rate_limit_for(enforcing=True) == DEFAULT_RATE_LIMIT
    assert settings.rate_limit_for(enforcing=False) == 0.0
    assert settings_for(tmp_path / "data", rate_limit_per_s=0.0).rate_limit_for(enforcing=True) == 0.0
