"""``GET /v1alpha1/jobs/{id}/logs`` over real HTTP (uvicorn on 127.0.0.1, tokens configured):
the tasks' logs as their node uploaded them, ``?task=`` and ``?tail=``, their refusals, who
may read them; the artifact listing's sha256; and a JobSpec of only a workload and resources."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flashruntime.coordinator.task_logs import log_share, read_log
from flashruntime.protocol.task_logs import JOB_LOGS_MAX_BYTES, TASK_LOG_CUT_LINE, TASK_LOG_MAX_BYTES
from tests.integration.test_service_app import job_spec, registration
from tests.service_server import serve_in_thread, settings_for

pytestmark = pytest.mark.service
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

TOKENS = {
    "FLASHML_NODE_TOKENS": "node-a:tok-node",
    "FLASHML_SUBMITTER_TOKENS": "alice:tok-alice,bob:tok-bob",
    "FLASHML_OPERATOR_TOKENS": "root:tok-root",
}
NODE, ALICE, BOB, ROOT = ({"Authorization": f"Bearer {token}"} for token in
                          ("tok-node", "tok-alice", "tok-bob", "tok-root"))
LOG = b"epoch 1 loss 0.9\nepoch 2 loss 0.5\ndone\n"


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, str]]:
    """Alice's two-task job; node A holds trial-000 and uploaded its log."""
    for name, value in TOKENS.items():
        monkeypatch.setenv(name, value)
    with serve_in_thread(settings_for(tmp_path / "data", rate_limit_per_s=0.0)) as url, \
            httpx.Client(base_url=url, timeout=30) as api:
        assert api.post("/v1alpha1/nodes/register", json=registration(), headers=NODE).status_code == 200
        job_id = api.post("/v1alpha1/jobs", json=job_spec(trials=2), headers=ALICE).json()["job_id"]
        lease = api.post("/v1alpha1/leases/claim", json={"node_id": "node-a"}, headers=NODE).json()
        assert lease["task_id"] == "trial-000"
        put = api.put(f"/v1alpha1/artifacts/jobs/{job_id}/trial-000/task.log", content=LOG, headers=NODE)
        assert put.status_code == 200, put.text
        yield api, job_id


def test_the_logs_of_every_task_with_a_header_each_and_one_entry_per_task(world: tuple[Any, str]) -> None:
    api, job_id = world
    answer = api.get(f"/v1alpha1/jobs/{job_id}/logs", headers=ALICE)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["logs"] == f"--- trial-000 (LEASED) ---\n{LOG.decode()}--- trial-001 (PENDING) ---\n"
    assert body["tasks"] == [
        {"task_id": "trial-000", "state": "LEASED", "node_id": "node-a", "log": LOG.decode(), "truncated": False, "attempt": None},
        {"task_id": "trial-001", "state": "PENDING", "node_id": None, "log": "", "truncated": False, "attempt": None},
    ]
    assert api.get(f"/v1alpha1/jobs/{job_id}/logs", headers=ROOT).json() == body  # an operator reads it too


def test_task_and_tail_select(world: tuple[Any, str]) -> None:
    api, job_id = world
    one = api.get(f"/v1alpha1/jobs/{job_id}/logs", params={"task": "trial-001"}, headers=ALICE).json()
    assert [entry["task_id"] for entry in one["tasks"]] == ["trial-001"]
    assert one["logs"] == "--- trial-001 (PENDING) ---\n"
    tail = api.get(f"/v1alpha1/jobs/{job_id}/logs", params={"task": "trial-000", "tail": 2}, headers=ALICE).json()
    assert tail["tasks"][0]["log"] == "epoch 2 loss 0.5\ndone\n" and tail["tasks"][0]["truncated"] is True
    assert tail["logs"] == "--- trial-000 (LEASED) ---\nepoch 2 loss 0.5\ndone\n"
    whole = api.get(f"/v1alpha1/jobs/{job_id}/logs", params={"task": "trial-000", "tail": 3}, headers=ALICE).json()
    assert whole["tasks"][0]["log"] == LOG.decode() and whole["tasks"][0]["truncated"] is False
    none = api.get(f"/v1alpha1/jobs/{job_id}/logs", params={"tail": 0}, headers=ALICE).json()
    assert [entry["log"] for entry in none["tasks"]] == ["", ""]


def test_an_unknown_task_is_404_naming_it(world: tuple[Any, str]) -> None:
    api, job_id = world
    answer = api.get(f"/v1alpha1/jobs/{job_id}/logs", params={"task": "trial-999"}, headers=ALICE)
    assert answer.status_code == 404
    assert answer.json()["detail"] == (f"job '{job_id}' has no task 'trial-999'; GET /v1alpha1/jobs/{job_id}/tasks "
                                       "lists its tasks")


