"""Running commands on the fleet is a permission, end to end: a real coordinator with
tokens, real ``flashruntime worker --runner trusted`` processes.

A submitter without the code-execution permission gets 403 and nothing is stored, so no
worker can ever run the command; a submitter with it gets the job run. A worker that holds
a token refuses a command whose job carries no grant (here: an open coordinator, which
grants nothing), so a misconfigured coordinator cannot turn the fleet into remote shells.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

from flashruntime.agent.state import STATE_DIR

from tests.service_server import run_worker, serve_in_thread, settings_for

pytestmark = [pytest.mark.service, pytest.mark.slow]
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

TOKENS = {
    "FLASHML_NODE_TOKENS": "box-1:tok-box",
    "FLASHML_SUBMITTER_TOKENS": "alice:tok-alice,bob:tok-bob",
    "FLASHML_OPERATOR_TOKENS": "root:tok-root",
    "FLASHML_ARGV_SUBMITTERS": "alice",
    "FLASHML_NODE_POOLS": "box-1:team-7",
    "FLASHML_UNSANDBOXED_NODES": "box-1",
}
ALICE, BOB, ROOT = ({"Authorization": f"Bearer {token}"} for token in ("tok-alice", "tok-bob", "tok-root"))
# Leaves a marker beside its metrics, so a test can tell whether it ever ran anywhere.
PROGRAM = ("import json, os, pathlib, sys; out = os.environ['FLASHML_OUTPUT_DIR']; "
           "pathlib.Path(sys.argv[2]).touch(); json.dump(dict(lr=float(sys.argv[1])), "
           "open(os.path.join(out, 'metrics.json'), 'w'))")


def command_job(marker: Path, *lrs: float) -> dict[str, Any]:
    return {
        "apiVersion": "flashml.dev/v1alpha1", "kind": "Job", "metadata": {"name": "lr-sweep"},
        "spec": {
            "execution": {"backend": "leases"}, "image": {"repository": "local/train", "tag": "1"},
            "workload": {"type": "command", "parameters": {
                "command": [sys.executable, "-c", PROGRAM, "{lr}", str(marker) + "-{lr}"],
                "task_params": [{"lr": lr} for lr in lrs]}},
            "isolation": {"tier": "sandboxed", "allowFallback": True}, "placement": {"pool": "team-7"},
            "retryPolicy": {"maxTaskAttempts": 1},
        },
    }


def _wait_terminal(api: Any, job_id: str, headers: dict[str, str]) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while (job := api.get(f"/v1alpha1/jobs/{job_id}", headers=headers).json())["state"] in ("RUNNING", "PENDING"):
        assert time.monotonic() < deadline, job
        time.sleep(0.1)
    return job


def test_a_command_job_needs_the_permission_and_runs_with_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in TOKENS.items():
        monkeypatch.setenv(name, value)
    marker = tmp_path / "ran"
    with serve_in_thread(settings_for(tmp_path / "data")) as url, httpx.Client(base_url=url, timeout=30) as api:
        refused = api.post("/v1alpha1/jobs", json=command_job(marker, 0.5), headers=BOB)
        assert refused.status_code == 403, refused.text
        assert "FLASHML_ARGV_SUBMITTERS" in refused.json()["detail"] and "'bob'" in refused.json()["detail"]
        assert api.get("/v1alpha1/jobs", headers=ROOT).json() == []  # nothing stored: nothing to run, ever

        accepted = api.post("/v1alpha1/jobs", json=command_job(marker, 0.1, 0.01), headers=ALICE)
        assert accepted.status_code == 201, accepted.text
        job_id = accepted.json()["job_id"]
        assert accepted.json()["submitted_by"] == {"role": "submitter", "name": "alice"}
        code, log = run_worker(url, tmp_path / "work", "--token", "tok-box", "--runner", "trusted",
                               "--pools", "team-7", max_tasks=2)
        assert code == 0, log
        assert _wait_terminal(api, job_id, ALICE)["state"] == "SUCCEEDED", log
        assert sorted(path.name for path in tmp_path.glob("ran-*")) == ["ran-0.01", "ran-0.1"]
        ran = [path.name for path in (tmp_path / "work").iterdir() if path.name != STATE_DIR]
        assert ran == [job_id]  # only alice's job ever ran


def test_a_worker_with_a_token_refuses_a_command_nobody_was_granted(tmp_path: Path) -> None:
    """An open coordinator (no tokens) takes command jobs from anyone; a worker started with a
    token believes its fleet is protected, so it fails such a lease instead of running it."""
    marker = tmp_path / "ran"
    with serve_in_thread(settings_for(tmp_path / "data")) as url, httpx.Client(base_url=url, timeout=30) as api:
        job_id = api.post("/v1alpha1/jobs", json=command_job(marker, 0.5)).json()["job_id"]
        code, log = run_worker(url, tmp_path / "work", "--token", "tok-box", "--node-id", "box-1",
                               "--runner", "trusted", "--pools", "team-7", max_tasks=1)
        assert code == 0, log
        job = _wait_terminal(api, job_id, {})
        assert job["state"] == "FAILED", log
        reasons = " ".join(event["message"] for event in api.get(f"/v1alpha1/jobs/{job_id}/events").json())
        assert "refused to run the command" in reasons and "open mode" in reasons
        assert not list(tmp_path.glob("ran-*"))  # the command never ran

        # The same job and a worker without a token (open mode end to end, for development): it runs.
        again = api.post("/v1alpha1/jobs", json=command_job(marker, 0.25)).json()["job_id"]
        code, log = run_worker(url, tmp_path / "work", "--node-id", "box-2", "--runner", "trusted",
                               "--pools", "team-7", max_tasks=1)
        assert code == 0, log
        assert _wait_terminal(api, again, {})["state"] == "SUCCEEDED", log
        assert [path.name for path in tmp_path.glob("ran-*")] == ["ran-0.25"]
