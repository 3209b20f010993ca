"""``flash.run`` through real processes and a real coordinator: a ``local``
plan runs a script through flash.submit, an ``independent_tasks`` plan becomes a lease
job on a coordinator served by uvicorn, a ``coordinated_training`` plan runs gloo ranks
under torchrun."""

from __future__ import annotations

import json
import os
import sys
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import flashruntime as flash
from flashruntime.errors import CoordinatorUnavailable
from flashruntime.launchers import LaunchState
from flashruntime.protocol.plan_v1alpha1 import StrategyPlan
from flashruntime.protocol.v1alpha1 import JobRecord, JobSpec, JobState
from flashruntime.sdk import Run
from flashruntime.workloads.command import CommandWorkload, Source
from tests.service_server import free_port, serve_in_thread, settings_for

WRITE_METRICS = """
import json, os, sys
json.dump({"args": sys.argv[1:], "plan_id": os.environ.get("FLASHML_PLAN_ID")}, open("metrics.json", "w"))
"""

GLOO_RANKS = """
import json, os
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
if dist.get_rank() == 0:
    out = os.path.join(os.environ["FLASHML_OUTPUT_DIR"], "metrics.json")
    json.dump({"world_size": dist.get_world_size(), "sum": total.item(), "plan_id": os.environ["FLASHML_PLAN_ID"],
               "family": os.environ["FLASHML_STRATEGY_FAMILY"]}, open(out, "w"))
dist.destroy_process_group()
"""


def make_plan(mode: str, **fields: Any) -> StrategyPlan:
    values: dict[str, Any] = {"plan_id": "pl_00aa11bb22cc33dd", "planner_version": "0.1.0", "workload_mode": mode,
                              "strategy_family": "lease_tasks", "launcher": "flashruntime-leases"}
    values.update(fields)
    return StrategyPlan(**values)


