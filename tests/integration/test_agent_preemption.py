"""A SIGTERM to a worker agent is a preemption notice for the task it runs: the ranks of a
2-rank ``flashruntime.torch`` job (torchrun, gloo) save the same step, the agent hands that
checkpoint to the coordinator and gives the lease back without spending the task's budget,
and another agent, with a work directory of its own, restores the step, resumes there, and
ends exactly where an uninterrupted run ends."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from flashruntime.launchers import LaunchState
from tests._support import REPO_ROOT, wait_until
from tests.integration.test_preemption import EVERY, PAUSE_AT, TOTAL, _source, _submit, _torchrun
from tests.service_server import CoordinatorProcess, process_env, stop_process

pytestmark = [pytest.mark.torch, pytest.mark.service, pytest.mark.slow]
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")


def _job(script: Path, go: Path) -> dict[str, Any]:
    command = [*_torchrun(), "--nproc-per-node=2", "--standalone", "--local-addr=127.0.0.1", str(script),
               str(TOTAL), str(PAUSE_AT), str(EVERY)]
    return {"apiVersion": "flashml.dev/v1alpha1", "kind": "Job", "metadata": {"name": "preempted-on-a-worker"},
            "spec": {"workload": {"type": "command", "parameters": {"command": command, "env": {
                "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1", "PREEMPT_GO": str(go)}}},
                # The trusted runner (the script file and this checkout are where the test left
                # them) takes a sandboxed-tier command through the team pool's waiver.
                "isolation": {"tier": "sandboxed", "allowFallback": True}, "placement": {"pool": "team-a"},
                "retryPolicy": {"maxTaskAttempts": 1}}}


def _worker(url: str, work: Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "flashruntime.cli", "--api", url, "worker", "--work-dir", str(work), "--runner",
         "trusted", "--pools", "team-a", "--poll-seconds", "0.2", "--max-tasks", "1"],
        env=process_env(**env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _one(work: Path, name: str) -> Path:
    found = sorted(work.rglob(name))
    assert len(found) == 1, (name, found)
    return found[0]


def _steps(out: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_preempted_worker_hands_its_checkpoint_over_and_another_worker_resumes_exactly(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    source = _source(tmp_path)
    straight = _submit(source, tmp_path / "straight")
    assert straight.state is LaunchState.SUCCEEDED, straight.logs()
    expected = json.loads((tmp_path / "straight" / "local" / "task-000" / "metrics.json").read_text())

    coordinator = CoordinatorProcess(tmp_path / "data").start()
    first = second = None
    try:
        with httpx.Client(base_url=coordinator.url, timeout=30) as api:
            answer = api.post("/v1alpha1/jobs", json=_job(source / "train.py", tmp_path / "go"))
            assert answer.status_code == 201, answer.text
            job_id = answer.json()["job_id"]

            first_work = tmp_path / "work-a"
            first = _worker(coordinator.url, first_work, FLASHML_PREEMPT_GRACE_S="120")
            wait_until(lambda: len(list(first_work.rglob("paused-*"))) == 2 or first.poll() is not None,
                       "both ranks at the pause", timeout=240)
            assert first.poll() is None, stop_process(first)
            first.send_signal(signal.SIGTERM)
            log = _one(first_work, "launcher.log")
            wait_until(lambda: "preemption notice: SIGTERM forwarded" in log.read_text(),
                       "the notice to be forwarded", timeout=60)
            (tmp_path / "go").touch()  # what the script's pause waits for
            first_output, _ = first.communicate(timeout=240)
            assert first.returncode == 0, first_output
            shipped = log.read_text()
            records = [json.loads(path.read_text()) for path in sorted(first_work.rglob("rank-*.preempted.json"))]
            saved = {record["step"] for record in records}
            assert len(records) == 2 and len(saved) == 1, (records, shipped)
            (saved_step,) = saved
            assert saved_step in (PAUSE_AT, PAUSE_AT + 1), shipped
            reached = max(_steps(log.parent / "out"))

            job = api.get(f"/v1alpha1/jobs/{job_id}").json()
            assert job["state"] in ("PENDING", "RUNNING"), job  # requeued, not failed
            events = api.get(f"/v1alpha1/jobs/{job_id}/events").json()
            (released,) = [event for event in events if event["type"] == "LEASE_RELEASED"]
            reason = released["message"]
            assert f"every rank (2) saved step {saved_step}" in reason and "within the 120 s grace" in reason, reason
            assert f"handed step {saved_step} (ck-" in reason and "to the coordinator" in reason, reason
            assert not [event for event in events if event["type"] in ("ATTEMPT_FAILED", "FAILURE_CLASSIFIED")]
            (task,) = api.get(f"/v1alpha1/jobs/{job_id}/tasks").json()
            latest = api.get(f"/v1alpha1/jobs/{job_id}/tasks/{task['task_id']}/checkpoints/latest").json()
            assert latest["step"] == saved_step and latest["world_size"] == 2, latest

            second_work = tmp_path / "work-b"
            second = _worker(coordinator.url, second_work)
            deadline = time.monotonic() + 240
            while (job := api.get(f"/v1alpha1/jobs/{job_id}").json())["state"] in ("RUNNING", "PENDING"):
                if time.monotonic() > deadline or second.poll() is not None:
                    pytest.fail(f"the job did not end: {job}\nworker: {stop_process(second)}")
                time.sleep(0.2)
            second_output = stop_process(second)
            assert job["state"] == "SUCCEEDED", (job, second_output)
            final = json.loads(api.get(f"/v1alpha1/artifacts/jobs/{job_id}/{task['task_id']}/metrics.json").content)

        resumed = _one(second_work, "launcher.log")
        assert f"restored step {saved_step} ({latest['manifest_id']}" in resumed.read_text(), resumed.read_text()
        steps = _steps(resumed.parent / "out")
        assert steps[0] == saved_step + 1 and steps[-1] == TOTAL, steps
        assert reached - saved_step <= 1  # steps the preemption lost
        # The budget is untouched: one attempt was allowed, and the second one ran.
        assert final["final_loss"] == pytest.approx(expected["final_loss"], abs=1e-6)
        assert final["weights"] == pytest.approx(expected["weights"], abs=1e-6)
    finally:
        for worker in (first, second):
            if worker is not None and worker.poll() is None:
                stop_process(worker)
        coordinator.stop()
