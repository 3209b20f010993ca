"""A coordinator killed with ``kill -9`` under load keeps a whole record.

A real coordinator process (uvicorn on 127.0.0.1, SQLite data directory) serves four
HTTP clients that claim, upload, complete and sometimes fail the tasks of one job; the
test SIGKILLs it at ten random moments while they work, restarts it on the same data
each time, lets the clients drain the job, and then checks the record against what the
clients were told: no acknowledged completion lost or doubled, every COMPLETED task
with exactly one TASK_COMMIT_ACCEPTED event and its evidence row, every lease ever
issued (and every lease a client received) with its LEASE_CLAIMED event, and no client
ever asked to register again.
"""

from __future__ import annotations

import hashlib
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flashruntime.leases import SqliteLeaseStore
from tests._support import wait_until
from tests.service_server import CoordinatorProcess

pytestmark = [pytest.mark.service, pytest.mark.slow]
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

KILLS = 10
CLIENTS = 4
TASKS = 400
LEASE_SECONDS = 4.0  # a lease lost with a kill comes back to the queue soon after
# The share of first attempts a client reports as failed; later attempts succeed, so no task
# spends its failure budget whatever the draws.
FAIL_SHARE = 0.1
# Each kill lands after a random number of acknowledged completions since the restart, plus
# a random fraction of a cycle: while the clients are at work, at a random point of a transition.
ACKS_BEFORE_KILL = (2, 20)
JITTER_S = 0.03
HANG_GUARD_S = 120.0  # never reached when the code is right; only stops a broken run from hanging
EVIDENCE = {"wall_seconds": 0.25, "exit_code": 0}


class Fleet:
    """Four clients and what the coordinator told them."""

    def __init__(self, url: str, job_id: str) -> None:
        self.url = url
        self.job_id = job_id
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self.acked: dict[str, set[str]] = {}  # task id -> lease ids whose completion was answered accepted
        self.returned: set[str] = set()  # every lease id a claim answered with
        self.acks = 0
        self.reregistrations = 0
        self.problems: list[str] = []

    def received(self, lease: dict[str, Any]) -> None:
        with self._lock:
            self.returned.add(lease["lease_id"])

    def accepted(self, lease: dict[str, Any]) -> None:
        with self._lock:
            self.acked.setdefault(lease["task_id"], set()).add(lease["lease_id"])
            self.acks += 1

    def problem(self, text: str) -> None:
        with self._lock:
            self.problems.append(text)

    def answered(self, send: Callable[[], Any]) -> Any:
        """``send()`` until the coordinator answers with something other than 503: a kill
        shows as a transport error until the restarted coordinator listens. None once stopped."""
        while not self.stop.is_set():
            try:
                response = send()
            except httpx.TransportError:
                time.sleep(0.05)
                continue
            if response.status_code == 503:
                time.sleep(0.05)
                continue
            return response
        return None

    def client(self, index: int, seed: int) -> None:
        rng = random.Random(seed)
        node_id = f"kill9-node-{index}"
        registration = {"node_id": node_id, "kubernetes_node": "", "hostname": f"{node_id}.test",
                        "capabilities": {"cpu_cores": 1}}
        with httpx.Client(base_url=self.url, timeout=10.0, trust_env=False) as http:
            self.answered(lambda: http.post("/v1alpha1/nodes/register", json=registration))
            while not self.stop.is_set():
                claimed = self.answered(lambda: http.post(
                    "/v1alpha1/leases/claim", json={"node_id": node_id, "job_id": self.job_id}))
                if claimed is None:
                    return
                if claimed.status_code == 403:  # a coordinator that forgot this node: register again
                    with self._lock:
                        self.reregistrations += 1
                    self.answered(lambda: http.post("/v1alpha1/nodes/register", json=registration))
                    continue
                if claimed.status_code == 204:
                    time.sleep(0.02)
                    continue
                if claimed.status_code != 200:
                    self.problem(f"claim answered {claimed.status_code}: {claimed.text[:200]}")
                    continue
                lease = claimed.json()
                self.received(lease)
                lease_id = lease["lease_id"]
                if lease["attempt_number"] == 1 and rng.random() < FAIL_SHARE:
                    failed = self.answered(lambda: http.post(f"/v1alpha1/attempts/{lease_id}/fail",
                                                             json={"reason": "injected failure"}))
                    if failed is not None and failed.status_code not in (200, 410):
                        self.problem(f"fail answered {failed.status_code}: {failed.text[:200]}")
                    continue
                answer = self.finish(http, lease)
                if answer is not None and answer.get("accepted") is True:
                    self.accepted(lease)

    def finish(self, http: Any, lease: dict[str, Any]) -> dict[str, Any] | None:
        """Upload the output, then complete; both again after a transport error, as an agent
        does (the upload is idempotent, and the winner's repeated commit is accepted again)."""
        payload = json.dumps({"task_id": lease["task_id"], "lease_id": lease["lease_id"]}).encode()
        key = lease["payload"]["output_prefix"] + "metrics.json"
        body = {"output_sha256": hashlib.sha256(payload).hexdigest(), "evidence": EVIDENCE}
        while not self.stop.is_set():
            try:
                put = http.put(f"/v1alpha1/artifacts/{key}", content=payload)
                if put.status_code == 503:
                    continue
                if put.status_code != 200:
                    self.problem(f"upload answered {put.status_code}: {put.text[:200]}")
                    return None
                done = http.post(f"/v1alpha1/attempts/{lease['lease_id']}/complete", json=body)
            except httpx.TransportError:
                time.sleep(0.05)
                continue
            if done.status_code == 503:
                continue
            if done.status_code != 200:
                self.problem(f"complete answered {done.status_code}: {done.text[:200]}")
                return None
            return dict(done.json())
        return None


