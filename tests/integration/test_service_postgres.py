"""The coordinator on PostgreSQL: a job from submission to SUCCEEDED over real HTTP with
every store in one PostgreSQL database, a restarted coordinator that finds it all there,
``/readyz`` following the database down and up again, and ``flashruntime serve`` refusing a database it cannot use with exit 2 and a message
that names the server and never the password."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests._support import wait_until
from tests.postgres_server import PostgresCluster
from tests.service_server import free_port, process_env, serve_in_thread, settings_for

pytestmark = pytest.mark.service
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
psycopg = pytest.importorskip("psycopg")

SPEC = {"apiVersion": "flashml.dev/v1alpha1", "kind": "Job", "metadata": {"name": "pg-sweep"},
        "spec": {"execution": {"backend": "leases"},
                 "workload": {"type": "hyperparameter_search",
                              "parameters": {"trials": [{"C": 1.0}, {"C": 0.1}], "lease_seconds": 60}}}}
REGISTRATION = {"node_id": "pg-node", "kubernetes_node": "", "hostname": "pg-node.local",
                "capabilities": {"cpu_cores": 2}}


def _finish(api: Any, lease: dict[str, Any]) -> None:
    payload = f'{{"task": "{lease["task_id"]}"}}'.encode()
    key = lease["payload"]["output_prefix"] + "metrics.json"
    assert api.put(f"/v1alpha1/artifacts/{key}", content=payload).status_code == 200
    done = api.post(f"/v1alpha1/attempts/{lease['lease_id']}/complete",
                    json={"output_sha256": hashlib.sha256(payload).hexdigest(), "evidence": {"exit_code": 0}})
    assert done.status_code == 200 and done.json() == {"accepted": True}, done.text


def test_a_job_runs_to_success_on_postgres_and_a_restart_finds_everything(tmp_path: Path, postgres_url: str) -> None:
    settings = settings_for(tmp_path / "data", database_url=postgres_url)
    with serve_in_thread(settings) as url, httpx.Client(base_url=url, timeout=10) as api:
        assert api.get("/readyz").status_code == 200
        job_id = api.post("/v1alpha1/jobs", json=SPEC).json()["job_id"]
        assert api.post("/v1alpha1/nodes/register", json=REGISTRATION).status_code == 200
        for _ in range(2):
            claimed = api.post("/v1alpha1/leases/claim", json={"node_id": "pg-node", "job_id": job_id})
            assert claimed.status_code == 200, claimed.text
            _finish(api, claimed.json())
        assert api.post("/v1alpha1/leases/claim", json={"node_id": "pg-node"}).status_code == 204
        assert api.get(f"/v1alpha1/jobs/{job_id}").json()["state"] == "SUCCEEDED"  # settled by the last commit
        events = [event["type"] for event in api.get(f"/v1alpha1/jobs/{job_id}/events").json()]
    assert not (tmp_path / "data" / "flashruntime.db").exists()  # nothing went to SQLite
    with serve_in_thread(settings) as url, httpx.Client(base_url=url, timeout=10) as api:
        assert api.get(f"/v1alpha1/jobs/{job_id}").json()["state"] == "SUCCEEDED"
        assert [event["type"] for event in api.get(f"/v1alpha1/jobs/{job_id}/events").json()] == events
        tasks = api.get(f"/v1alpha1/jobs/{job_id}/tasks").json()
        node = next(row for row in api.get("/v1alpha1/nodes").json() if row["node_id"] == "pg-node")
    assert events.count("TASK_COMMIT_ACCEPTED") == 2 and events.count("JOB_SUCCEEDED") == 1
    assert [row["state"] for row in tasks] == ["COMPLETED", "COMPLETED"]
    assert all(row["evidence"] == {**row["evidence"], "exit_code": 0} for row in tasks)
    assert node["accepted_tasks"] == 2


def _serve(*args: str, prelude: str = "") -> subprocess.CompletedProcess[str]:
    code = prelude + "import sys\nfrom flashruntime.cli.dispatch import main\nsys.exit(main(sys.argv[1:]))\n"
    return subprocess.run([sys.executable, "-c", code, "serve", "--port", str(free_port()), *args],
                          env=process_env(), capture_output=True, text=True, timeout=60, check=False)


def test_serve_exits_2_naming_a_server_that_does_not_answer(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    result = _serve("--data-dir", str(tmp_path / "d"), "--database-url",
                    f"postgresql://fr:s3cret@127.0.0.1:{port}/flashruntime")
    assert result.returncode == 2, result.stderr
    assert f"cannot use the database postgresql://fr:***@127.0.0.1:{port}/flashruntime" in result.stderr
    assert f"127.0.0.1:{port}: the server cannot be reached" in result.stderr
    assert "s3cret" not in result.stdout + result.stderr and "Traceback" not in result.stderr


def test_serve_exits_2_saying_what_to_install_without_the_postgres_driver(tmp_path: Path) -> None:
    refuse_driver = (
        "import sys\n"
        "class _NoDriver:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.partition('.')[0] in ('psycopg', 'psycopg_pool'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, _NoDriver())\n"
    )
    result = _serve("--data-dir", str(tmp_path / "d"), "--database-url", "postgres://fr:s3cret@127.0.0.1/fr",
                    prelude=refuse_driver)
    assert result.returncode == 2, result.stderr
    assert "pip install 'flashruntime[postgres]'" in result.stderr
    assert "s3cret" not in result.stdout + result.stderr and "Traceback" not in result.stderr


def test_readyz_answers_503_while_the_database_is_down_and_200_once_it_is_back(
        tmp_path: Path, postgres_url: str, postgres_cluster: PostgresCluster) -> None:
    settings = settings_for(tmp_path / "data", database_url=postgres_url)
    with serve_in_thread(settings) as url, httpx.Client(base_url=url, timeout=30) as api:
        assert api.get("/readyz").json() == {"status": "ok", "profile": "local"}
        postgres_cluster.stop("fast")
        try:
            started = time.monotonic()
            down = api.get("/readyz")
            assert time.monotonic() - started < 10  # a probe's answer, not a statement's wait for a connection
            assert down.status_code == 503 and down.json()["status"] == "unavailable"
            assert f"{postgres_cluster.host}:{postgres_cluster.port}" in down.json()["detail"]
            assert api.get("/healthz").status_code == 200  # alive, only not ready
        finally:
            postgres_cluster.resume()
        wait_until(lambda: api.get("/readyz").status_code == 200, "/readyz to answer 200 again", timeout=30)
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute("DROP TABLE jobs")
        missing = api.get("/readyz")
        assert missing.status_code == 503 and "jobs" in missing.json()["detail"]  # the tables answer too
