"""A worker with trusted submitter keys against a malicious coordinator: a real HTTP server
on 127.0.0.1 that answers the worker's routes and hands out crafted leases, each stamped
with a code-execution grant the coordinator made up. The worker runs only the task a
trusted key signed, exactly as signed; the unsigned, the re-signed and the tampered ones are
failed with their reason, and none of their commands ever runs."""

from __future__ import annotations

import copy
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("cryptography")

from flashruntime.agent.worker import WorkerAgent, WorkerTiming
from flashruntime.protocol.v1alpha1 import JobSpec
from flashruntime.recipes.command import CommandRecipe
from flashruntime.signing import generate_key_pair, load_signing_key, sign_job_spec
from tests.worker_fake_coordinator import FakeCoordinator

FAST = WorkerTiming(node_heartbeat_s=0.2, term_grace_s=1.0, min_lease_heartbeat_s=0.2, sampler_period_s=0.2,
                    child_poll_s=0.05, max_backoff_s=0.2, finish_attempts=2)
# Touches the marker it is given and writes its metrics: a marker on disk means the command ran.
PROGRAM = ("import json, os, pathlib, sys; pathlib.Path(sys.argv[1]).touch(); "
           "json.dump(dict(ok=1), open(os.path.join(os.environ['FLASHML_OUTPUT_DIR'], 'metrics.json'), 'w'))")
# What the coordinator claims about every job: a submitter holding the code-execution permission.
FORGED_GRANT = {"role": "submitter", "name": "alice", "may_run_code": True}


@pytest.fixture
def coordinator() -> Iterator[FakeCoordinator]:
    fake = FakeCoordinator()
    fake.start()
    yield fake
    fake.stop()


def command_spec(marker: Path) -> dict[str, Any]:
    return {"apiVersion": "flashml.dev/v1alpha1", "kind": "Job", "metadata": {"name": "nightly"},
            "spec": {"workload": {"type": "command", "parameters": {
                "command": [sys.executable, "-c", PROGRAM, "{marker}"], "task_params": [{"marker": str(marker)}]}},
                "isolation": {"tier": "sandboxed", "allowFallback": True}, "placement": {"pool": "team-a"}}}


def lease_payload(spec: dict[str, Any]) -> dict[str, Any]:
    """The payload the coordinator's own recipe makes of ``spec``, with the forged grant."""
    payload = CommandRecipe().expand("job1", JobSpec.model_validate(spec))[0].payload
    return {**payload, "submitted_by": FORGED_GRANT}


def run_agent(agent: WorkerAgent, timeout: float = 60.0) -> int:
    watchdog = threading.Timer(timeout, agent.stop)  # a hang guard only
    watchdog.start()
    try:
        return agent.run()
    finally:
        watchdog.cancel()


def test_only_the_signed_command_runs_on_a_worker_that_trusts_its_key(coordinator: FakeCoordinator,
                                                                       tmp_path: Path) -> None:
    alice_key, alice_pub = generate_key_pair(tmp_path / "alice", "alice")
    alice = load_signing_key(alice_key)
    forger = load_signing_key(generate_key_pair(tmp_path / "forger", "alice")[0])
    markers = {name: tmp_path / f"ran-{name}" for name in ("unsigned", "resigned", "tampered", "signed")}

    unsigned = coordinator.add_lease(lease_payload(command_spec(markers["unsigned"])))
    resigned = coordinator.add_lease(lease_payload(sign_job_spec(command_spec(markers["resigned"]), forger)))
    tampered_payload = lease_payload(sign_job_spec(command_spec(markers["tampered"]), alice))
    tampered_payload = copy.deepcopy(tampered_payload)
    tampered_payload["argv"] = [sys.executable, "-c", PROGRAM, str(markers["unsigned"])]
    tampered = coordinator.add_lease(tampered_payload)
    signed = coordinator.add_lease(lease_payload(sign_job_spec(command_spec(markers["signed"]), alice)))

    agent = WorkerAgent(coordinator.url, token="tok-node", node_id="node-a", runner="trusted", max_tasks=4,
                        work_dir=tmp_path / "work", poll_seconds=0.05, timing=FAST, pools=["team-a"],
                        trusted_submitter_keys=alice_pub)
    assert run_agent(agent) == 0

    assert "the command is not signed" in coordinator.failed[unsigned]
    assert "which this worker does not trust" in coordinator.failed[resigned]
    assert "argv is not the signed command" in coordinator.failed[tampered]
    assert all(reason.startswith("refused to run the command: ") for reason in coordinator.failed.values())
    assert list(coordinator.completed) == [signed] and signed not in coordinator.failed
    assert [path.name for path in sorted(tmp_path.glob("ran-*"))] == ["ran-signed"]


def test_a_worker_refuses_to_start_with_keys_it_cannot_read(tmp_path: Path) -> None:
    bad = tmp_path / "keys.pub"
    bad.write_text("not a key\n")
    with pytest.raises(ValueError, match="keys.pub line 1: expected 'flashruntime-ed25519"):
        WorkerAgent("http://127.0.0.1:9", node_id="n", runner="trusted", trusted_submitter_keys=bad)