def _script(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "src" / "job.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def _post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        raw = response.read()
        return response.status, json.loads(raw) if raw else None


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[str]:
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    pytest.importorskip("httpx")  # serve_in_thread's health check
    with serve_in_thread(settings_for(tmp_path / "data")) as url:
        yield url


# --- local ---------------------------------------------------------------------------


def test_local_plan_runs_the_script_through_submit(tmp_path: Path) -> None:
    script = _script(tmp_path, WRITE_METRICS)
    workload = CommandWorkload(command=[sys.executable, str(script), "a", "b c"], source=Source(path=str(script.parent)),
                               task_params=[{"x": 1}, {"x": 2}])  # mode local: no fan-out
    run = flash.run(make_plan("local", strategy_family="local_process"), workload=workload,
                    output_dir=tmp_path / "out", watch=False)
    assert isinstance(run, Run)
    assert run.state is LaunchState.SUCCEEDED, run.logs()
    assert run.workload.mode == "local"
    assert [a["attempt_id"] for a in run.attempts] == ["task-000"]
    assert run.trials == [{"args": ["a", "b c"], "plan_id": None}]
    assert (tmp_path / "out" / "local" / "task-000" / "metrics.json").is_file()


def test_local_plan_with_wait_false_returns_a_run_that_finishes(tmp_path: Path) -> None:
    script = _script(tmp_path, WRITE_METRICS)
    workload = CommandWorkload(command=[sys.executable, str(script)], source=Source(path=str(script.parent)))
    run = flash.run(make_plan("local"), workload=workload, output_dir=tmp_path / "out", wait=False, watch=False)
    assert isinstance(run, Run)
    assert run.wait(timeout=60) is LaunchState.SUCCEEDED, run.logs()
    assert run.trials == [{"args": [], "plan_id": None}]


# --- independent_tasks against a real coordinator ---------------------------------------


@pytest.mark.service
def test_independent_tasks_plan_becomes_a_lease_job(coordinator: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLASHML_ALLOW_UNSANDBOXED_ARGV", "1")  # standard isolation needs the coordinator's opt-in
    monkeypatch.setenv("FLASHML_RUNTIME_API", "http://127.0.0.1:1")  # the argument wins over the environment
    plan = make_plan("independent_tasks", workers=3, gpus_per_worker=1)
    workload = CommandWorkload(command="python trial.py --lr {lr}", task_params=[{"lr": 0.1}, {"lr": 0.01}],
                               env={"SEED": "{lr}"})
    record = flash.run(plan, coordinator, workload=workload, image="ghcr.io/acme/train:1.2")

    assert isinstance(record, JobRecord)
    assert (record.state, record.backend) == (JobState.RUNNING, "leases")
    assert record.spec.metadata.name == "plan-00aa11bb22cc33dd"
    resources = record.spec.spec.resources
    assert (resources.gpuPerTask, resources.minimumWorkers, resources.maximumWorkers) == (1, 1, 3)
    assert _get(f"{coordinator}/v1alpha1/jobs/{record.job_id}")["job_id"] == record.job_id

    tasks = _get(f"{coordinator}/v1alpha1/jobs/{record.job_id}/tasks")
    assert [(t["task_id"], t["state"]) for t in tasks] == [("task-000", "PENDING"), ("task-001", "PENDING")]

    registration = {"node_id": "node-a", "kubernetes_node": "", "hostname": "node-a.local", "argv_capable": True,
                    "capabilities": {"cpu_cores": 2, "gpus": [{"index": 0}], "pools": []}}
    assert _post(f"{coordinator}/v1alpha1/nodes/register", registration)[0] == 200
    payloads = []
    for _ in tasks:
        status, lease = _post(f"{coordinator}/v1alpha1/leases/claim", {"node_id": "node-a", "job_id": record.job_id})
        assert status == 200
        payloads.append(lease["payload"])
    payloads.sort(key=lambda p: p["task_id"])
    assert [p["argv"] for p in payloads] == [["python", "trial.py", "--lr", "0.1"],
                                             ["python", "trial.py", "--lr", "0.01"]]
    assert [p["env"] for p in payloads] == [{"SEED": "0.1"}, {"SEED": "0.01"}]
    assert {(p["image"], p["gpus"], p["isolation"]["tier"]) for p in payloads} == {
        ("ghcr.io/acme/train:1.2", 1, "standard")}


@pytest.mark.service
def test_independent_tasks_reads_the_url_from_the_environment(coordinator: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLASHML_ALLOW_UNSANDBOXED_ARGV", "1")
    monkeypatch.setenv("FLASHML_RUNTIME_API", coordinator + "/")
    record = flash.run(make_plan("independent_tasks"), command="python eval.py", image="acme/eval:3", name="evals")
    assert isinstance(record, JobRecord) and record.spec.metadata.name == "evals"
    assert [t["task_id"] for t in _get(f"{coordinator}/v1alpha1/jobs/{record.job_id}/tasks")] == ["task-000"]


@pytest.mark.service
def test_a_refused_job_is_a_runtime_error_with_the_coordinators_detail(
        coordinator: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLASHML_ALLOW_UNSANDBOXED_ARGV", raising=False)  # standard tier is refused: 422
    with pytest.raises(RuntimeError, match=r"/v1alpha1/jobs -> 422: .*FLASHML_ALLOW_UNSANDBOXED_ARGV=1"):
        flash.run(make_plan("independent_tasks"), coordinator, command="python t.py", image="acme/t:1")
    assert _get(f"{coordinator}/v1alpha1/jobs") == []


def test_an_unreachable_coordinator_is_named() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # bound once and released: nothing listens
    with pytest.raises(CoordinatorUnavailable, match=rf"coordinator at {url} is unreachable"):
        flash.run(make_plan("independent_tasks"), url, command="python t.py", image="acme/t:1")


def test_headers_are_sent_with_the_job() -> None:
    seen: list[tuple[Any, dict[str, Any]]] = []  # (case-insensitive headers, body)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.headers, body))
            record = JobRecord(job_id="0123456789ab", spec=JobSpec.model_validate(body), backend="leases")
            raw = record.model_dump_json().encode()
            self.send_response(201)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        record = flash.run(make_plan("independent_tasks"), url, command="python t.py", image="acme/t:1",
                           headers={"Authorization": "Bearer op-token", "X-Extra": "1"})
    finally:
        server.shutdown()
        server.server_close()
    assert isinstance(record, JobRecord) and record.job_id == "0123456789ab"
    (headers, body), = seen
    assert headers["Authorization"] == "Bearer op-token" and headers["X-Extra"] == "1"
    assert body["spec"]["workload"]["parameters"]["command"] == ["python", "t.py"]


# --- coordinated_training under torchrun --------------------------------------------------


@pytest.mark.torch
@pytest.mark.slow
def test_coordinated_plan_runs_gloo_ranks_under_torchrun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    # torchrun is resolved on PATH; the one installed beside this interpreter comes first.
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    script = _script(tmp_path, GLOO_RANKS)
    plan = make_plan("coordinated_training", strategy_family="ddp", launcher="torchrun", workers=2, colocated=True)
    workload = CommandWorkload(command=["python", str(script)], source=Source(path=str(script.parent)),
                               env={"OMP_NUM_THREADS": "1"})
    run = flash.run(plan, workload=workload, output_dir=tmp_path / "out", watch=False)
    assert isinstance(run, Run)
    assert run.state is LaunchState.SUCCEEDED, run.logs()
    assert run.workload.command[:2] == ["torchrun", "--nproc-per-node=2"]
    assert run.trials == [{"world_size": 2, "sum": 3.0, "plan_id": "pl_00aa11bb22cc33dd", "family": "ddp"}]
