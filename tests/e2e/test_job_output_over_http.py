"""What a run leaves, end to end: ``flashruntime serve``, real ``flashruntime worker`` processes,
and the installed ``flashruntime`` command reading a finished job: ``logs`` (``--task``,
``--tail``, ``--follow`` while the job runs), ``tasks``, ``artifacts`` (``--download``), with
``--api`` after the command; and a JobSpec of only a workload and resources, run to success."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.service_server import free_port, process_env, run_worker, stop_process, wait_healthy

pytestmark = pytest.mark.service
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

CONSOLE_SCRIPT = Path(sys.executable).with_name("flashruntime")
MARK = f"marker-{uuid.uuid4().hex[:8]}"
# Each task prints a first line, its marker on stdout, a line on stderr and a last line.
PROGRAM = ("import json, os, sys; i = sys.argv[1]; print('first line', i); print('" + MARK + "-' + i); "
           "print('to stderr', i, file=sys.stderr); sys.stderr.flush(); print('last line', i); "
           "json.dump(dict(task=int(i)), open(os.path.join(os.environ['FLASHML_OUTPUT_DIR'], 'metrics.json'), 'w'))")


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data = tmp_path_factory.mktemp("serve") / "data"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([str(CONSOLE_SCRIPT), "serve", "--port", str(port), "--data-dir", str(data)],
                              env=process_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_healthy(url, process=server)
        yield url
    finally:
        stop_process(server)


def flashruntime(*args: str) -> subprocess.CompletedProcess[str]:
    """The installed console script, with no coordinator in its environment: --api says where."""
    return subprocess.run([str(CONSOLE_SCRIPT), *args], env=process_env(), capture_output=True, text=True,
                          timeout=120, check=False)


def _terminal(url: str, job_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60  # a hang guard
    while (job := httpx.get(f"{url}/v1alpha1/jobs/{job_id}", timeout=10).json())["state"] in ("PENDING", "RUNNING"):
        assert time.monotonic() < deadline, job
        time.sleep(0.1)
    return job


@pytest.fixture(scope="module")
def finished(coordinator: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A command job of two tasks that ran on a real worker, while ``logs --follow`` watched it."""
    spec = {"metadata": {"name": "markers"}, "spec": {
        "workload": {"type": "command", "parameters": {
            "command": [sys.executable, "-c", PROGRAM, "{i}"], "task_params": [{"i": 0}, {"i": 1}]}},
        "isolation": {"tier": "sandboxed", "allowFallback": True}, "placement": {"pool": "team-7"},
        "retryPolicy": {"maxTaskAttempts": 1}}}
    spec_file = tmp_path_factory.mktemp("spec") / "job.json"
    spec_file.write_text(json.dumps(spec))
    submitted = flashruntime("submit-spec", "--json", str(spec_file), "--api", coordinator)
    assert submitted.returncode == 0, submitted.stderr
    job_id = json.loads(submitted.stdout)["job_id"]
    follow = subprocess.Popen([str(CONSOLE_SCRIPT), "logs", job_id, "--follow", "--api", coordinator],
                              env=process_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        code, log = run_worker(coordinator, tmp_path_factory.mktemp("work"), "--node-id", "w1", "--runner",
                               "trusted", "--pools", "team-7", max_tasks=2)
        assert code == 0, log
        assert _terminal(coordinator, job_id)["state"] == "SUCCEEDED", log
        out, err = follow.communicate(timeout=120)  # a hang guard: it returns once it sees the job ended
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.communicate()
    assert follow.returncode == 0, err
    assert f"job {job_id} SUCCEEDED" in err
    for i in (0, 1):  # every line once, whether it arrived while the task ran or at its end
        assert out.count(f"{MARK}-{i}\n") == 1 and out.count(f"--- task-00{i} (") == 1, out
        assert f"to stderr {i}\n" in out
    return coordinator, job_id


def test_logs_prints_what_each_task_printed_and_task_and_tail_select(finished: tuple[str, str]) -> None:
    url, job_id = finished
    shown = flashruntime("logs", job_id, "--api", url)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("--- task-000 (COMPLETED) ---\nfirst line 0\n")
    assert f"{MARK}-0\n" in shown.stdout and f"{MARK}-1\n" in shown.stdout
    one = flashruntime("logs", job_id, "--task", "task-001", "--api", url)
    assert one.returncode == 0 and f"{MARK}-1\n" in one.stdout and f"{MARK}-0" not in one.stdout
    tail = flashruntime("logs", job_id, "--tail", "1", "--api", url)
    assert tail.stdout == "--- task-000 (COMPLETED) ---\nlast line 0\n--- task-001 (COMPLETED) ---\nlast line 1\n"
    unknown = flashruntime("logs", job_id, "--task", "task-999", "--api", url)
    assert unknown.returncode == 1 and "404" in unknown.stderr and "no task 'task-999'" in unknown.stderr


def test_tasks_and_artifacts_list_the_finished_job_and_download_fetches_it(
        finished: tuple[str, str], tmp_path: Path) -> None:
    url, job_id = finished
    tasks = flashruntime("tasks", job_id, "--api", url)
    assert tasks.returncode == 0, tasks.stderr
    assert [line.split() for line in tasks.stdout.splitlines()] == [
        ["TASK", "STATE", "NODE", "ATTEMPTS"], ["task-000", "COMPLETED", "w1", "1/1"],
        ["task-001", "COMPLETED", "w1", "1/1"]]
    listed = flashruntime("artifacts", job_id, "--api", url)
    assert listed.returncode == 0, listed.stderr
    keys = [line.split()[0] for line in listed.stdout.splitlines()[1:]]
    assert keys == [f"jobs/{job_id}/task-00{i}/{name}" for i in (0, 1) for name in ("metrics.json", "task.log")]

    fetched = flashruntime("artifacts", job_id, "--download", str(tmp_path / "got"), "--api", url)
    assert fetched.returncode == 0, fetched.stderr
    assert fetched.stdout.count("sha256 ok") == 4
    for key in keys:
        local = tmp_path / "got" / key.split("/", 2)[2]
        served = httpx.get(f"{url}/v1alpha1/artifacts/{key}", timeout=10).content
        assert local.read_bytes() == served, key
    assert json.loads((tmp_path / "got" / "task-001" / "metrics.json").read_text()) == {"task": 1}
    assert f"{MARK}-0\n" in (tmp_path / "got" / "task-000" / "task.log").read_text()
    listing = httpx.get(f"{url}/v1alpha1/jobs/{job_id}/artifacts", timeout=10).json()
    assert all(item["sha256"] == hashlib.sha256((tmp_path / "got" / item["key"].split("/", 2)[2]).read_bytes())
               .hexdigest() for item in listing)


def test_api_after_the_command(finished: tuple[str, str]) -> None:
    url, job_id = finished
    status = flashruntime("status", "--json", job_id, "--api", url)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["state"] == "SUCCEEDED"


def test_a_jobspec_of_only_workload_and_resources_runs_to_success(coordinator: str, tmp_path: Path) -> None:
    rows = "".join(f"{x},{1 if x > 4 else 0}\n" for x in range(10))
    put = httpx.put(f"{coordinator}/v1alpha1/artifacts/datasets/tiny.csv", content=rows.encode(), timeout=10)
    assert put.status_code == 200, put.text
    spec = {"metadata": {"name": "minimal"}, "spec": {
        "workload": {"type": "hyperparameter_search", "parameters": {
            "module": "sgd_trainer", "grid": {"steps": [4]}, "inputs": {"dataset": "artifact://datasets/tiny.csv"}}},
        "resources": {"minimumWorkers": 1, "maximumWorkers": 1}}}
    spec_file = tmp_path / "minimal.json"
    spec_file.write_text(json.dumps(spec))
    submitted = flashruntime("submit-spec", "--json", str(spec_file), "--api", coordinator)
    assert submitted.returncode == 0, submitted.stderr
    record = json.loads(submitted.stdout)
    assert (record["state"], record["backend"], record["spec"]["spec"]["image"]) == ("RUNNING", "leases", None)
    code, log = run_worker(coordinator, tmp_path / "work", "--node-id", "w2", max_tasks=1)
    assert code == 0, log
    assert _terminal(coordinator, record["job_id"])["state"] == "SUCCEEDED", log
    metrics = httpx.get(f"{coordinator}/v1alpha1/artifacts/jobs/{record['job_id']}/trial-000/metrics.json",
                        timeout=10).json()
    assert metrics["steps"] == 4
