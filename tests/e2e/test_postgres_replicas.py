"""Coordinator replicas on one PostgreSQL database, end to end: real ``flashruntime serve
--database-url`` processes sharing one database and one artifacts directory.

A real ``flashruntime worker`` runs a small job to SUCCEEDED through one replica. Four
HTTP clients claim, upload and commit the 500 tasks of one job through two replicas: every
task is committed exactly once. Then the same with ``kill -9`` of the replica that runs the
expiry sweep, mid-run: no acknowledged commit is lost, the survivor takes the sweep over
and expires the leases the dead replica's clients left behind, and the job finishes.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from tests._support import wait_until
from tests.postgres_server import PostgresCluster
from tests.service_server import free_port, process_env, run_worker, stop_process, wait_healthy

pytestmark = [pytest.mark.service, pytest.mark.skipif(sys.platform != "linux", reason="kill -9")]
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
psycopg = pytest.importorskip("psycopg")

TASKS = 500
LEASE_SECONDS = 4.0
SWEEP_INTERVAL_S = 0.5
# Bounds that hold on a loaded machine by a wide margin; they only stop a broken run.
HANG_GUARD_S = 90.0
TAKEOVER_BOUND_S = SWEEP_INTERVAL_S + 10.0
SWEEPER_SESSION = "flashruntime expiry sweeper%"


class Replica:
    """``flashruntime serve --database-url URL`` on a port of its own; artifacts in ``data``."""

    def __init__(self, database_url: str, data: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "flashruntime.cli", "serve", "--port", str(self.port), "--data-dir", str(data),
             "--database-url", database_url, "--log-level", "warning"],
            env=process_env(FLASHML_SWEEP_INTERVAL_S=str(SWEEP_INTERVAL_S)), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        try:
            wait_healthy(self.url, process=self.process)
        except BaseException:
            self.stop()
            raise

    def kill9(self) -> None:
        self.process.kill()
        self.process.wait(timeout=10)

    def stop(self) -> str:
        return stop_process(self.process)


def sweeper_sessions(cluster: PostgresCluster) -> list[int]:
    """The backend pids of sweeper sessions that hold their advisory lock."""
    with psycopg.connect(cluster.url(cluster.test_database or "postgres"), autocommit=True) as admin:
        rows = admin.execute(
            "SELECT a.pid FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid AND l.locktype = 'advisory' "
            "AND l.granted WHERE a.application_name LIKE %s", (SWEEPER_SESSION,)).fetchall()
    return [int(row[0]) for row in rows]


@pytest.fixture
def shared(tmp_path: Path, postgres_url: str) -> tuple[str, Path]:
    """The database URL and the data directory (for the artifacts) every replica shares."""
    return postgres_url, tmp_path / "shared"


# --- a real worker ------------------------------------------------------------------

WRITE_METRICS = ("import json, os; json.dump({{'task': {i}}}, "  # {i}: filled from the task's parameters
                 "open(os.path.join(os.environ['FLASHML_OUTPUT_DIR'], 'metrics.json'), 'w'))")


def test_a_real_worker_runs_a_job_to_success_through_a_postgres_backed_coordinator(
        tmp_path: Path, shared: tuple[str, Path]) -> None:
    replica = Replica(*shared)
    try:
        spec = {"metadata": {"name": "pg-worker"}, "spec": {
            "workload": {"type": "command", "parameters": {"command": [sys.executable, "-c", WRITE_METRICS],
                                                           "task_params": [{"i": 0}, {"i": 1}]}},
            "isolation": {"tier": "sandboxed", "allowFallback": True}, "placement": {"pool": "pg-team"}}}
        created = httpx.post(f"{replica.url}/v1alpha1/jobs", json=spec, timeout=30)
        assert created.status_code == 201, created.text
        job_id = created.json()["job_id"]
        code, log = run_worker(replica.url, tmp_path / "work", "--node-id", "pg-w1", "--runner", "trusted",
                               "--pools", "pg-team", max_tasks=2, timeout=HANG_GUARD_S)
        assert code == 0, log
        wait_until(lambda: httpx.get(f"{replica.url}/v1alpha1/jobs/{job_id}", timeout=30).json()["state"]
                   != "RUNNING", "the job to finish", timeout=HANG_GUARD_S)
        job = httpx.get(f"{replica.url}/v1alpha1/jobs/{job_id}", timeout=30).json()
        tasks = httpx.get(f"{replica.url}/v1alpha1/jobs/{job_id}/tasks", timeout=30).json()
        assert job["state"] == "SUCCEEDED", (job, tasks, log)
        assert [(t["state"], t["node_id"]) for t in tasks] == [("COMPLETED", "pg-w1")] * 2
    finally:
        out = replica.stop()
    assert replica.process.returncode == 0, out
    assert "postgresql://postgres@" in out and "flashruntime.db" not in out  # it said which database, and used it


# --- four clients through two replicas ------------------------------------------------


class Fleet:
    """Four HTTP clients, two on each replica, and what the replicas told them."""

    def __init__(self, urls: list[str], job_id: str) -> None:
        self.urls = urls
        self.job_id = job_id
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.acked: dict[str, list[str]] = {}  # task id -> lease ids whose commit was answered accepted
        self.holding: dict[int, str | None] = {}  # client -> the lease it holds now (claimed, not answered)
        self.left_behind: set[str] = set()  # leases held through the replica that died
        self.acks = 0
        self.problems: list[str] = []

    def client(self, index: int) -> None:
        node_id = f"replica-client-{index}"
        url = self.urls[index % len(self.urls)]
        registration = {"node_id": node_id, "kubernetes_node": "", "hostname": f"{node_id}.test",
                        "capabilities": {"cpu_cores": 1}}
        try:
            with httpx.Client(base_url=url, timeout=30.0, trust_env=False) as http:
                assert http.post("/v1alpha1/nodes/register", json=registration).status_code == 200
                while not self.stop.is_set():
                    claimed = http.post("/v1alpha1/leases/claim", json={"node_id": node_id, "job_id": self.job_id})
                    if claimed.status_code == 204:
                        time.sleep(0.05)
                        continue
                    if claimed.status_code != 200:
                        self._problem(f"claim answered {claimed.status_code}: {claimed.text[:200]}")
                        return
                    lease = claimed.json()
                    self.holding[index] = lease["lease_id"]
                    if self._commit(http, lease):
                        with self.lock:
                            self.acked.setdefault(lease["task_id"], []).append(lease["lease_id"])
                            self.acks += 1
                    self.holding[index] = None
        except httpx.TransportError:
            # Its replica is gone, and the client with it: what it held is left for the sweep.
            with self.lock:
                lease_id = self.holding.get(index)
                if lease_id is not None:
                    self.left_behind.add(lease_id)

    def _commit(self, http: Any, lease: dict[str, Any]) -> bool:
        payload = json.dumps({"task_id": lease["task_id"], "lease_id": lease["lease_id"]}).encode()
        key = lease["payload"]["output_prefix"] + "metrics.json"
        put = http.put(f"/v1alpha1/artifacts/{key}", content=payload)
        if put.status_code != 200:
            self._problem(f"upload answered {put.status_code}: {put.text[:200]}")
            return False
        done = http.post(f"/v1alpha1/attempts/{lease['lease_id']}/complete",
                         json={"output_sha256": hashlib.sha256(payload).hexdigest()})
        if done.status_code != 200:
            self._problem(f"complete answered {done.status_code}: {done.text[:200]}")
            return False
        return done.json().get("accepted") is True

    def _problem(self, text: str) -> None:
        with self.lock:
            self.problems.append(text)


def _job_spec() -> dict[str, Any]:
    return {"apiVersion": "flashml.dev/v1alpha1", "kind": "Job", "metadata": {"name": "replicas"},
            "spec": {"execution": {"backend": "leases"},
                     "workload": {"type": "hyperparameter_search",
                                  "parameters": {"trials": [{"i": i} for i in range(TASKS)],
                                                 "lease_seconds": LEASE_SECONDS}}}}


def _hold_a_lease(url: str, job_id: str) -> str:
    """Claim one task of ``job_id`` through ``url`` and never answer it; → the lease id."""
    node_id = "replica-holder"
    registration = {"node_id": node_id, "kubernetes_node": "", "hostname": f"{node_id}.test",
                    "capabilities": {"cpu_cores": 1}}
    with httpx.Client(base_url=url, timeout=30.0, trust_env=False) as http:
        assert http.post("/v1alpha1/nodes/register", json=registration).status_code == 200
        claimed = http.post("/v1alpha1/leases/claim", json={"node_id": node_id, "job_id": job_id})
        assert claimed.status_code == 200, claimed.text
        return str(claimed.json()["lease_id"])


def _run_fleet(replicas: list[Replica], *, kill_at: int | None = None,
               cluster: PostgresCluster | None = None) -> tuple[Fleet, dict[str, Any], float | None]:
    """Submit the job, run four clients through ``replicas`` until it ends (killing
    ``replicas[0]`` after ``kill_at`` acknowledged commits); → (fleet, record, kill time)."""
    survivor = replicas[-1].url
    submitted = httpx.post(f"{replicas[0].url}/v1alpha1/jobs", json=_job_spec(), timeout=60)
    assert submitted.status_code == 201, submitted.text
    job_id = submitted.json()["job_id"]
    fleet = Fleet([replica.url for replica in replicas], job_id)
    threads = [threading.Thread(target=fleet.client, args=(index,), daemon=True) for index in range(4)]
    for thread in threads:
        thread.start()
    killed_at = None
    try:
        if kill_at is not None:
            assert cluster is not None
            wait_until(lambda: fleet.acks >= kill_at or bool(fleet.problems), "commits before the kill",
                       timeout=HANG_GUARD_S)
            [holder] = sweeper_sessions(cluster)
            # The clients may all sit between a commit and their next claim at the kill: one lease
            # held through the doomed replica makes sure something is left for the survivor to expire.
            held = _hold_a_lease(replicas[0].url, job_id)
            with fleet.lock:
                fleet.left_behind.add(held)
            killed_at = time.time()
            replicas[0].kill9()
            # The dead replica's session ends with it, and the survivor takes the sweep at its next round.
            wait_until(lambda: [pid for pid in sweeper_sessions(cluster) if pid != holder] != [],
                       "the survivor to take the expiry sweep over", timeout=HANG_GUARD_S)
            taken_over_s = time.time() - killed_at
            assert taken_over_s < TAKEOVER_BOUND_S, f"the sweep was taken over {taken_over_s:.1f} s after the kill"
        wait_until(lambda: httpx.get(f"{survivor}/v1alpha1/jobs/{job_id}", timeout=30).json()["state"] != "RUNNING"
                   or bool(fleet.problems), "the job to finish", timeout=HANG_GUARD_S)
    finally:
        fleet.stop.set()
        for thread in threads:
            thread.join(30)
    with httpx.Client(base_url=survivor, timeout=60) as api:
        record = {"job": api.get(f"/v1alpha1/jobs/{job_id}").json(),
                  "events": api.get(f"/v1alpha1/jobs/{job_id}/events").json(),
                  "tasks": api.get(f"/v1alpha1/jobs/{job_id}/tasks").json()}
    return fleet, record, killed_at


def _committed_once(fleet: Fleet, record: dict[str, Any]) -> None:
    assert not fleet.problems, fleet.problems[:5]
    accepted = Counter(e["data"]["task_id"] for e in record["events"] if e["type"] == "TASK_COMMIT_ACCEPTED")
    tasks = {row["task_id"]: row for row in record["tasks"]}
    accepted_lease = {e["data"]["task_id"]: e["data"]["lease_id"] for e in record["events"]
                      if e["type"] == "TASK_COMMIT_ACCEPTED"}
    assert record["job"]["state"] == "SUCCEEDED", record["job"]
    assert len(tasks) == TASKS and all(row["state"] == "COMPLETED" for row in tasks.values())
    assert set(accepted) == set(tasks) and set(accepted.values()) == {1}, "a task committed other than once"
    assert all(len(leases) == 1 for leases in fleet.acked.values()), "a task acknowledged twice"
    lost = [task for task, leases in fleet.acked.items() if accepted_lease.get(task) != leases[0]]
    assert lost == [], f"acknowledged commits not in the record: {lost[:5]}"
    assert sum(1 for e in record["events"] if e["type"] == "JOB_SUCCEEDED") == 1


@pytest.mark.slow
def test_four_clients_through_two_replicas_commit_every_task_exactly_once(shared: tuple[str, Path]) -> None:
    replicas = [Replica(*shared), Replica(*shared)]
    try:
        fleet, record, _ = _run_fleet(replicas)
    finally:
        for replica in replicas:
            replica.stop()
    _committed_once(fleet, record)
    assert len(fleet.acked) == TASKS


@pytest.mark.slow
def test_kill9_of_the_sweeping_replica_loses_no_commit_and_the_survivor_expires_what_it_left(
        shared: tuple[str, Path], postgres_cluster: PostgresCluster) -> None:
    first = Replica(*shared)
    replicas = [first]
    try:
        wait_until(lambda: len(sweeper_sessions(postgres_cluster)) == 1, "the first replica to take the sweep")
        replicas.append(Replica(*shared))
        fleet, record, killed_at = _run_fleet(replicas, kill_at=TASKS // 5, cluster=postgres_cluster)
    finally:
        for replica in replicas:
            replica.stop()
    assert killed_at is not None
    _committed_once(fleet, record)
    expired = {e["data"]["lease_id"]: e for e in record["events"] if e["type"] == "LEASE_EXPIRED"}
    committed = {e["data"]["lease_id"] for e in record["events"] if e["type"] == "TASK_COMMIT_ACCEPTED"}
    for lease_id in fleet.left_behind:
        if lease_id in committed:
            continue  # committed just before the kill, the answer lost with the replica
        assert lease_id in expired, f"lease {lease_id} left behind by the dead replica never expired"
        stamp = datetime.fromisoformat(expired[lease_id]["timestamp"].replace("Z", "+00:00"))
        after_kill = stamp.astimezone(timezone.utc).timestamp() - killed_at
        assert after_kill < LEASE_SECONDS + TAKEOVER_BOUND_S, f"expired {after_kill:.1f} s after the kill"