@pytest.mark.parametrize("tail", ["-1", "abc", "1.5", str(100_001)])
def test_a_bad_tail_is_422(world: tuple[Any, str], tail: str) -> None:
    api, job_id = world
    answer = api.get(f"/v1alpha1/jobs/{job_id}/logs", params={"tail": tail}, headers=ALICE)
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"][0]["loc"] == ["query", "tail"]


def test_another_submitter_sees_no_such_job_and_a_node_may_not_read_logs(world: tuple[Any, str]) -> None:
    api, job_id = world
    for params in ({}, {"task": "trial-000"}, {"tail": 1}):
        other = api.get(f"/v1alpha1/jobs/{job_id}/logs", params=params, headers=BOB)
        assert other.status_code == 404 and other.json()["detail"] == f"unknown job {job_id!r}"
    assert api.get(f"/v1alpha1/jobs/{job_id}/logs", headers=NODE).status_code == 403
    assert api.get(f"/v1alpha1/jobs/{job_id}/logs").status_code == 401
    assert api.get("/v1alpha1/jobs/nope/logs", headers=ALICE).status_code == 404


def test_the_artifact_listing_gives_each_files_sha256(world: tuple[Any, str]) -> None:
    api, job_id = world
    listing = api.get(f"/v1alpha1/jobs/{job_id}/artifacts", headers=ALICE).json()
    assert listing == [{"uri": f"artifact://jobs/{job_id}/trial-000/task.log",
                        "key": f"jobs/{job_id}/trial-000/task.log", "size_bytes": len(LOG),
                        "sha256": hashlib.sha256(LOG).hexdigest()}]
    newer = LOG + b"one more line\n"  # a log re-uploaded while the task runs: its new digest
    assert api.put(f"/v1alpha1/artifacts/jobs/{job_id}/trial-000/task.log", content=newer,
                   headers=NODE).status_code == 200
    again = api.get(f"/v1alpha1/jobs/{job_id}/artifacts", headers=ALICE).json()
    assert again[0]["sha256"] == hashlib.sha256(newer).hexdigest() and again[0]["size_bytes"] == len(newer)


def test_a_jobspec_of_only_workload_and_resources_is_accepted_with_the_coordinators_backend(
        world: tuple[Any, str]) -> None:
    api, _ = world
    minimal = {"metadata": {"name": "minimal"},
               "spec": {"workload": {"type": "hyperparameter_search", "parameters": {"trials": [{"C": 1.0}]}},
                        "resources": {"minimumWorkers": 1, "maximumWorkers": 1}}}
    created = api.post("/v1alpha1/jobs", json=minimal, headers=ALICE)
    assert created.status_code == 201, created.text
    record = created.json()
    assert record["backend"] == "leases" and record["spec"]["spec"]["execution"]["backend"] == "leases"
    assert record["spec"]["spec"]["image"] is None
    assert api.get(f"/v1alpha1/jobs/{record['job_id']}", headers=ALICE).json() == record  # as stored
    events = api.get(f"/v1alpha1/jobs/{record['job_id']}/events", headers=ALICE).json()
    assert events[1]["message"] == "backend: leases (1 independent tasks)"

    ray = {**minimal, "spec": {**minimal["spec"], "execution": {"backend": "ray"}}}
    refused = api.post("/v1alpha1/jobs", json=ray, headers=ALICE)
    assert refused.status_code == 503
    assert refused.json()["detail"] == (
        "backend 'ray' is not configured on this coordinator: set FLASHML_RAY_ADDRESS (or serve --ray-address) "
        "to a Ray cluster's address to run jobs on Ray, or submit with spec.execution.backend = 'leases' (the "
        "default here) to run them on the agent fleet")
    assert len(api.get("/v1alpha1/jobs", headers=ALICE).json()) == 2  # the refused one stored nothing


def test_one_answer_shares_its_bound_among_the_tasks_and_says_what_it_left_out(tmp_path: Path) -> None:
    assert log_share(1) == TASK_LOG_MAX_BYTES and log_share(10_000) == JOB_LOGS_MAX_BYTES // 10_000
    log = tmp_path / "task.log"
    log.write_bytes(b"".join(b"line %04d\n" % i for i in range(1000)))
    text, truncated = read_log(log, 100)
    assert truncated and text.startswith("[flashruntime: earlier output not shown;")
    assert text.splitlines()[1:] == [f"line {i:04d}" for i in range(990, 1000)]  # whole lines only
    assert read_log(log, 1 << 20) == (log.read_text(), False)
    assert read_log(tmp_path / "none.log", 100) == ("", False)
    cut = tmp_path / "cut.log"
    cut.write_bytes(TASK_LOG_CUT_LINE.encode() + b"\nlast\n")  # as a worker cut it
    assert read_log(cut, 1 << 20) == (f"{TASK_LOG_CUT_LINE}\nlast\n", True)
