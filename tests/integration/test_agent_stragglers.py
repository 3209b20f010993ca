"""A worker agent's straggler watch: a 2-rank gloo DDP job whose rank 1 does twice its
peer's work is reported to the coordinator with the lease's heartbeat, and recorded as a
``STRAGGLER_DETECTED`` event of the job and against the node; the same job at one pace
reports none."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests._support import REPO_ROOT
from tests.integration.test_straggler_ddp import SCRIPT, STEPS, _torchrun
from tests.service_server import CoordinatorProcess, process_env, stop_process

pytestmark = [pytest.mark.torch, pytest.mark.service, pytest.mark.slow]
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")


def _job(script: Path, slowdown: float) -> dict[str, Any]:
    command = [*_torchrun(), "--nproc-per-node=2", "--standalone", "--local-addr=127.0.0.1", str(script),
               str(slowdown), str(STEPS)]
    return {"apiVersion": "flashml.dev/v1alpha1", "kind": "Job", "metadata": {"name": f"pace-{int(slowdown)}"},
            "spec": {"workload": {"type": "command", "parameters": {"command": command, "env": {
                "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}}},
                # The trusted runner takes the team pool's sandboxed-tier commands through its waiver.
                "isolation": {"tier": "sandboxed", "allowFallback": True}, "placement": {"pool": "team-a"},
                "retryPolicy": {"maxTaskAttempts": 1}}}


def test_a_slow_rank_on_a_worker_is_recorded_against_the_job_and_the_node(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    # The job's result, which a worker needs to call it done.
    script.write_text(SCRIPT.replace('ft.log_metrics({"step": step, "loss": loss.item()})',
                                     'ft.log_metrics({"step": step, "loss": loss.item()})\n'
                                     f'    if step == {STEPS} and ft.is_main():\n'
                                     '        import json, os\n'
                                     '        json.dump({"loss": loss.item()}, open(os.path.join('
                                     'os.environ["FLASHML_OUTPUT_DIR"], "metrics.json"), "w"))'))
    coordinator = CoordinatorProcess(tmp_path / "data").start()
    worker = None
    try:
        with httpx.Client(base_url=coordinator.url, timeout=30) as api:
            slow = api.post("/v1alpha1/jobs", json=_job(script, 2.0)).json()["job_id"]
            even = api.post("/v1alpha1/jobs", json=_job(script, 1.0)).json()["job_id"]
            worker = subprocess.Popen(
                [sys.executable, "-m", "flashruntime.cli", "--api", coordinator.url, "worker", "--work-dir",
                 str(tmp_path / "work"), "--runner", "trusted", "--pools", "team-a", "--node-id", "box-1",
                 "--poll-seconds", "0.2", "--max-tasks", "2"],
                env=process_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            deadline = time.monotonic() + 300
            while any(api.get(f"/v1alpha1/jobs/{job}").json()["state"] in ("RUNNING", "PENDING") for job in (slow, even)):
                if time.monotonic() > deadline or worker.poll() is not None:
                    pytest.fail(f"the jobs did not end\nworker: {stop_process(worker)}")
                time.sleep(0.2)
            states = [api.get(f"/v1alpha1/jobs/{job}").json()["state"] for job in (slow, even)]
            found = [event for event in api.get(f"/v1alpha1/jobs/{slow}/events").json()
                     if event["type"] == "STRAGGLER_DETECTED"]
            none = [event for event in api.get(f"/v1alpha1/jobs/{even}/events").json()
                    if event["type"] == "STRAGGLER_DETECTED"]
        log = stop_process(worker)
        assert states == ["SUCCEEDED", "SUCCEEDED"], log
        assert found and not none, (found, none, log)
        assert {event["data"]["rank"] for event in found} == {1}
        assert all(event["data"]["node_id"] == "box-1" and event["data"]["ratio"] >= 1.5 for event in found)
        assert "on node box-1: rank 1" in found[0]["message"] and "is a straggler" in found[0]["message"]
        assert "is a straggler" in log  # the worker says so in its own log too
    finally:
        if worker is not None and worker.poll() is None:
            stop_process(worker)
        coordinator.stop()


def test_the_node_s_record_holds_its_stragglers(tmp_path: Path) -> None:
    """The same report, straight to a coordinator in this process: recorded node-scoped too."""
    from datetime import datetime, timedelta, timezone

    from flashruntime.coordinator.core import Coordinator
    from flashruntime.protocol.v1alpha1 import EventType, Lease, StragglerReport
    from tests.service_server import settings_for

    coordinator = Coordinator(settings_for(tmp_path / "data"))
    try:
        lease = Lease(lease_id="ls-1", job_id="job-1", task_id="task-000", node_id="box-1", payload={},
                      attempt_number=1, deadline=datetime.now(timezone.utc) + timedelta(minutes=1))
        coordinator.record_stragglers(lease, [StragglerReport(rank=1, host="box-1", step=12, ratio=2.1, median_s=0.1,
                                                              others_s=0.048)])
        (job_event,) = coordinator.ledger.events_for("job-1")
        (node_event,) = [e for e in coordinator.ledger.events_for("") if e.type is EventType.STRAGGLER_DETECTED]
        assert job_event.type is EventType.STRAGGLER_DETECTED and job_event.data["step"] == 12
        assert node_event.data["node_id"] == "box-1" and node_event.data["job_id"] == "job-1"
        assert node_event.message == job_event.message == (
            "ls-1 on node box-1: rank 1 on box-1 is a straggler: it computes 2.1x as long as the other ranks' median "
            "(0.100 s against 0.048 s per step at step 12); every all-reduce waits for it")
    finally:
        coordinator.close()
