"""A hyperparameter sweep end to end: a real coordinator, the iris CSV
uploaded as an artifact, a ``hyperparameter_search`` grid over ``C``, and one real ``flashruntime
worker`` process running three ``sklearn_trial`` tasks whose metrics come back as artifacts."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests._support import iris_csv
from tests.service_server import run_worker, serve_in_thread, settings_for

pytestmark = [pytest.mark.service, pytest.mark.slow]
pytest.importorskip("sklearn")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

GRID_C = [0.1, 1.0, 10.0]


def sweep_spec() -> dict:
    return {
        "apiVersion": "flashml.dev/v1alpha1", "kind": "Job", "metadata": {"name": "iris-sweep"},
        "spec": {"execution": {"backend": "leases"}, "image": {"repository": "local/tier1", "tag": "dev"},
                 "workload": {"type": "hyperparameter_search",
                              "parameters": {"grid": {"model": ["logreg"], "C": GRID_C},
                                             "inputs": {"dataset": "artifact://datasets/iris.csv"},
                                             "lease_seconds": 60}}},
    }


def test_a_logreg_grid_runs_on_a_real_worker_and_every_trial_reports_its_accuracy(tmp_path: Path) -> None:
    with serve_in_thread(settings_for(tmp_path / "data")) as url, httpx.Client(base_url=url, timeout=10) as api:
        put = api.put("/v1alpha1/artifacts/datasets/iris.csv", content=iris_csv())
        assert put.status_code == 200, put.text
        created = api.post("/v1alpha1/jobs", json=sweep_spec())
        assert created.status_code == 201, created.text
        job_id = created.json()["job_id"]

        code, log = run_worker(url, tmp_path / "work", "--node-id", "w1", max_tasks=3)
        assert code == 0, log

        deadline = time.monotonic() + 30
        while (job := api.get(f"/v1alpha1/jobs/{job_id}").json())["state"] == "RUNNING" and time.monotonic() < deadline:
            time.sleep(0.1)
        tasks = api.get(f"/v1alpha1/jobs/{job_id}/tasks").json()
        assert job["state"] == "SUCCEEDED", (job, tasks, log)
        assert [t["task_id"] for t in tasks] == ["trial-000", "trial-001", "trial-002"]
        assert all(t["state"] == "COMPLETED" and t["node_id"] == "w1" for t in tasks)

        for task_id, c in zip(["trial-000", "trial-001", "trial-002"], GRID_C, strict=True):  # grid order: sorted keys
            got = api.get(f"/v1alpha1/artifacts/jobs/{job_id}/{task_id}/metrics.json")
            assert got.status_code == 200, got.text
            metrics = got.json()
            assert metrics["task_id"] == task_id
            assert metrics["params"] == {"model": "logreg", "C": c}
            assert 0.0 <= metrics["accuracy_mean"] <= 1.0 and len(metrics["accuracy_folds"]) == 3
            assert all(0.0 <= a <= 1.0 for a in metrics["accuracy_folds"])
            assert metrics["n_samples"] == 150
            assert metrics["accuracy_mean"] > 0.8  # iris is easy: the trial really trained
