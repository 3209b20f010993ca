"""The Ray backend end to end through the installed command: ``flashruntime serve
--ray-address local`` (an embedded Ray), a 6-trial sweep submitted with ``submit-spec``, then
``status``, ``tasks``, ``artifacts`` and ``logs`` reading it back, exactly as for lease jobs."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.service_server import free_port, process_env, stop_process, wait_healthy

pytestmark = [pytest.mark.service, pytest.mark.ray, pytest.mark.slow]
pytest.importorskip("ray")
pytest.importorskip("uvicorn")

CONSOLE_SCRIPT = Path(sys.executable).with_name("flashruntime")
TRIAL = ("import json, os, sys; lr = float(sys.argv[1]); print('trial with lr', lr); "
         "open(os.path.join(os.environ['FLASHML_OUTPUT_DIR'], 'model.txt'), 'w').write(str(lr)); "
         "json.dump(dict(loss=(lr - 0.3) ** 2, lr=lr), open(os.path.join(os.environ['FLASHML_OUTPUT_DIR'], "
         "'metrics.json'), 'w'))")
RATES = [0.05, 0.1, 0.2, 0.3, 0.4, 0.5]


def flashruntime(url: str, *args: str) -> str:
    done = subprocess.run([str(CONSOLE_SCRIPT), *args, "--api", url], env=process_env(), capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def test_a_six_trial_sweep_on_ray_through_the_command(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [str(CONSOLE_SCRIPT), "serve", "--port", str(port), "--data-dir", str(tmp_path / "data"),
         "--ray-address", "local"],
        env=process_env(FLASHML_ALLOW_UNSANDBOXED_ARGV="1"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    try:
        wait_healthy(url, timeout_s=120, process=server)
        spec = {"metadata": {"name": "lr-sweep"}, "spec": {"workload": {"type": "command", "parameters": {
            "command": [sys.executable, "-c", TRIAL, "{lr}"], "task_params": [{"lr": lr} for lr in RATES]}}}}
        spec_file = tmp_path / "sweep.json"
        spec_file.write_text(json.dumps(spec))
        record: dict[str, Any] = json.loads(flashruntime(url, "submit-spec", "--json", str(spec_file)))
        job_id = record["job_id"]
        assert record["backend"] == "ray"  # the default of a coordinator with a Ray address

        deadline = time.monotonic() + 120  # a hang guard
        while (record := json.loads(flashruntime(url, "status", "--json", job_id)))["state"] == "RUNNING":
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert record["state"] == "SUCCEEDED", flashruntime(url, "events", job_id)

        events = json.loads(flashruntime(url, "events", "--json", job_id))
        accepted = [event["data"]["task_id"] for event in events if event["type"] == "TASK_COMMIT_ACCEPTED"]
        assert sorted(accepted) == [f"task-{i:03d}" for i in range(6)]  # every trial committed, once
        tasks = flashruntime(url, "tasks", job_id)
        assert tasks.count("COMPLETED") == 6 and "ray" in tasks
        listed = flashruntime(url, "artifacts", job_id)
        for i in range(6):
            for name in ("metrics.json", "model.txt", "task.log"):
                assert f"jobs/{job_id}/task-{i:03d}/{name}" in listed, listed
        logs = flashruntime(url, "logs", job_id)
        assert all(f"trial with lr {lr}" in logs for lr in RATES), logs
    finally:
        output = stop_process(server)
    assert "ray        local (the default backend)" in output
