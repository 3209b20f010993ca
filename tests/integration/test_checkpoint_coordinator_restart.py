"""A coordinator killed with SIGKILL keeps both committed manifests and registered
parts in its SQLite file: the restarted catalog finishes the commit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from flashruntime.checkpoint import CheckpointCatalog, SqliteManifestStore
from flashruntime.protocol.v1alpha1 import CheckpointPart, CheckpointValidation

REPO_ROOT = Path(__file__).resolve().parents[2]

COORDINATOR = textwrap.dedent(
    """
    import sys, time
    from flashruntime.checkpoint import CheckpointCatalog, SqliteManifestStore
    from flashruntime.protocol.v1alpha1 import CheckpointPart

    catalog = CheckpointCatalog(store=SqliteManifestStore(sys.argv[1]))
    scope = "job-1::task-000"
    for step in (10, 20):
        part = CheckpointPart(key="model.pt", sha256=f"{step:064x}", size_bytes=step)
        catalog.register_part(scope, "a0", step, part)
        manifest = catalog.commit(job_id=scope, attempt_id="a0", step=step, expected_parts=[part],
                                  storage_prefix=f"s3://bucket/{step}", world_size=2)
        if step == 10:
            catalog.mark_restore_verified(manifest.manifest_id)
    # step 30: one of two parts uploaded when the coordinator dies
    catalog.register_part(scope, "a0", 30, CheckpointPart(key="model.pt", sha256="3" * 64, size_bytes=30))
    print("ready", flush=True)
    time.sleep(600)
    """
)


def test_sigkilled_coordinator_keeps_manifests_and_parts(tmp_path: Path) -> None:
    db = tmp_path / "ledger" / "checkpoints.db"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    process = subprocess.Popen([sys.executable, "-c", COORDINATOR, str(db)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "ready"
        process.send_signal(signal.SIGKILL)
        assert process.wait(timeout=60) == -signal.SIGKILL
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=60)

    store = SqliteManifestStore(db)
    catalog = CheckpointCatalog(store=store)
    scope = "job-1::task-000"
    assert [m.step for m in store.all(scope)] == [10, 20]
    assert [m.validation for m in store.all(scope)] == [
        CheckpointValidation.RESTORE_VERIFIED,
        CheckpointValidation.HASH_VERIFIED,
    ]
    assert catalog.latest_valid(scope, world_size=2).step == 20
    assert catalog.latest_valid(scope, require_restore_verified=True).step == 10
    assert catalog.lost_work(scope, 27, world_size=2) == 7
    assert store.parts(scope, "a0", 30) == {"model.pt": ("3" * 64, 30)}

    optimizer = CheckpointPart(key="optimizer.pt", sha256="4" * 64, size_bytes=31)
    catalog.register_part(scope, "a0", 30, optimizer)
    committed = catalog.commit(
        job_id=scope,
        attempt_id="a0",
        step=30,
        expected_parts=[CheckpointPart(key="model.pt", sha256="3" * 64, size_bytes=30), optimizer],
        storage_prefix="s3://bucket/30",
        world_size=2,
    )
    assert catalog.latest_valid(scope, world_size=2).manifest_id == committed.manifest_id
    store.close()
