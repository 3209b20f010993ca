"""The coordinator's Ray backend against a real local Ray (``ray.init(num_cpus=2)``) and a real
coordinator over HTTP: sweeps of ``module`` and ``argv`` tasks, the environment contract, the
evidence of each attempt, a killed Ray worker, a deterministic error, cancel, and placement
that Ray cannot honour."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._support import iris_csv, pid_alive, wait_until
from tests.service_server import serve_in_thread, settings_for

pytestmark = [pytest.mark.service, pytest.mark.ray, pytest.mark.slow]
pytest.importorskip("uvicorn")
pytest.importorskip("sklearn")
httpx = pytest.importorskip("httpx")

GRID_C = [0.01, 0.1, 1.0, 10.0, 100.0, 1000.0]
# Writes the contract variables it sees, and one more output file, then metrics.json.
CONTRACT_PROGRAM = (
    "import json, os, sys; out = os.environ['FLASHML_OUTPUT_DIR']; "
    "names = ['FLASHML_OUTPUT_DIR', 'FLASHML_CKPT_DIR', 'FLASHML_JOB_ID', 'FLASHML_ATTEMPT_ID', 'FLASHML_TASK_ID', "
    "'FLASHML_INPUTS_FILE']; seen = dict((n, os.environ.get(n)) for n in names); "
    "seen['inputs'] = json.load(open(seen['FLASHML_INPUTS_FILE'])); "
    "seen['note'] = open(seen['inputs']['note']).read(); print('task', sys.argv[1], 'ran'); "
    "open(os.path.join(out, 'extra.txt'), 'w').write(sys.argv[1]); "
    "json.dump(dict(i=int(sys.argv[1]), env=seen), open(os.path.join(out, 'metrics.json'), 'w'))"
)


@pytest.fixture(scope="module")
def api(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A coordinator with the Ray backend (the test's own Ray), command jobs admitted."""
    data = tmp_path_factory.mktemp("ray-coordinator") / "data"
    previous = os.environ.get("FLASHML_ALLOW_UNSANDBOXED_ARGV")
    os.environ["FLASHML_ALLOW_UNSANDBOXED_ARGV"] = "1"
    try:
        with serve_in_thread(settings_for(data, ray_address="local")) as url, \
                httpx.Client(base_url=url, timeout=10) as client:
            yield client
    finally:
        if previous is None:
            os.environ.pop("FLASHML_ALLOW_UNSANDBOXED_ARGV", None)
        else:
            os.environ["FLASHML_ALLOW_UNSANDBOXED_ARGV"] = previous


def job(workload: dict[str, Any], *, backend: str | None = "ray", attempts: int = 3,
        resources: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"workload": workload, "retryPolicy": {"maxTaskAttempts": attempts}}
    if backend is not None:
        spec["execution"] = {"backend": backend}
    if resources is not None:
        spec["resources"] = resources
    return {"apiVersion": "flashml.dev/v1alpha1", "kind": "Job", "metadata": {"name": "on-ray"}, "spec": spec}


