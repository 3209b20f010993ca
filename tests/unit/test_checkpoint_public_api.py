"""Public names of ``flashruntime.checkpoint`` and ``flashruntime.recovery``
and their import hygiene: core logic, stdlib + pydantic only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import flashruntime.checkpoint as checkpoint
import flashruntime.errors
import flashruntime.recovery as recovery
from flashruntime.checkpoint import catalog, local, sqlite_store, store
from flashruntime.recovery import budget, policy, signals, taxonomy, verdict

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_checkpoint_names_are_the_defining_objects() -> None:
    assert set(checkpoint.__all__) == {
        "MANIFEST_NAME",
        "open_part",
        "write_manifest",
        "verify_manifest",
        "latest_valid_manifest",
        "CheckpointCatalog",
        "CheckpointError",
        "ManifestStore",
        "InMemoryManifestStore",
        "SqliteManifestStore",
    }
    assert checkpoint.MANIFEST_NAME == local.MANIFEST_NAME == "manifest.json"
    for name in ("open_part", "write_manifest", "verify_manifest", "latest_valid_manifest"):
        assert getattr(checkpoint, name) is getattr(local, name)
    assert checkpoint.CheckpointCatalog is catalog.CheckpointCatalog
    assert checkpoint.CheckpointError is catalog.CheckpointError is flashruntime.errors.CheckpointError
    assert checkpoint.ManifestStore is store.ManifestStore
    assert checkpoint.InMemoryManifestStore is store.InMemoryManifestStore
    assert checkpoint.SqliteManifestStore is sqlite_store.SqliteManifestStore


def test_recovery_names_are_the_defining_objects() -> None:
    assert set(recovery.__all__) == {
        "POLICY_VERSION",
        "CORRELATED_THRESHOLD",
        "FailureSignals",
        "classify",
        "decide",
        "explain",
        "replay",
        "from_local_launch",
        "describe_launch",
        "AttemptVerdict",
        "judge_exit",
        "RestartBudget",
        "COORDINATED",
        "INDEPENDENT",
        "MODES",
    }
    assert recovery.RestartBudget is budget.RestartBudget
    for name in ("POLICY_VERSION", "CORRELATED_THRESHOLD", "FailureSignals", "classify"):
        assert getattr(recovery, name) is getattr(taxonomy, name)
    for name in ("decide", "explain", "replay", "COORDINATED", "INDEPENDENT", "MODES"):
        assert getattr(recovery, name) is getattr(policy, name)
    for name in ("from_local_launch", "describe_launch"):
        assert getattr(recovery, name) is getattr(signals, name)
    for name in ("AttemptVerdict", "judge_exit"):
        assert getattr(recovery, name) is getattr(verdict, name)


def test_core_logic_imports_no_heavy_modules() -> None:
    code = (
        "import json, sys\n"
        "import flashruntime.checkpoint, flashruntime.recovery\n"
        "heavy = ('torch', 'numpy', 'fastapi', 'uvicorn', 'httpx', 'sklearn', 'psutil', 'yaml')\n"
        "print(json.dumps(sorted(m for m in heavy if m in sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(out.stdout) == []
