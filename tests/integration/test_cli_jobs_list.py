"""``flashruntime jobs`` against a real coordinator: the jobs a token may see, newest first,
in short aligned columns, filtered by state and owner, and as JSON for scripts."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.service_server import CoordinatorProcess, process_env

pytestmark = [pytest.mark.service]
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

ALICE, BOB, ROOT = secrets.token_hex(16), secrets.token_hex(16), secrets.token_hex(16)
ENV = {"FLASHML_NODE_TOKENS": f"box-1:{secrets.token_hex(16)}",
       "FLASHML_SUBMITTER_TOKENS": f"alice:{ALICE},bob:{BOB}", "FLASHML_OPERATOR_TOKENS": f"root:{ROOT}"}


def _sweep(name: str, trials: int) -> dict[str, Any]:
    return {"apiVersion": "flashml.dev/v1alpha1", "kind": "Job", "metadata": {"name": name},
            "spec": {"workload": {"type": "hyperparameter_search",
                                  "parameters": {"trials": [{"C": float(c)} for c in range(1, trials + 1)]}}}}


def _jobs(url: str, token: str, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flashruntime.cli", "jobs", "--api", url, "--token", token, *options],
                          env=process_env(), capture_output=True, text=True, timeout=120, check=False)


def test_jobs_lists_what_the_token_may_see_newest_first(tmp_path: Path) -> None:
    coordinator = CoordinatorProcess(tmp_path / "data", env=ENV).start()
    try:
        with httpx.Client(base_url=coordinator.url, timeout=30) as api:
            ids = {}
            for name, token, trials in (("alice-first", ALICE, 3), ("bob-only", BOB, 1), ("alice-second", ALICE, 2)):
                answer = api.post("/v1alpha1/jobs", json=_sweep(name, trials),
                                  headers={"Authorization": f"Bearer {token}"})
                assert answer.status_code == 201, answer.text
                ids[name] = answer.json()["job_id"]
            cancelled = api.post(f"/v1alpha1/jobs/{ids['alice-first']}/cancel",
                                 headers={"Authorization": f"Bearer {ALICE}"})
            assert cancelled.status_code == 200, cancelled.text

        mine = _jobs(coordinator.url, ALICE)
        assert mine.returncode == 0, mine.stderr
        lines = mine.stdout.splitlines()
        assert lines[0].split() == ["JOB", "NAME", "STATE", "OWNER", "TASKS", "AGE"]
        rows = [line.split() for line in lines[1:]]
        assert [row[:5] for row in rows] == [  # newest first; bob's job is not alice's to see
            [ids["alice-second"], "alice-second", "RUNNING", "alice", "0/2"],
            [ids["alice-first"], "alice-first", "CANCELLED", "alice", "0/3"],
        ]
        assert all(row[5].endswith(("s", "m")) for row in rows)
        column = lines[0].index("STATE")  # aligned: every row's state starts under its header
        assert [line[column:].split()[0] for line in lines[1:]] == ["RUNNING", "CANCELLED"]

        everyone = _jobs(coordinator.url, ROOT, "--state", "running", "--owner", "bob")
        assert [line.split()[:4] for line in everyone.stdout.splitlines()[1:]] == [
            [ids["bob-only"], "bob-only", "RUNNING", "bob"]]
        assert _jobs(coordinator.url, ALICE, "--state", "succeeded").stdout.startswith("no jobs in state succeeded")

        scripted = _jobs(coordinator.url, ROOT, "--json", "--limit", "2")
        records = json.loads(scripted.stdout)
        assert [record["job_id"] for record in records] == [ids["alice-second"], ids["bob-only"]]
        assert records[0]["spec"]["metadata"]["name"] == "alice-second"
    finally:
        coordinator.stop()