def command(*argv: str, params: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    parameters: dict[str, Any] = {"command": [sys.executable, *argv], **extra}
    if params is not None:
        parameters["task_params"] = params
    return {"type": "command", "parameters": parameters}


def submit(api: Any, spec: dict[str, Any]) -> str:
    created = api.post("/v1alpha1/jobs", json=spec)
    assert created.status_code == 201, created.text
    return created.json()["job_id"]


def terminal(api: Any, job_id: str, timeout: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout  # a hang guard
    while (record := api.get(f"/v1alpha1/jobs/{job_id}").json())["state"] in ("PENDING", "RUNNING"):
        assert time.monotonic() < deadline, api.get(f"/v1alpha1/jobs/{job_id}/events").json()
        time.sleep(0.1)
    return record


def events(api: Any, job_id: str, kind: str | None = None) -> list[dict[str, Any]]:
    found = api.get(f"/v1alpha1/jobs/{job_id}/events").json()
    return [event for event in found if kind is None or event["type"] == kind]


def test_a_six_trial_sweep_runs_on_ray_and_commits_every_trial_once(api: Any) -> None:
    assert api.put("/v1alpha1/artifacts/datasets/iris.csv", content=iris_csv()).status_code == 200
    job_id = submit(api, job({"type": "hyperparameter_search",
                              "parameters": {"grid": {"model": ["logreg"], "C": GRID_C},
                                             "inputs": {"dataset": "artifact://datasets/iris.csv"}}}))
    record = terminal(api, job_id)
    tasks = api.get(f"/v1alpha1/jobs/{job_id}/tasks").json()
    assert record["state"] == "SUCCEEDED" and record["backend"] == "ray", (record, tasks)
    assert [task["task_id"] for task in tasks] == [f"trial-{i:03d}" for i in range(6)]
    assert all(task["state"] == "COMPLETED" and task["attempts"] == 1 and task["node_id"] == "ray"
               for task in tasks), tasks
    accepted = events(api, job_id, "TASK_COMMIT_ACCEPTED")
    assert sorted(event["data"]["task_id"] for event in accepted) == [task["task_id"] for task in tasks]
    assert events(api, job_id, "BACKEND_SELECTED")[0]["message"].startswith("backend: ray (6 independent tasks")

    listed = {item["key"] for item in api.get(f"/v1alpha1/jobs/{job_id}/artifacts").json()}
    for task, c in zip(tasks, GRID_C, strict=True):
        assert f"jobs/{job_id}/{task['task_id']}/metrics.json" in listed
        metrics = api.get(f"/v1alpha1/artifacts/jobs/{job_id}/{task['task_id']}/metrics.json").json()
        assert metrics["params"] == {"model": "logreg", "C": c} and metrics["n_samples"] == 150
        evidence = task["evidence"]
        assert evidence["exit_code"] == 0 and evidence["wall_seconds"] > 0
        assert evidence["ray_node_id"] and evidence["node_ip"] and evidence["hostname"]
        assert isinstance(evidence["worker_pid"], int) and evidence["gpu_ids"] == []
    started = events(api, job_id, "TASK_ATTEMPT_STARTED")
    assert len(started) == 6 and all(event["data"]["ray"]["worker_pid"] for event in started)


def test_command_tasks_on_ray_see_the_environment_contract_and_their_inputs(api: Any) -> None:
    assert api.put("/v1alpha1/artifacts/notes/hello.txt", content=b"hello from the store").status_code == 200
    job_id = submit(api, job(command("-c", CONTRACT_PROGRAM, "{i}", params=[{"i": 0}, {"i": 1}],
                                     inputs={"note": "artifact://notes/hello.txt"})))
    assert terminal(api, job_id)["state"] == "SUCCEEDED"
    claimed = {event["data"]["task_id"]: event["data"]["lease_id"] for event in events(api, job_id, "LEASE_CLAIMED")}
    for task_id in ("task-000", "task-001"):
        seen = api.get(f"/v1alpha1/artifacts/jobs/{job_id}/{task_id}/metrics.json").json()["env"]
        assert seen["FLASHML_JOB_ID"] == job_id and seen["FLASHML_TASK_ID"] == task_id
        assert seen["FLASHML_ATTEMPT_ID"] == claimed[task_id]
        assert Path(seen["FLASHML_OUTPUT_DIR"]).parts[-4:] == (job_id, task_id, claimed[task_id], "out")
        assert Path(seen["FLASHML_CKPT_DIR"]).parts[-3:] == (job_id, task_id, "ckpt")
        assert seen["note"] == "hello from the store"
        extra = api.get(f"/v1alpha1/artifacts/jobs/{job_id}/{task_id}/extra.txt")
        assert extra.text == task_id[-1]
    logs = api.get(f"/v1alpha1/jobs/{job_id}/logs").json()["tasks"]
    assert [entry["log"] for entry in logs] == ["task 0 ran\n", "task 1 ran\n"]


def test_a_killed_ray_worker_is_a_worker_crash_and_its_task_is_retried_and_completes(
        api: Any, tmp_path: Path) -> None:
    flag, child = tmp_path / "first-attempt-ran", tmp_path / "child.pid"
    # The first attempt writes its pid and hangs; the second finishes at once.
    program = ("import json, os, sys, time; flag, pid = sys.argv[1], sys.argv[2]\n"
               "if not os.path.exists(flag):\n"
               "    open(flag, 'w').close(); open(pid, 'w').write(str(os.getpid())); time.sleep(300)\n"
               "json.dump(dict(ok=1), open(os.path.join(os.environ['FLASHML_OUTPUT_DIR'], 'metrics.json'), 'w'))")
    job_id = submit(api, job(command("-c", program, str(flag), str(child))))
    wait_until(lambda: child.exists() and child.read_text() != "" and events(api, job_id, "TASK_ATTEMPT_STARTED"),
               "the first attempt to start", timeout=60)
    started = events(api, job_id, "TASK_ATTEMPT_STARTED")
    worker_pid, child_pid = started[0]["data"]["ray"]["worker_pid"], int(child.read_text())
    os.kill(worker_pid, signal.SIGKILL)

    record = terminal(api, job_id)
    tasks = api.get(f"/v1alpha1/jobs/{job_id}/tasks").json()
    assert record["state"] == "SUCCEEDED", (record, tasks)
    assert tasks[0]["attempts"] == 2 and tasks[0]["failures"] == 0 and tasks[0]["expiries"] == 1
    classified = events(api, job_id, "FAILURE_CLASSIFIED")
    assert len(classified) == 1
    data = classified[0]["data"]
    assert data["failure_class"] in ("worker_crash", "node_loss") and data["retried"] is True
    assert data["action"] == "retry_task" and data["ray"]["worker_pid"] == worker_pid
    expired = events(api, job_id, "LEASE_EXPIRED")
    assert len(expired) == 1 and expired[0]["data"]["abandoned"] is True
    # The goodput ledger reads the recovery from the events, as for an agent that died.
    from flashruntime.job_goodput import job_goodput
    from flashruntime.protocol.v1alpha1 import Event

    ledger = job_goodput([Event.model_validate(event) for event in events(api, job_id)])
    (recovery,) = ledger.recoveries
    assert (ledger.attempts, ledger.committed, recovery.cause, recovery.node_id) == (2, 1, "abandoned", "ray")
    assert 0 < ledger.goodput < 1 and ledger.lost_work_s > 0
    # What the dead worker left running (its child, in its own session) is stopped on its node.
    wait_until(lambda: not pid_alive(child_pid), f"the orphaned attempt (pid {child_pid}) to be stopped", timeout=30)


def test_an_import_error_fails_the_task_once_without_a_retry(api: Any) -> None:
    job_id = submit(api, job(command("-c", "import no_such_module_anywhere"), attempts=3))
    record = terminal(api, job_id)
    tasks = api.get(f"/v1alpha1/jobs/{job_id}/tasks").json()
    assert record["state"] == "FAILED"
    assert tasks[0]["state"] == "FAILED" and tasks[0]["attempts"] == 1 and tasks[0]["failures"] == 1
    classified = events(api, job_id, "FAILURE_CLASSIFIED")
    assert [event["data"]["failure_class"] for event in classified] == ["application_error"]
    assert classified[0]["data"]["retried"] is False
    assert "ModuleNotFoundError" in classified[0]["data"]["evidence"]
    exhausted = events(api, job_id, "TASK_EXHAUSTED")
    assert len(exhausted) == 1 and "failed without a retry" in exhausted[0]["message"]
    assert "ModuleNotFoundError" in api.get(f"/v1alpha1/jobs/{job_id}/logs").json()["tasks"][0]["log"]


def test_a_task_modules_bad_parameter_fails_once_as_an_application_error(api: Any) -> None:
    workload = {"type": "hyperparameter_search", "parameters": {"module": "sgd_trainer", "trials": [{"lr": 0.1}]}}
    job_id = submit(api, job(workload, attempts=3))
    record = terminal(api, job_id)
    tasks = api.get(f"/v1alpha1/jobs/{job_id}/tasks").json()
    assert record["state"] == "FAILED"
    assert tasks[0]["attempts"] == 1 and tasks[0]["failures"] == 1
    classified = events(api, job_id, "FAILURE_CLASSIFIED")
    assert [(e["data"]["failure_class"], e["data"]["retried"]) for e in classified] == [("application_error", False)]
    assert classified[0]["data"]["evidence"] == "sgd_trainer refused its task: ValueError"
    assert "sgd_trainer refused its task" in record["error"]


def test_cancel_stops_the_running_ray_tasks_and_leaves_no_process(api: Any, tmp_path: Path) -> None:
    program = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(300)"
    pid_files = [tmp_path / "a.pid", tmp_path / "b.pid"]
    job_id = submit(api, job(command("-c", program, "{pid_file}", params=[{"pid_file": str(p)} for p in pid_files])))
    wait_until(lambda: all(p.exists() and p.read_text() for p in pid_files)
               and len(events(api, job_id, "TASK_ATTEMPT_STARTED")) == 2, "both tasks to start", timeout=60)
    pids = [int(p.read_text()) for p in pid_files]
    workers = [event["data"]["ray"]["worker_pid"] for event in events(api, job_id, "TASK_ATTEMPT_STARTED")]
    assert all(pid_alive(pid) for pid in pids)

    cancelled = api.post(f"/v1alpha1/jobs/{job_id}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "CANCELLED"
    wait_until(lambda: not any(pid_alive(pid) for pid in pids), f"the tasks' processes {pids} to stop", timeout=30)
    assert all(task["state"] == "CANCELLED" for task in api.get(f"/v1alpha1/jobs/{job_id}/tasks").json())
    assert len(workers) == 2 and not events(api, job_id, "FAILURE_CLASSIFIED")  # a cancel is no failure


@pytest.mark.parametrize(("resources", "extra", "words"), [
    ({"gpuPerTask": 1}, {}, "no node of the Ray cluster has CPU: 1, GPU: 1"),
    (None, {"local_inputs": ["imagenet"]}, "dataset:imagenet"),
])
def test_placement_ray_cannot_honour_is_refused_with_the_reason(api: Any, resources: Any, extra: dict[str, Any],
                                                                 words: str) -> None:
    before = len(api.get("/v1alpha1/jobs").json())
    refused = api.post("/v1alpha1/jobs", json=job(command("-c", "pass", **extra), resources=resources))
    assert refused.status_code == 422, refused.text
    assert "cannot run on Ray" in refused.json()["detail"] and words in refused.json()["detail"]
    assert len(api.get("/v1alpha1/jobs").json()) == before  # nothing stored


def test_with_a_ray_address_ray_is_the_default_backend_and_leases_stays_available(api: Any) -> None:
    job_id = submit(api, job(command("-c", "pass"), backend=None))
    assert api.get(f"/v1alpha1/jobs/{job_id}").json()["backend"] == "ray"
    terminal(api, job_id)
    leases = submit(api, job(command("-c", "pass"), backend="leases"))
    record = api.get(f"/v1alpha1/jobs/{leases}").json()
    assert record["backend"] == "leases" and record["state"] == "RUNNING"
    time.sleep(1.0)  # the Ray dispatcher has had its chances: a lease job is the agents' alone
    assert api.get(f"/v1alpha1/jobs/{leases}/tasks").json()[0]["state"] == "PENDING"
    assert api.post(f"/v1alpha1/jobs/{leases}/cancel").status_code == 200



def test_sharded_kmeans_on_ray_reaches_the_lease_based_kmeans_centroids(api: Any, tmp_path: Path) -> None:
    import random
    import threading

    from flashml_workloads import kmeans_driver, sharded_kmeans
    from tests.service_server import run_worker

    draw = random.Random(7)
    centres = [(0.0, 0.0), (5.0, 5.0), (0.0, 6.0)]
    rows = [[round(cx + draw.gauss(0, 1), 6), round(cy + draw.gauss(0, 1), 6)]
            for _ in range(60) for cx, cy in centres]
    centroids = kmeans_driver.init_centroids(rows, 3, seed=1)
    shards, iterations = 3, 3

    url = str(api.base_url).rstrip("/")
    uris = kmeans_driver.shard_and_upload(url, rows, shards, "datasets/kmeans")
    worker: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: worker.update(
        result=run_worker(url, tmp_path / "work", "--node-id", "kmeans-agent", max_tasks=shards * iterations)))
    thread.start()
    on_leases = kmeans_driver.run_kmeans(url, uris, centroids, iterations=iterations, poll_seconds=0.1)
    thread.join(timeout=120)
    assert worker["result"][0] == 0, worker["result"][1]
    for job_id in on_leases["job_ids"]:  # the agent ran every shard: these were lease jobs
        assert {task["node_id"] for task in api.get(f"/v1alpha1/jobs/{job_id}/tasks").json()} == {"kmeans-agent"}

    on_ray = sharded_kmeans.run_kmeans(sharded_kmeans.shard_rows(rows, shards), centroids, iterations=iterations)
    assert on_ray["attempts"] == [shards] * iterations
    # The coordinator's driver, its iterations as jobs of the Ray backend: the same again.
    ray_jobs = kmeans_driver.run_kmeans(url, uris, centroids, iterations=iterations, poll_seconds=0.1, backend="ray")
    assert all(api.get(f"/v1alpha1/jobs/{job_id}").json()["backend"] == "ray" for job_id in ray_jobs["job_ids"])
    for result in (on_ray, ray_jobs):
        assert result["inertia_history"] == pytest.approx(on_leases["inertia_history"], rel=1e-12)
        for got, want in zip(result["centroids"], on_leases["centroids"], strict=True):
            assert got == pytest.approx(want, abs=1e-9)


@pytest.mark.torch
def test_fedavg_rounds_run_as_jobs_of_the_ray_backend(api: Any) -> None:
    """Two rounds over two shards of ``fedavg_worker`` tasks on Ray: every shard takes part,
    and the second round starts from the first's reduced weights and lowers the loss."""
    pytest.importorskip("torch")
    from flashml_workloads import fedavg_worker
    from flashml_workloads.fedavg_driver import HttpCoordinator, run_fedavg

    params = {"local_steps": 10, "lr": 0.2, "batch_size": 16, "seed": 7, "in_dim": 4, "hidden": 8, "out_dim": 2,
              "dataset_size": 128}
    initial = fedavg_worker.state_to_blob(fedavg_worker.build_model({**params, "round": 0, "shard": 0,
                                                                      "num_shards": 2}))
    out = run_fedavg(HttpCoordinator(str(api.base_url).rstrip("/")), rounds=2, num_shards=2, min_participants=2,
                     worker_params=params, initial_weights=initial, poll_seconds=0.1, round_timeout_s=120.0,
                     backend="ray")
    assert [round_["participants"] for round_ in out["history"]] == [2, 2]
    assert out["history"][1]["mean_loss"] < out["history"][0]["mean_loss"]
    for _round, job_id in out["job_ids"]:
        record = api.get(f"/v1alpha1/jobs/{job_id}").json()
        assert record["backend"] == "ray" and record["state"] == "SUCCEEDED"


def test_a_coordinator_that_stops_gives_its_running_leases_back_and_stops_their_ray_tasks(
        api: Any, tmp_path: Path) -> None:
    """No budget spent: the task is PENDING again for the next coordinator, its process gone.
    (``api`` is here for what it sets up: command jobs admitted, the test's Ray connected.)"""
    from flashruntime.coordinator.core import Coordinator
    from flashruntime.coordinator.job_views import task_rows
    from flashruntime.protocol.v1alpha1 import JobSpec

    pid_file = tmp_path / "pid"
    program = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(300)"
    coordinator = Coordinator(settings_for(tmp_path / "data", ray_address="local"))
    try:
        coordinator.start_backends()
        record = coordinator.submit(JobSpec.model_validate(job(command("-c", program, str(pid_file)))))

        def started() -> bool:
            kinds = {event.type.value for event in coordinator.ledger.events_for(record.job_id)}
            return pid_file.exists() and pid_file.read_text() != "" and "TASK_ATTEMPT_STARTED" in kinds

        wait_until(started, "the attempt to start", timeout=60)
        pid = int(pid_file.read_text())
    finally:
        coordinator.close()
    reopened = Coordinator(settings_for(tmp_path / "data"))  # no Ray address: nothing runs it again
    try:
        [task] = task_rows(reopened, record.job_id)
        kinds = [event.type.value for event in reopened.ledger.events_for(record.job_id)]
    finally:
        reopened.close()
    assert (task["state"], task["released"], task["failures"], task["expiries"]) == ("PENDING", 1, 0, 0)
    assert "LEASE_RELEASED" in kinds and "FAILURE_CLASSIFIED" not in kinds
    wait_until(lambda: not pid_alive(pid), f"the attempt's process {pid} to stop", timeout=30)


# Steps to metrics.jsonl; its first attempt (no marker yet in the task's checkpoint
# directory, which stays on the node for the next attempt) then waits forever.
HANGS_ONCE = """
import json, os, time
marker = os.path.join(os.environ["FLASHML_CKPT_DIR"], "ran-once")
first = not os.path.exists(marker)
open(marker, "a").close()
out = os.environ["FLASHML_OUTPUT_DIR"]
with open(os.path.join(out, "metrics.jsonl"), "a") as lines:
    for step in range(1, 4):
        lines.write(json.dumps({"step": step, "ts": time.time()}) + "\\n")
        lines.flush()
        time.sleep(0.2)
def waits_forever():
    while True:
        time.sleep(1)
if first:
    waits_forever()
json.dump({"loss": 0.1}, open(os.path.join(out, "metrics.json"), "w"))
"""


def test_a_task_that_hangs_on_ray_is_caught_on_its_node_judged_hang_and_run_again(api: Any) -> None:
    job_id = submit(api, job(command("-c", HANGS_ONCE, env={"FLASHML_HANG_TIMEOUT_S": "4"}), attempts=2))
    record = terminal(api, job_id, timeout=180)
    assert record["state"] == "SUCCEEDED", events(api, job_id)
    (judged,) = events(api, job_id, "FAILURE_CLASSIFIED")
    assert judged["data"]["failure_class"] == "hang" and judged["data"]["retried"] is True, judged
    assert "no progress for" in judged["data"]["evidence"] and "step 3" in judged["data"]["evidence"], judged
    logs = api.get(f"/v1alpha1/jobs/{job_id}/logs").json()["tasks"][0]["log"]
    assert "waits_forever" in logs, logs  # the stacks the node dumped came back in the log


def test_a_hang_timeout_that_is_no_number_refuses_the_task_on_ray(api: Any) -> None:
    job_id = submit(api, job(command("-c", "pass", env={"FLASHML_HANG_TIMEOUT_S": "soon"}), attempts=1))
    assert terminal(api, job_id)["state"] == "FAILED"
    failed = events(api, job_id, "TASK_ATTEMPT_FAILED") + events(api, job_id, "FAILURE_CLASSIFIED")
    assert any("FLASHML_HANG_TIMEOUT_S='soon' is not a number of seconds" in event["message"]
               + json.dumps(event["data"]) for event in failed), failed