def _job_spec() -> dict[str, Any]:
    return {"apiVersion": "flashml.dev/v1alpha1", "kind": "Job", "metadata": {"name": "kill9-record"},
            "spec": {"execution": {"backend": "leases"},
                     "workload": {"type": "hyperparameter_search",
                                  "parameters": {"trials": [{"i": i} for i in range(TASKS)],
                                                 "lease_seconds": LEASE_SECONDS}}}}


def _terminal(url: str, job_id: str) -> bool:
    try:
        answer = httpx.get(f"{url}/v1alpha1/jobs/{job_id}", timeout=10.0)
    except httpx.TransportError:
        return False
    return answer.status_code == 200 and answer.json()["state"] in ("SUCCEEDED", "FAILED", "CANCELLED")


def _is_sent_evidence(stored: dict[str, Any] | None) -> bool:
    return stored is not None and all(stored.get(name) == value for name, value in EVIDENCE.items())


def _holes(records: list[Any], events: list[dict[str, Any]], tasks: list[dict[str, Any]],
           fleet: Fleet) -> dict[str, int]:
    """Every way the record can disagree with itself or with what the clients were told, counted."""
    by_task = {record.spec.task_id: record for record in records}
    rows = {row["task_id"]: row for row in tasks}
    accepted = Counter(event["data"]["lease_id"] for event in events if event["type"] == "TASK_COMMIT_ACCEPTED")
    accepted_tasks = Counter(event["data"]["task_id"] for event in events if event["type"] == "TASK_COMMIT_ACCEPTED")
    claimed = Counter(event["data"]["lease_id"] for event in events if event["type"] == "LEASE_CLAIMED")
    issued = {lease_id for record in records for lease_id in record.lease_history}
    completed = [record for record in records if record.state.value == "COMPLETED"]
    return {
        "acknowledged completions lost": sum(
            1 for task_id, leases in fleet.acked.items() for lease_id in leases
            if by_task[task_id].state.value != "COMPLETED" or by_task[task_id].accepted_attempt_id != lease_id),
        "tasks acknowledged twice": sum(1 for leases in fleet.acked.values() if len(leases) > 1),
        "COMPLETED tasks without TASK_COMMIT_ACCEPTED": sum(
            1 for record in completed if accepted[record.accepted_attempt_id] == 0),
        "COMPLETED tasks with more than one TASK_COMMIT_ACCEPTED": sum(
            1 for record in completed if accepted_tasks[record.spec.task_id] > 1),
        "TASK_COMMIT_ACCEPTED of a task not COMPLETED": sum(
            1 for task_id in accepted_tasks if by_task[task_id].state.value != "COMPLETED"),
        "COMPLETED tasks without their evidence row": sum(
            1 for record in completed if not _is_sent_evidence(rows[record.spec.task_id]["evidence"])),
        "issued leases without LEASE_CLAIMED": sum(1 for lease_id in issued if claimed[lease_id] == 0),
        "leases with more than one LEASE_CLAIMED": sum(1 for n in claimed.values() if n > 1),
        "leases a client received that are not in the store": len(fleet.returned - issued),
        "leases a client received without LEASE_CLAIMED": sum(1 for lease_id in fleet.returned
                                                              if claimed[lease_id] == 0),
    }


