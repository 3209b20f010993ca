"""Bounds before storage on POST /v1alpha1/jobs, on a real coordinator (uvicorn on 127.0.0.1).

Bodies that fit the JSON body limit but ask for far more than that: 340,000 trials, 340,000
command parameter sets, a 90 KB string repeated over a 10,000-value grid. Each is refused
with the status and the setting that bounds it, quickly, with the database file, the task
count and the server's memory as they were. Then the per-submitter quotas: 429 with
Retry-After, nothing stored, and admitted again once the earlier work has moved on.
"""

from __future__ import annotations

import json
import sqlite3
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

HANG_GUARD_S = 30.0  # each refusal is answered far sooner; this only stops a hung test
RSS_GROWTH_LIMIT_MIB = 50


def _compact(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def _trials_spec(count: int) -> dict[str, Any]:
    spec = job_spec(trials=1)
    spec["spec"]["workload"]["parameters"]["trials"] = [{}] * count
    return spec


def _command_spec(count: int) -> dict[str, Any]:
    return {
        "apiVersion": "flashml.dev/v1alpha1", "kind": "Job", "metadata": {"name": "fanout"},
        "spec": {"isolation": {"tier": "sandboxed"},
                 "workload": {"type": "command",
                              "parameters": {"command": ["python", "-c", "pass"], "task_params": [{}] * count}}},
    }


def _grid_spec(value_bytes: int, values: int) -> dict[str, Any]:
    spec = job_spec(trials=1)
    parameters = spec["spec"]["workload"]["parameters"]
    del parameters["trials"]
    parameters["grid"] = {"blob": ["x" * value_bytes], "i": list(range(values))}
    return spec


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc/<pid>/status")


def _database_bytes(data_dir: Path) -> int:
    return sum(path.stat().st_size for path in data_dir.glob("flashruntime.db*"))


def _stored(data_dir: Path) -> tuple[int, int]:
    """(jobs, tasks) in the coordinator's database, read through a read-only connection."""
    connection = sqlite3.connect(f"file:{data_dir / 'flashruntime.db'}?mode=ro", uri=True)
    try:
        jobs = connection.execute("SELECT COUNT(*) FROM jobs").fetchone()[0]
        tasks = connection.execute("SELECT COUNT(*) FROM lease_tasks").fetchone()[0]
    finally:
        connection.close()
    return int(jobs), int(tasks)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[CoordinatorProcess, Any]]:
    coordinator = CoordinatorProcess(tmp_path / "data").start()
    try:
        with httpx.Client(base_url=coordinator.url, timeout=120) as api:
            yield coordinator, api
    finally:
        coordinator.stop()


@pytest.mark.parametrize(
    ("body", "status", "setting", "figure"),
    [
        pytest.param(lambda: _trials_spec(340_000), 422, "FLASHML_MAX_TASKS_PER_JOB", "340000 tasks", id="trials"),
        pytest.param(lambda: _command_spec(340_000), 422, "FLASHML_MAX_TASKS_PER_JOB", "340000 tasks",
                     id="task_params"),
        pytest.param(lambda: _grid_spec(90_000, 10_000), 413, "FLASHML_MAX_JOB_MB", "67108864 bytes (64 MiB)",
                     id="grid_of_a_90_kb_value"),
    ],
)
def test_a_job_over_its_bounds_is_refused_before_anything_is_stored(
    served: tuple[CoordinatorProcess, Any], body: Any, status: int, setting: str, figure: str,
) -> None:
    coordinator, api = served
    assert coordinator.process is not None
    pid = coordinator.process.pid
    data_dir = coordinator.data_dir
    content = _compact(body())
    assert len(content) < 1024 * 1024  # within the JSON body limit: the bounds, not the body size, refuse it
    for _ in range(2):  # warm every code path of an admission and of a refusal
        api.post("/v1alpha1/jobs", json=job_spec(trials=2)).raise_for_status()
        api.post("/v1alpha1/jobs", content=content, headers={"content-type": "application/json"})
    jobs_before, tasks_before = _stored(data_dir)
    database_before = _database_bytes(data_dir)
    rss_before = _rss_kib(pid)

    started = time.monotonic()
    refused = api.post("/v1alpha1/jobs", content=content, headers={"content-type": "application/json"})
    seconds = time.monotonic() - started
    print(f"{len(content)} byte body refused with {refused.status_code} in {seconds:.3f} s")

    assert refused.status_code == status, refused.text[:300]
    detail = refused.json()["detail"]
    assert setting in detail and figure in detail, detail
    assert seconds < HANG_GUARD_S
    assert _stored(data_dir) == (jobs_before, tasks_before)
    assert _database_bytes(data_dir) == database_before
    growth_mib = (_rss_kib(pid) - rss_before) / 1024
    assert growth_mib < RSS_GROWTH_LIMIT_MIB, f"the server's RSS grew {growth_mib:.0f} MiB"
    assert len(api.get("/v1alpha1/jobs").json()) == jobs_before


