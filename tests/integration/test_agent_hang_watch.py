"""A worker agent's hang watch: a task that stops making progress is caught, its stacks go
into its shipped log, the coordinator judges the attempt ``hang`` and runs the task again,
and the job succeeds."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from flashruntime.agent.sandbox import probe_bwrap
from tests.service_server import CoordinatorProcess, process_env, stop_process

pytestmark = [pytest.mark.service, pytest.mark.slow,
              pytest.mark.skipif(not probe_bwrap().works, reason="the worker's sandbox needs bubblewrap")]
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

# Steps to metrics.jsonl every 0.2 s; the first attempt (the task's checkpoint directory, which
# every attempt on the worker shares, has no marker yet) stops for good at step 3.
TASK = """
import json, os, sys, time
marker = os.path.join(os.environ["FLASHML_CKPT_DIR"], "ran-once")
first = not os.path.exists(marker)
open(marker, "a").close()
out = os.environ["FLASHML_OUTPUT_DIR"]
with open(os.path.join(out, "metrics.jsonl"), "a") as lines:
    for step in range(1, 6):
        lines.write(json.dumps({"step": step, "ts": time.time(), "loss": 1 / step}) + "\\n")
        lines.flush()
        time.sleep(0.2)
        if first and step == 3:
            print("stuck in step 3", flush=True)
            time.sleep(10 ** 6)
json.dump({"loss": 0.2}, open(os.path.join(out, "metrics.json"), "w"))
"""


def _job(argv: list[str]) -> dict[str, Any]:
    return {"apiVersion": "flashml.dev/v1alpha1", "kind": "Job", "metadata": {"name": "hangs-once"},
            "spec": {"workload": {"type": "command", "parameters": {"command": argv}},
                     "isolation": {"tier": "sandboxed"}, "retryPolicy": {"maxTaskAttempts": 2}}}


def test_a_task_that_hangs_on_a_worker_is_caught_judged_hang_and_run_again(tmp_path: Path) -> None:
    coordinator = CoordinatorProcess(tmp_path / "data").start()
    worker = None
    try:
        with httpx.Client(base_url=coordinator.url, timeout=30) as api:
            answer = api.post("/v1alpha1/jobs", json=_job([sys.executable, "-c", TASK]))
            assert answer.status_code == 201, answer.text
            job_id = answer.json()["job_id"]
            worker = subprocess.Popen(
                [sys.executable, "-m", "flashruntime.cli", "--api", coordinator.url, "worker", "--work-dir",
                 str(tmp_path / "work"), "--runner", "sandboxed", "--poll-seconds", "0.2", "--max-tasks", "2"],
                env=process_env(FLASHML_HANG_TIMEOUT_S="4"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True)
            deadline = time.monotonic() + 180
            while (job := api.get(f"/v1alpha1/jobs/{job_id}").json())["state"] in ("RUNNING", "PENDING"):
                if time.monotonic() > deadline or worker.poll() is not None:
                    pytest.fail(f"the job did not end: {job}\nworker: {stop_process(worker)}")
                time.sleep(0.2)
            events = api.get(f"/v1alpha1/jobs/{job_id}/events").json()
        log = stop_process(worker)
        assert job["state"] == "SUCCEEDED", (job, log)
        (judged,) = [event for event in events if event["type"] == "FAILURE_CLASSIFIED"]
        assert judged["data"]["failure_class"] == "hang" and judged["data"]["retried"] is True, judged
        assert "no progress for" in judged["data"]["evidence"] and "step 3" in judged["data"]["evidence"], judged
        (stacks,) = (tmp_path / "work").rglob("hang-stacks.txt")
        dumped = stacks.read_text()
        assert "<module> (<string>:14)" in dumped, dumped  # the task's own frame: its endless sleep
        shipped = stacks.parent.parent / "launcher.log"
        assert "stuck in step 3" in shipped.read_text() and dumped.strip() in shipped.read_text()
        assert "HANG_DETECTED" in log or "no progress" in log, log
    finally:
        if worker is not None and worker.poll() is None:
            stop_process(worker)
        coordinator.stop()
