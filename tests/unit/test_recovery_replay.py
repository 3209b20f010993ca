"""``replay`` is byte-identical across processes: two fresh interpreters
with different hash seeds print the same JSON and ``explain`` lines as this one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from flashruntime.recovery import FailureSignals, explain, replay

REPO_ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, sys
from flashruntime.recovery import FailureSignals, explain, replay
signals = [FailureSignals(**fields) for fields in json.loads(sys.argv[1])]
for mode in ("independent_tasks", "coordinated_training"):
    decisions = replay(signals, mode)
    sys.stdout.write("[" + ",".join(d.model_dump_json() for d in decisions) + "]\n")
    for decision in decisions:
        sys.stdout.write(explain(decision) + "\n")
"""

CASES = [
    {"exit_code": 1, "exit_deterministic": True},
    {"heartbeat_lost": True, "message": "node n-3 silent"},
    {"xid_event": True, "message": "Xid 79: GPU has fallen off the bus"},
    {"exit_code": -9},
    {"message": "NCCL watchdog timeout — rank 2 ✗"},
    {"storage_errors": 4, "message": "S3 SlowDown"},
    {"hash_mismatch": True},
    {"preemption_notice": True},
    {"concurrent_failures": 3},
    {"control_plane_unreachable": True},
    {},
]


def _run(seed: str) -> bytes:
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(CASES)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        timeout=120,
        check=True,
    )
    return result.stdout


def test_replay_is_byte_identical_across_processes() -> None:
    first = _run("1")
    second = _run("4242")
    assert first == second
    lines = first.decode("utf-8").splitlines()
    assert len(lines) == 2 * (1 + len(CASES))

    signals = [FailureSignals(**fields) for fields in CASES]
    here = []
    for mode in ("independent_tasks", "coordinated_training"):
        decisions = replay(signals, mode)
        here.append("[" + ",".join(d.model_dump_json() for d in decisions) + "]")
        here.extend(explain(d) for d in decisions)
    assert lines == here
    parsed = json.loads(lines[0])
    assert [d["evidence"]["index"] for d in parsed] == list(range(len(CASES)))
    assert {d["decided_at"] for d in parsed} == {"1970-01-01T00:00:00Z"}
