"""``flashruntime serve --workers 2`` on SQLite: two worker processes share the port and
the database file. Two HTTP clients, each opening a new connection per request (so the
kernel hands their requests to either process), claim, upload and commit every task of a
lease job: the job succeeds and every task is committed exactly once."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests._support import wait_until
from tests.service_server import free_port, process_env, stop_process, wait_healthy

pytestmark = pytest.mark.service
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

TASKS = 30
HANG_GUARD_S = 60.0


def _client(url: str, index: int, job_id: str, committed: list[str], problems: list[str]) -> None:
    node_id = f"workers-client-{index}"
    registration = {"node_id": node_id, "kubernetes_node": "", "hostname": f"{node_id}.test",
                    "capabilities": {"cpu_cores": 1}}
    # No keep-alive: every request is a new connection, which either worker process may accept.
    with httpx.Client(base_url=url, timeout=30.0, trust_env=False,
                      limits=httpx.Limits(max_keepalive_connections=0)) as http:
        assert http.post("/v1alpha1/nodes/register", json=registration).status_code == 200
        while True:
            claimed = http.post("/v1alpha1/leases/claim", json={"node_id": node_id, "job_id": job_id})
            if claimed.status_code == 204:
                return  # nothing left to lease
            if claimed.status_code != 200:
                problems.append(f"claim answered {claimed.status_code}: {claimed.text[:200]}")
                return
            lease = claimed.json()
            payload = json.dumps({"task_id": lease["task_id"]}).encode()
            put = http.put(f"/v1alpha1/artifacts/{lease['payload']['output_prefix']}metrics.json", content=payload)
            done = http.post(f"/v1alpha1/attempts/{lease['lease_id']}/complete",
                             json={"output_sha256": hashlib.sha256(payload).hexdigest()})
            if put.status_code != 200 or done.status_code != 200 or done.json().get("accepted") is not True:
                problems.append(f"upload {put.status_code}, complete {done.status_code}: {done.text[:200]}")
                return
            committed.append(lease["task_id"])


def test_two_worker_processes_serve_a_lease_job_to_success(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "flashruntime.cli", "serve", "--port", str(port), "--data-dir", str(tmp_path / "data"),
         "--workers", "2"],
        env=process_env(FLASHML_SWEEP_INTERVAL_S="0.5"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_healthy(url, process=server)
        spec: dict[str, Any] = {
            "apiVersion": "flashml.dev/v1alpha1", "kind": "Job", "metadata": {"name": "two-workers"},
            "spec": {"execution": {"backend": "leases"},
                     "workload": {"type": "hyperparameter_search",
                                  "parameters": {"trials": [{"i": i} for i in range(TASKS)]}}}}
        created = httpx.post(f"{url}/v1alpha1/jobs", json=spec, timeout=30)
        assert created.status_code == 201, created.text
        job_id = created.json()["job_id"]
        committed: list[str] = []
        problems: list[str] = []
        threads = [threading.Thread(target=_client, args=(url, index, job_id, committed, problems), daemon=True)
                   for index in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=HANG_GUARD_S)
        assert not any(thread.is_alive() for thread in threads), "a client hung"
        assert problems == []
        wait_until(lambda: httpx.get(f"{url}/v1alpha1/jobs/{job_id}", timeout=30).json()["state"] != "RUNNING",
                   "the job to finish", timeout=HANG_GUARD_S)
        job = httpx.get(f"{url}/v1alpha1/jobs/{job_id}", timeout=30).json()
        tasks = httpx.get(f"{url}/v1alpha1/jobs/{job_id}/tasks", timeout=30).json()
    finally:
        out = stop_process(server)
    assert server.returncode == 0, out
    assert job["state"] == "SUCCEEDED", (job, tasks)
    assert Counter(committed) == Counter(task["task_id"] for task in tasks) and len(committed) == TASKS
    assert {(task["state"], task["attempts"]) for task in tasks} == {("COMPLETED", 1)}
    assert "workers    2 processes sharing the port" in out
    assert len(set(re.findall(r"Started server process \[(\d+)\]", out))) == 2, out
