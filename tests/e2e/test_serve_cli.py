"""``flashruntime serve`` as users start it, driven by the CLI's HTTP subcommands (SPEC §10)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.service_server import free_port, process_env, stop_process, wait_healthy

pytestmark = pytest.mark.service
pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

SPEC = {"apiVersion": "flashml.dev/v1alpha1", "kind": "Job", "metadata": {"name": "cli-sweep"},
        "spec": {"execution": {"backend": "leases"}, "image": {"repository": "local/tier1", "tag": "dev"},
                 "workload": {"type": "hyperparameter_search", "parameters": {"trials": [{"C": 1.0}, {"C": 0.1}]}}}}


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flashruntime.service.cli", *args], env=env, capture_output=True,
                          text=True, timeout=120, check=False)


def test_serve_then_submit_status_events_cancel_and_a_clean_stop(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = process_env(FLASHML_RUNTIME_API=url)
    server = subprocess.Popen([sys.executable, "-m", "flashruntime.service.cli", "serve", "--port", str(port),
                               "--data-dir", str(tmp_path / "data")], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        wait_healthy(url, process=server)
        spec_file = tmp_path / "job.json"
        spec_file.write_text(json.dumps(SPEC))
        submitted = _cli("submit-spec", str(spec_file), env=env)
        assert submitted.returncode == 0, submitted.stderr
        job = json.loads(submitted.stdout)
        assert job["state"] == "RUNNING" and job["backend"] == "leases"
        status = _cli("status", job["job_id"], env=env)
        assert status.returncode == 0 and json.loads(status.stdout)["job_id"] == job["job_id"]
        events = json.loads(_cli("events", job["job_id"], env=env).stdout)
        assert [e["type"] for e in events[:2]] == ["JOB_ACCEPTED", "BACKEND_SELECTED"]
        cancelled = _cli("cancel", job["job_id"], env=env)
        assert cancelled.returncode == 0 and json.loads(cancelled.stdout)["state"] == "CANCELLED"
        missing = _cli("status", "000000000000", env=env)
        assert missing.returncode == 1 and "404" in missing.stderr
        assert (tmp_path / "data" / "flashruntime.db").is_file() and (tmp_path / "data" / "leases.db").is_file()
        assert (tmp_path / "data" / "artifacts").is_dir()
    finally:
        out = stop_process(server)
    assert server.returncode == 0, out
    assert f"FlashRuntime coordinator on {url}" in out
    unreachable = _cli("status", job["job_id"], env=env)
    assert unreachable.returncode == 2
