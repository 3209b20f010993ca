"""Signed work end to end: a real coordinator with tokens, the real CLI and a real
``flashruntime worker --runner trusted --trusted-submitter-keys``. A key made with
``flashruntime keys generate`` signs a job sent by ``flashruntime submit-spec --sign-key``,
and the worker that trusts the key runs it; the same job sent unsigned is failed by that
worker with its reason, and its command never runs."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.service_server import process_env, run_worker, serve_in_thread, settings_for

pytestmark = [pytest.mark.service, pytest.mark.slow]
pytest.importorskip("uvicorn")
pytest.importorskip("cryptography")
httpx = pytest.importorskip("httpx")

TOKENS = {
    "FLASHML_NODE_TOKENS": "box-1:tok-box",
    "FLASHML_SUBMITTER_TOKENS": "alice:tok-alice",
    "FLASHML_ARGV_SUBMITTERS": "alice",
    "FLASHML_NODE_POOLS": "box-1:team-7",
    "FLASHML_UNSANDBOXED_NODES": "box-1",
}
ALICE = {"Authorization": "Bearer tok-alice"}
PROGRAM = ("import json, os, pathlib, sys; pathlib.Path(sys.argv[1]).touch(); "
           "json.dump(dict(ok=1), open(os.path.join(os.environ['FLASHML_OUTPUT_DIR'], 'metrics.json'), 'w'))")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flashruntime.cli", *args], env=process_env(), capture_output=True,
                          text=True, timeout=120)


def spec_file(path: Path, marker: Path) -> Path:
    spec: dict[str, Any] = {
        "apiVersion": "flashml.dev/v1alpha1", "kind": "Job", "metadata": {"name": "nightly"},
        "spec": {"execution": {"backend": "leases"},
                 "workload": {"type": "command", "parameters": {
                     "command": [sys.executable, "-c", PROGRAM, "{marker}"], "task_params": [{"marker": str(marker)}]}},
                 "isolation": {"tier": "sandboxed", "allowFallback": True}, "placement": {"pool": "team-7"},
                 "retryPolicy": {"maxTaskAttempts": 1}},
    }
    path.write_text(json.dumps(spec))
    return path


def wait_terminal(api: Any, job_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60  # a hang guard only
    while (job := api.get(f"/v1alpha1/jobs/{job_id}", headers=ALICE).json())["state"] in ("RUNNING", "PENDING"):
        assert time.monotonic() < deadline, job
        time.sleep(0.1)
    return job


def test_a_job_signed_with_sign_key_runs_on_a_worker_that_trusts_the_key(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in TOKENS.items():
        monkeypatch.setenv(name, value)
    made = cli("keys", "generate", "--out", str(tmp_path / "keys"), "--name", "alice", "--json")
    assert made.returncode == 0, made.stderr
    keys = json.loads(made.stdout)
    with serve_in_thread(settings_for(tmp_path / "data")) as url, httpx.Client(base_url=url, timeout=30) as api:
        unsigned = cli("--api", url, "submit-spec", "--json", str(spec_file(tmp_path / "unsigned.json", tmp_path / "ran-unsigned")),
                       "--token", "tok-alice")
        assert unsigned.returncode == 0, unsigned.stderr
        code, log = run_worker(url, tmp_path / "work", "--token", "tok-box", "--node-id", "box-1", "--runner",
                               "trusted", "--pools", "team-7", "--trusted-submitter-keys", keys["public_key"],
                               max_tasks=1)
        assert code == 0, log
        refused = wait_terminal(api, json.loads(unsigned.stdout)["job_id"])
        assert refused["state"] == "FAILED", log
        reasons = " ".join(e["message"] for e in api.get(f"/v1alpha1/jobs/{refused['job_id']}/events",
                                                         headers=ALICE).json())
        assert "the command is not signed" in reasons
        assert not (tmp_path / "ran-unsigned").exists()

        signed = cli("--api", url, "submit-spec", "--json", str(spec_file(tmp_path / "signed.json", tmp_path / "ran-signed")),
                     "--sign-key", keys["private_key"], "--token", "tok-alice")
        assert signed.returncode == 0, signed.stderr
        code, log = run_worker(url, tmp_path / "work", "--token", "tok-box", "--node-id", "box-1", "--runner",
                               "trusted", "--pools", "team-7", "--trusted-submitter-keys", keys["public_key"],
                               max_tasks=1)
        assert code == 0, log
        assert wait_terminal(api, json.loads(signed.stdout)["job_id"])["state"] == "SUCCEEDED", log
        assert (tmp_path / "ran-signed").exists()


def test_submit_spec_says_what_is_wrong_with_a_sign_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.key"
    bad.write_text("not a key\n")
    answer = cli("--api", "http://127.0.0.1:9", "submit-spec", "--json", str(spec_file(tmp_path / "s.json", tmp_path / "m")),
                 "--sign-key", str(bad))
    assert answer.returncode == 1 and "--sign-key:" in answer.stderr and "flashruntime keys generate" in answer.stderr
