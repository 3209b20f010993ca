"""A node's pools and unsandboxed runner are what its credential was granted, over HTTP:
a real coordinator with tokens on 127.0.0.1. A token that states a team pool (and the
unsandboxed runner) it was not granted is stored without them and never gets the pool's
command task, whose environment holds the team's secret; the node granted the pool does."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.service_server import serve_in_thread, settings_for

pytestmark = [pytest.mark.service]
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

TOKENS = {
    "FLASHML_NODE_TOKENS": "intruder:tok-intruder,fin-1:tok-fin",
    "FLASHML_SUBMITTER_TOKENS": "alice:tok-alice",
    "FLASHML_OPERATOR_TOKENS": "root:tok-root",
    "FLASHML_ARGV_SUBMITTERS": "alice",
    "FLASHML_NODE_POOLS": "fin-1:finance-team|ml",
    "FLASHML_UNSANDBOXED_NODES": "fin-1",
}
INTRUDER, FIN, ALICE, ROOT = ({"Authorization": f"Bearer {token}"}
                              for token in ("tok-intruder", "tok-fin", "tok-alice", "tok-root"))


def registration(node_id: str) -> dict[str, Any]:
    return {"node_id": node_id, "kubernetes_node": "", "hostname": node_id, "argv_capable": False,
            "unsandboxed_argv_capable": True, "capabilities": {"pools": ["finance-team"]}}


def finance_job() -> dict[str, Any]:
    return {
        "apiVersion": "flashml.dev/v1alpha1", "kind": "Job", "metadata": {"name": "ledger-close"},
        "spec": {
            "execution": {"backend": "leases"},
            "workload": {"type": "command", "parameters": {
                "command": [sys.executable, "-c", "print('closing')"], "env": {"API_KEY": "finance-secret"}}},
            "isolation": {"tier": "sandboxed", "allowFallback": True}, "placement": {"pool": "finance-team"},
            "retryPolicy": {"maxTaskAttempts": 1},
        },
    }


def test_a_pool_a_token_was_not_granted_is_stripped_and_never_placed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for name, value in TOKENS.items():
        monkeypatch.setenv(name, value)
    with serve_in_thread(settings_for(tmp_path / "data")) as url, httpx.Client(base_url=url, timeout=30) as api:
        job = api.post("/v1alpha1/jobs", json=finance_job(), headers=ALICE)
        assert job.status_code == 201, job.text

        with caplog.at_level(logging.WARNING, logger="flashruntime.service"):
            answer = api.post("/v1alpha1/nodes/register", json=registration("intruder"), headers=INTRUDER)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert (body["withheld_pools"], body["withheld_unsandboxed_argv"]) == (["finance-team"], True)
        assert "FLASHML_NODE_POOLS" in body["detail"] and "'intruder'" in body["detail"]
        assert any("intruder" in record.getMessage() and "finance-team" in record.getMessage()
                   for record in caplog.records)
        # Stating the pool again in a heartbeat does not add it either.
        beat = api.post("/v1alpha1/nodes/intruder/heartbeat", json={"node_id": "intruder", "pools": ["finance-team"]},
                        headers=INTRUDER)
        assert beat.status_code == 200, beat.text
        for _ in range(3):
            assert api.post("/v1alpha1/leases/claim", json={"node_id": "intruder"}, headers=INTRUDER).status_code == 204

        granted = api.post("/v1alpha1/nodes/register", json=registration("fin-1"), headers=FIN)
        assert granted.json() == {"node_id": "fin-1", "status": "registered"}
        nodes = {row["node_id"]: row for row in api.get("/v1alpha1/nodes", headers=ROOT).json()}
        assert nodes["intruder"]["capabilities"]["pools"] == []
        assert nodes["fin-1"]["capabilities"]["pools"] == ["finance-team"]

        lease = api.post("/v1alpha1/leases/claim", json={"node_id": "fin-1"}, headers=FIN)
        assert lease.status_code == 200, lease.text
        assert lease.json()["node_id"] == "fin-1" and lease.json()["payload"]["env"] == {"API_KEY": "finance-secret"}
        tasks = api.get(f"/v1alpha1/jobs/{job.json()['job_id']}/tasks", headers=ALICE).json()
        assert [task["node_id"] for task in tasks] == ["fin-1"]


def test_a_node_token_with_no_grant_gets_no_pool_but_open_mode_keeps_what_nodes_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLASHML_NODE_TOKENS", "box:tok-box")
    monkeypatch.setenv("FLASHML_OPERATOR_TOKENS", "root:tok-root")
    with serve_in_thread(settings_for(tmp_path / "tokens")) as url, httpx.Client(base_url=url, timeout=30) as api:
        answer = api.post("/v1alpha1/nodes/register", json=registration("box"),
                          headers={"Authorization": "Bearer tok-box"}).json()
        assert answer["withheld_pools"] == ["finance-team"] and answer["withheld_unsandboxed_argv"] is True
        assert api.get("/v1alpha1/nodes", headers=ROOT).json()[0]["capabilities"]["pools"] == []
    for name in ("FLASHML_NODE_TOKENS", "FLASHML_OPERATOR_TOKENS"):
        monkeypatch.delenv(name)
    with serve_in_thread(settings_for(tmp_path / "open")) as url, httpx.Client(base_url=url, timeout=30) as api:
        assert api.post("/v1alpha1/nodes/register", json=registration("box")).json() == {
            "node_id": "box", "status": "registered"}
        assert api.get("/v1alpha1/nodes").json()[0]["capabilities"]["pools"] == ["finance-team"]


def test_a_join_code_grants_only_its_own_pools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLASHML_JOIN_CODE_POOLS", "ml")
    join = {"X-FlashML-Join-Code": "s3cret"}
    with serve_in_thread(settings_for(tmp_path / "data", join_code="s3cret")) as url, \
            httpx.Client(base_url=url, timeout=30) as api:
        stated = registration("edge-1")
        stated["capabilities"]["pools"] = ["ml", "finance-team"]
        answer = api.post("/v1alpha1/nodes/register", json=stated, headers=join).json()
        assert (answer["withheld_pools"], answer["withheld_unsandboxed_argv"]) == (["finance-team"], True)
        assert "FLASHML_JOIN_CODE_POOLS" in answer["detail"]
        assert api.get("/v1alpha1/nodes").json()[0]["capabilities"]["pools"] == ["ml"]


def test_a_node_stating_it_runs_containers_without_the_grant_gets_no_command_of_the_standard_tier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # argv_capable (a node running commands in containers of its own) is a claim too.
    for name, value in {**TOKENS, "FLASHML_ALLOW_UNSANDBOXED_ARGV": "1"}.items():
        monkeypatch.setenv(name, value)
    job = finance_job()
    job["spec"].pop("isolation")
    job["spec"].pop("placement")
    with serve_in_thread(settings_for(tmp_path / "data")) as url, httpx.Client(base_url=url, timeout=30) as api:
        assert api.post("/v1alpha1/jobs", json=job, headers=ALICE).status_code == 201
        stated = {**registration("intruder"), "argv_capable": True, "unsandboxed_argv_capable": False,
                  "capabilities": {"pools": []}}
        answer = api.post("/v1alpha1/nodes/register", json=stated, headers=INTRUDER).json()
        assert answer["withheld_unsandboxed_argv"] is True and "beyond the sandbox" in answer["detail"]
        assert api.get("/v1alpha1/nodes", headers=ROOT).json()[0]["argv_capable"] is False
        for _ in range(3):
            assert api.post("/v1alpha1/leases/claim", json={"node_id": "intruder"}, headers=INTRUDER).status_code == 204
        granted = {**stated, "node_id": "fin-1"}
        assert api.post("/v1alpha1/nodes/register", json=granted, headers=FIN).json()["status"] == "registered"
        lease = api.post("/v1alpha1/leases/claim", json={"node_id": "fin-1"}, headers=FIN)
        assert lease.status_code == 200 and lease.json()["payload"]["env"] == {"API_KEY": "finance-secret"}
