"""A task's checkpoint handed from one machine's ``FLASHML_CKPT_DIR`` to another's through a
real coordinator: parts uploaded, registered and committed; restored as a verified local
step; refused, leaving nothing behind, when what the coordinator holds is not what an agent
hands over or does not arrive as the catalog recorded it."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from flashruntime.agent.checkpoint_handoff import checkpoint_artifact_key, hand_over, restore
from flashruntime.checkpoint.local import latest_valid_manifest, open_part, write_manifest
from flashruntime.client import CoordinatorClient
from flashruntime.errors import CheckpointError
from flashruntime.protocol.v1alpha1 import Lease
from tests.integration.test_service_app import job_spec
from tests.service_server import serve_in_thread, settings_for

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")


@pytest.fixture
def coordinator(tmp_path: Path) -> Any:
    with serve_in_thread(settings_for(tmp_path / "data")) as url:
        yield url


def _lease(url: str, lease_id: str = "ls-a") -> Lease:
    job_id = httpx.post(f"{url}/v1alpha1/jobs", json=job_spec(trials=1)).json()["job_id"]
    return Lease(lease_id=lease_id, job_id=job_id, task_id="task-000", node_id="node-a", payload={},
                 attempt_number=1, deadline=datetime.now(timezone.utc) + timedelta(minutes=5))


def _step(root: Path, step: int, parts: dict[str, bytes]) -> None:
    directory = root / f"step-{step:06d}"
    directory.mkdir(parents=True)
    digests = {}
    for name, data in parts.items():
        with open_part(directory, name) as part:
            part.write(data)
        digests[name] = part.digest
    write_manifest(directory, job_id="job", attempt_id="ls-a", step=step, world_size=2, framework="torch-2",
                   digests=digests)


def test_the_newest_step_travels_and_is_restored_as_a_verified_local_step(coordinator: str, tmp_path: Path) -> None:
    client = CoordinatorClient(coordinator)
    lease = _lease(coordinator)
    here, there = tmp_path / "a" / "ckpt", tmp_path / "b" / "ckpt"
    _step(here, 10, {"model.pt": b"old" * 100})
    _step(here, 20, {"model.pt": b"m" * 5000, "resume.pt": b"r" * 300})

    handed = hand_over(client, lease, here)
    assert handed is not None and (handed.step, handed.parts, handed.size_bytes) == (20, 2, 5300)
    latest = client.latest_checkpoint(lease.job_id, lease.task_id)
    assert latest is not None and latest["manifest_id"] == handed.manifest_id
    assert (latest["step"], latest["world_size"], latest["framework"]) == (20, 2, "torch-2")
    assert sorted(part["key"] for part in latest["parts"]) == ["step-000020/model.pt", "step-000020/resume.pt"]

    restored = restore(client, lease, there)
    assert restored is not None and (restored.step, restored.manifest_id) == (20, handed.manifest_id)
    local = latest_valid_manifest(there)
    assert local is not None and (local.step, local.world_size) == (20, 2)
    assert local.storage_prefix == str(there / "step-000020")  # where it lies here, not where it was written
    assert (there / "step-000020" / "model.pt").read_bytes() == b"m" * 5000
    assert sorted(path.name for path in there.iterdir()) == ["step-000020"]  # no staging left behind

    assert restore(client, lease, there) is None  # this machine holds that step now
    _step(tmp_path / "c" / "ckpt", 30, {"model.pt": b"newer"})
    assert restore(client, lease, tmp_path / "c" / "ckpt") is None  # nor over a later one


def test_a_given_step_is_the_one_handed_over_and_none_when_it_never_verified(coordinator: str,
                                                                              tmp_path: Path) -> None:
    client = CoordinatorClient(coordinator)
    lease = _lease(coordinator)
    root = tmp_path / "ckpt"
    _step(root, 10, {"model.pt": b"ten"})
    _step(root, 20, {"model.pt": b"twenty"})
    handed = hand_over(client, lease, root, step=10)
    assert handed is not None and handed.step == 10
    (root / "step-000020" / "model.pt").write_bytes(b"torn")  # no longer what its manifest says
    assert hand_over(client, lease, root, step=20) is None
    assert hand_over(client, CoordinatorClient(coordinator), tmp_path / "empty") is None


def _commit(url: str, lease: Lease, keys: dict[str, bytes], prefix: str, step: int = 5) -> None:
    base = f"{url}/v1alpha1/jobs/{lease.job_id}/tasks/{lease.task_id}/checkpoints"
    parts = []
    for key, data in keys.items():
        part = {"key": key, "sha256": hashlib.sha256(data).hexdigest(), "size_bytes": len(data)}
        assert httpx.post(f"{base}/parts", json={"attempt_id": "ls-x", "step": step, "part": part}).status_code == 200
        parts.append(part)
    answer = httpx.post(f"{base}/commit", json={"attempt_id": "ls-x", "step": step, "expected_parts": parts,
                                                "storage_prefix": prefix, "world_size": 1})
    assert answer.status_code == 200, answer.text


@pytest.mark.parametrize(("keys", "prefix", "refusal"), [
    ({"step-000005/nested/model.pt": b"x"}, "step-000005/", "is not a plain file under"),
    ({"step-000005/manifest.json": b"{}"}, "step-000005/", "is not a plain file under"),
    ({"elsewhere/model.pt": b"x"}, "elsewhere/", "not where an agent hands a step over"),
    ({"step-000009/model.pt": b"x"}, "step-000009/", "not where an agent hands a step over"),  # not step 5's
])
def test_a_manifest_not_shaped_as_an_agent_hands_one_over_is_refused(coordinator: str, tmp_path: Path,
                                                                     keys: dict[str, bytes], prefix: str,
                                                                     refusal: str) -> None:
    lease = _lease(coordinator)
    _commit(coordinator, lease, keys, prefix)
    root = tmp_path / "ckpt"
    with pytest.raises(CheckpointError, match=refusal):
        restore(CoordinatorClient(coordinator), lease, root)
    assert not root.exists()


def test_a_part_that_does_not_arrive_as_recorded_leaves_nothing_behind(coordinator: str, tmp_path: Path) -> None:
    client = CoordinatorClient(coordinator)
    lease = _lease(coordinator)
    _commit(coordinator, lease, {"step-000005/model.pt": b"what was registered"}, "step-000005/")
    client.put_artifact(checkpoint_artifact_key(lease, "step-000005/model.pt"), b"other bytes in its place")
    root = tmp_path / "ckpt"
    _step(root, 2, {"model.pt": b"older"})
    with pytest.raises(CheckpointError, match="arrived as 24 bytes"):
        restore(client, lease, root)
    assert sorted(path.name for path in root.iterdir()) == ["step-000002"]
    assert latest_valid_manifest(root).step == 2  # type: ignore[union-attr]


def test_a_dcp_step_travels_with_its_index(coordinator: str, tmp_path: Path) -> None:
    client = CoordinatorClient(coordinator)
    lease = _lease(coordinator)
    _step(tmp_path / "a", 7, {".metadata": b"index", "__0_0.distcp": b"shard 0", "__1_0.distcp": b"shard 1"})
    handed = hand_over(client, lease, tmp_path / "a")
    assert handed is not None and handed.parts == 3
    assert restore(client, lease, tmp_path / "b") is not None
    local = latest_valid_manifest(tmp_path / "b")
    assert local is not None and sorted(part.key for part in local.parts) == [".metadata", "__0_0.distcp",
                                                                              "__1_0.distcp"]
    assert (tmp_path / "b" / "step-000007" / ".metadata").read_bytes() == b"index"
