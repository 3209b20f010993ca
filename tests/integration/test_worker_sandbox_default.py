"""``flashruntime worker`` without ``--runner`` against a real coordinator: where bubblewrap
works it is the sandboxed runner, says so, and runs a sandboxed-tier command job placed on
it without any pool; the job reaches the network only when its isolation says so. A token
file that others may read stops the worker before it registers."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from flashruntime.agent.sandbox import probe_bwrap
from tests.service_server import process_env, run_worker, serve_in_thread, settings_for, stop_process

pytestmark = [pytest.mark.service, pytest.mark.slow]
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

BWRAP = probe_bwrap()
# Tries the coordinator's port; writes whether it got through.
PROBE = ("import json, os, socket, sys\n"
         "try:\n"
         "    socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=5).close(); reached = True\n"
         "except OSError as exc:\n"
         "    reached = type(exc).__name__\n"
         "json.dump(dict(reached=reached, home=os.environ['HOME']), "
         "open(os.path.join(os.environ['FLASHML_OUTPUT_DIR'], 'metrics.json'), 'w'))\n")


def probe_job(port: int, network: bool) -> dict[str, Any]:
    return {
        "apiVersion": "flashml.dev/v1alpha1", "kind": "Job", "metadata": {"name": "probe"},
        "spec": {
            "execution": {"backend": "leases"}, "image": {"repository": "local/probe", "tag": "1"},
            "workload": {"type": "command", "parameters": {"command": [sys.executable, "-c", PROBE, str(port)]}},
            "isolation": {"tier": "sandboxed", "network": network},
            "retryPolicy": {"maxTaskAttempts": 1},
        },
    }


def wait_terminal(api: Any, job_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while (job := api.get(f"/v1alpha1/jobs/{job_id}").json())["state"] in ("RUNNING", "PENDING"):
        assert time.monotonic() < deadline, job
        time.sleep(0.1)
    return job


@pytest.mark.skipif(not BWRAP.works, reason=f"bubblewrap does not work here: {BWRAP.reason}")
def test_the_default_runner_is_the_sandbox_which_runs_sandboxed_commands_without_a_pool(tmp_path: Path) -> None:
    with serve_in_thread(settings_for(tmp_path / "data")) as url, httpx.Client(base_url=url, timeout=30) as api:
        port = int(url.rsplit(":", 1)[1])
        closed = api.post("/v1alpha1/jobs", json=probe_job(port, network=False)).json()["job_id"]
        opened = api.post("/v1alpha1/jobs", json=probe_job(port, network=True)).json()["job_id"]
        code, log = run_worker(url, tmp_path / "work", "--node-id", "box-1", max_tasks=2)
        assert code == 0, log
        assert "runner sandboxed: the default where bubblewrap works" in log
        assert "tasks run in the bubblewrap sandbox" in log
        results = {}
        for job_id in (closed, opened):
            assert wait_terminal(api, job_id)["state"] == "SUCCEEDED", log
            results[job_id] = api.get(f"/v1alpha1/artifacts/jobs/{job_id}/task-000/metrics.json").json()
        assert results[closed]["reached"] == "ConnectionRefusedError"  # its own network namespace
        assert results[opened]["reached"] is True  # isolation.network: true
        assert results[closed]["home"].startswith(str((tmp_path / "work").resolve()))


def test_a_token_file_others_can_read_stops_the_worker_before_it_registers(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("tok-box\n")
    token.chmod(0o644)
    with serve_in_thread(settings_for(tmp_path / "data")) as url, httpx.Client(base_url=url, timeout=30) as api:
        code, log = run_worker(url, tmp_path / "work", "--token-file", str(token), max_tasks=1, timeout=120)
        assert code == 2, log
        assert f"--token-file {str(token)!r} has mode 0644" in log and f"chmod 600 {token}" in log
        assert api.get("/v1alpha1/nodes").json() == []  # it never registered


def test_a_token_on_the_command_line_is_taken_with_a_warning(tmp_path: Path) -> None:
    with serve_in_thread(settings_for(tmp_path / "data")) as url:
        worker = subprocess.Popen(
            [sys.executable, "-m", "flashruntime.cli", "--api", url, "worker", "--work-dir", str(tmp_path / "w"),
             "--token", "tok-box", "--runner", "subprocess", "--poll-seconds", "0.1"],
            env=process_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 60  # a hang guard: it holds its work directory's lock once started
        while time.monotonic() < deadline and not (tmp_path / "w" / ".flashruntime-worker" / "lock").exists():
            time.sleep(0.1)
        log = stop_process(worker)
    assert "--token puts the node token in the process list" in log and "--token-file PATH" in log
    assert "tok-box" not in log  # the warning never repeats the token