def test_kill9_under_load_keeps_every_completion_and_its_events(tmp_path: Path) -> None:
    data = tmp_path / "data"
    rng = random.Random(20300101)
    coordinator = CoordinatorProcess(data, env={"FLASHML_SWEEP_INTERVAL_S": "0.2"}).start()
    threads: list[threading.Thread] = []
    fleet: Fleet | None = None
    try:
        submitted = httpx.post(f"{coordinator.url}/v1alpha1/jobs", json=_job_spec(), timeout=60.0)
        assert submitted.status_code == 201, submitted.text
        job_id = submitted.json()["job_id"]
        fleet = Fleet(coordinator.url, job_id)
        threads = [threading.Thread(target=fleet.client, args=(i, rng.randrange(2**32)), daemon=True)
                   for i in range(CLIENTS)]
        for thread in threads:
            thread.start()
        acks_at_kill = []
        for kill in range(KILLS):
            if kill:
                coordinator.start()
            target = fleet.acks + rng.randint(*ACKS_BEFORE_KILL)
            wait_until(lambda: fleet.acks >= min(target, TASKS) or bool(fleet.problems),
                       f"clients at work before kill {kill + 1}", timeout=HANG_GUARD_S)
            time.sleep(rng.uniform(0.0, JITTER_S))
            coordinator.kill9()
            acks_at_kill.append(fleet.acks)
        coordinator.start()
        wait_until(lambda: _terminal(coordinator.url, job_id), "the job to finish after the last kill",
                   timeout=HANG_GUARD_S)
        fleet.stop.set()
        for thread in threads:
            thread.join(timeout=30)
        with httpx.Client(base_url=coordinator.url, timeout=60.0) as api:
            job = api.get(f"/v1alpha1/jobs/{job_id}").json()
            events = api.get(f"/v1alpha1/jobs/{job_id}/events").json()
            tasks = api.get(f"/v1alpha1/jobs/{job_id}/tasks").json()
    finally:
        if fleet is not None:
            fleet.stop.set()
        coordinator.stop()
    assert not fleet.problems, fleet.problems[:5]
    assert fleet.reregistrations == 0, "a restarted coordinator forgot a registered node"
    assert acks_at_kill[-1] < TASKS, "the job was drained before the last kill: the kills tested little"

    store = SqliteLeaseStore(data / "flashruntime.db")
    try:
        records = store.all(job_id)
    finally:
        store.close()
    holes = _holes(records, events, tasks, fleet)
    assert sum(holes.values()) == 0, "; ".join(f"{what}: {n}" for what, n in holes.items())
    assert job["state"] == "SUCCEEDED" and len(records) == TASKS
    types = Counter(event["type"] for event in events)
    assert types["JOB_SUCCEEDED"] == 1 and types["TASK_ATTEMPT_FAILED"] > 0