def test_the_task_bound_is_a_setting_and_a_job_at_it_is_admitted(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with serve_in_thread(settings_for(data_dir, max_tasks_per_job=5, max_job_mb=1)) as url, \
            httpx.Client(base_url=url, timeout=60) as api:
        assert api.post("/v1alpha1/jobs", json=job_spec(trials=5)).status_code == 201
        over = api.post("/v1alpha1/jobs", json=job_spec(trials=6))
        assert over.status_code == 422
        assert "makes 6 tasks, more than the 5 one job may hold" in over.json()["detail"]
        grid = api.post("/v1alpha1/jobs", json=_grid_spec(300_000, 4))  # 4 tasks, 1.2 MB together
        assert grid.status_code == 413
        assert "FLASHML_MAX_JOB_MB" in grid.json()["detail"] and "1 MiB" in grid.json()["detail"]
        assert _stored(data_dir) == (1, 5)


def _submitter_headers(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer tok-{name}"}


def test_a_submitter_over_its_jobs_in_flight_gets_429_and_others_are_admitted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FLASHML_SUBMITTER_TOKENS", "alice:tok-alice,bob:tok-bob")
    data_dir = tmp_path / "data"
    with serve_in_thread(settings_for(data_dir, max_jobs_in_flight=2)) as url, \
            httpx.Client(base_url=url, timeout=60) as api:
        alice, bob = _submitter_headers("alice"), _submitter_headers("bob")
        first = api.post("/v1alpha1/jobs", json=job_spec(trials=1), headers=alice)
        assert first.status_code == 201
        assert api.post("/v1alpha1/jobs", json=job_spec(trials=1), headers=alice).status_code == 201
        stored = _stored(data_dir)

        refused = api.post("/v1alpha1/jobs", json=job_spec(trials=1), headers=alice)
        assert refused.status_code == 429, refused.text
        assert refused.headers["Retry-After"] == "30"
        detail = refused.json()["detail"]
        assert "submitter 'alice' has 2 unfinished jobs" in detail and "FLASHML_MAX_JOBS_IN_FLIGHT=2" in detail
        assert _stored(data_dir) == stored

        assert api.post("/v1alpha1/jobs", json=job_spec(trials=1), headers=bob).status_code == 201
        cancelled = api.post(f"/v1alpha1/jobs/{first.json()['job_id']}/cancel", headers=alice)
        assert cancelled.status_code == 200 and cancelled.json()["state"] == "CANCELLED"
        assert api.post("/v1alpha1/jobs", json=job_spec(trials=1), headers=alice).status_code == 201


def test_queued_tasks_past_the_quota_get_429_until_they_are_claimed(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with serve_in_thread(settings_for(data_dir, max_pending_tasks=5)) as url, \
            httpx.Client(base_url=url, timeout=60) as api:
        assert api.post("/v1alpha1/jobs", json=job_spec(trials=3)).status_code == 201
        stored = _stored(data_dir)

        refused = api.post("/v1alpha1/jobs", json=job_spec(trials=3))
        assert refused.status_code == 429, refused.text
        assert refused.headers["Retry-After"] == "30"
        detail = refused.json()["detail"]
        assert "has 3 queued tasks, and this job's 3 would make 6" in detail
        assert "FLASHML_MAX_PENDING_TASKS=5" in detail
        assert _stored(data_dir) == stored

        assert api.post("/v1alpha1/nodes/register", json=registration("node-a")).status_code == 200
        for _ in range(3):
            assert api.post("/v1alpha1/leases/claim", json={"node_id": "node-a"}).status_code == 200
        assert api.post("/v1alpha1/jobs", json=job_spec(trials=3)).status_code == 201  # none queued now


def test_the_jobs_in_flight_quota_holds_on_postgresql_too(tmp_path: Path, postgres_url: str) -> None:
    with serve_in_thread(settings_for(tmp_path / "data", database_url=postgres_url, max_jobs_in_flight=1)) as url, \
            httpx.Client(base_url=url, timeout=60) as api:
        first = api.post("/v1alpha1/jobs", json=job_spec(trials=2))
        assert first.status_code == 201
        refused = api.post("/v1alpha1/jobs", json=job_spec(trials=2))
        assert refused.status_code == 429 and refused.headers["Retry-After"] == "30"
        assert "FLASHML_MAX_JOBS_IN_FLIGHT=1" in refused.json()["detail"]
        assert [job["job_id"] for job in api.get("/v1alpha1/jobs").json()] == [first.json()["job_id"]]
