"""A task's checkpoint carried from one machine to the next through the coordinator.

A task's ``FLASHML_CKPT_DIR`` is this machine's. When an agent gives a lease back after a
preemption notice, it hands over the newest verified checkpoint there (``hand_over``): each
part is uploaded as an artifact under ``jobs/<job>/<task>/ckpt/step-<step>/``, registered in
the coordinator's checkpoint catalog with its sha256, and the step committed there. The
agent that leases the task next, on any machine, restores that step into its own
``FLASHML_CKPT_DIR`` before the task starts (``restore``), unless it already holds a verified
checkpoint at that step or later, so the task resumes where the last one saved.

The transfer is the agent's, with the agent's credential: the task never sees it. A restored
step is what ``flashruntime.checkpoint.local`` makes of a step written here: the parts,
checked against the sha256 the catalog recorded as they arrive, then ``manifest.json`` last.
Only flat checkpoints travel (parts that are files directly in the step's directory), which
is what ``flashruntime.torch`` (DCP's shards of a sharded model included) and the local
checkpoint helpers write.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flashruntime.checkpoint.local import (
    DCP_METADATA_NAME,
    MANIFEST_NAME,
    latest_valid_manifest,
    read_manifest,
    write_manifest,
)
from flashruntime.client import CoordinatorClient
from flashruntime.errors import CheckpointError
from flashruntime.protocol.v1alpha1 import CheckpointManifest, CheckpointPart, Lease

__all__ = ["CHECKPOINT_PREFIX", "Handed", "checkpoint_artifact_key", "hand_over", "restore"]

logger = logging.getLogger("flashruntime.worker")

CHECKPOINT_PREFIX = "ckpt/"  # under the task's jobs/<job>/<task>/ artifact prefix
_STEP_PREFIX = re.compile(r"step-(\d{6,})/")
_PART_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,254}")
_CHUNK = 1 << 20


def _plain_part(name: str) -> bool:
    """A file name directly in a step's directory, not its manifest (DCP's index included)."""
    return name != MANIFEST_NAME and (name == DCP_METADATA_NAME or _PART_NAME.fullmatch(name) is not None)


@dataclass(frozen=True)
class Handed:
    """A checkpoint that moved: its step, the catalog's manifest id, its parts and bytes."""

    step: int
    manifest_id: str
    parts: int
    size_bytes: int

    def describe(self) -> str:
        return f"step {self.step} ({self.manifest_id}, {self.parts} part(s), {self.size_bytes} bytes)"


def checkpoint_artifact_key(lease: Lease, relative: str) -> str:
    """The artifact key of ``relative`` (``step-<step>/<part>``) in the task's checkpoint location."""
    return f"jobs/{lease.job_id}/{lease.task_id}/{CHECKPOINT_PREFIX}{relative}"


def _step_prefix(step: int) -> str:
    return f"step-{step:06d}/"


def _step_dir(ckpt_root: Path, manifest: CheckpointManifest) -> Path | None:
    """The directory under ``ckpt_root`` that holds ``manifest`` (it may have been written elsewhere)."""
    for candidate in (ckpt_root / _step_prefix(manifest.step).rstrip("/"), *sorted(ckpt_root.glob("step-*"))):
        found = read_manifest(os.fspath(candidate / MANIFEST_NAME))
        if found is not None and found.manifest_id == manifest.manifest_id:
            return candidate
    return None


def hand_over(client: CoordinatorClient, lease: Lease, ckpt_root: Path, step: int | None = None) -> Handed | None:
    """Upload the newest verified checkpoint in ``ckpt_root`` (only step ``step``, when given)
    and commit it in the coordinator's catalog as this lease's; None when there is none to
    hand over. The lease must be live. A part that changes while it is uploaded, or a part
    that is not a plain file of the step's directory, raises ``CheckpointError``; the
    coordinator's refusals and unreachability raise as the client's errors."""
    pattern = "step-*" if step is None else _step_prefix(step).rstrip("/")
    manifest = latest_valid_manifest(ckpt_root, pattern=pattern)
    if manifest is None:
        return None
    step_dir = _step_dir(ckpt_root, manifest)
    if step_dir is None:
        raise CheckpointError(f"the manifest of step {manifest.step} is not in a step directory of {ckpt_root}")
    prefix = _step_prefix(manifest.step)
    parts: list[CheckpointPart] = []
    for part in manifest.parts:
        if not _plain_part(part.key):
            raise CheckpointError(f"step {manifest.step}: part {part.key!r} is not a plain file name of its step "
                                  "directory; only flat checkpoints are handed to the next machine")
        stored = client.put_artifact(checkpoint_artifact_key(lease, prefix + part.key), step_dir / part.key)
        if stored.get("sha256") not in (None, part.sha256):
            raise CheckpointError(f"step {manifest.step}: part {part.key!r} changed while it was uploaded "
                                  f"(manifest {part.sha256}, uploaded {stored.get('sha256')})")
        handed = CheckpointPart(key=prefix + part.key, sha256=part.sha256, size_bytes=part.size_bytes)
        client.register_checkpoint_part(lease.job_id, lease.task_id, {
            "attempt_id": lease.lease_id, "step": manifest.step, "part": handed.model_dump(mode="json")})
        parts.append(handed)
    committed = client.commit_checkpoint(lease.job_id, lease.task_id, {
        "attempt_id": lease.lease_id, "step": manifest.step,
        "expected_parts": [part.model_dump(mode="json") for part in parts], "storage_prefix": prefix,
        "world_size": manifest.world_size, "framework": manifest.framework,
        "strategy_family": manifest.strategy_family})
    return Handed(manifest.step, str(committed.get("manifest_id", "")), len(parts),
                  sum(part.size_bytes for part in parts))


def _restorable(remote: Any) -> CheckpointManifest:
    """The catalog's manifest if its storage prefix and part keys are what ``hand_over``
    writes (``step-<step>/`` and plain names under it); else ``CheckpointError``."""
    try:
        manifest = CheckpointManifest.model_validate(remote)
    except ValueError as exc:
        raise CheckpointError(f"the coordinator's checkpoint manifest does not parse: {exc}") from None
    if manifest.storage_prefix != _step_prefix(manifest.step) or not manifest.parts:
        raise CheckpointError(f"checkpoint {manifest.manifest_id} (step {manifest.step}) lies at "
                              f"{manifest.storage_prefix!r}, not where an agent hands a step over")
    for part in manifest.parts:
        name = part.key.removeprefix(manifest.storage_prefix)
        if not part.key.startswith(manifest.storage_prefix) or not _plain_part(name):
            raise CheckpointError(f"checkpoint {manifest.manifest_id}: part {part.key!r} is not a plain file under "
                                  f"{manifest.storage_prefix!r}")
    return manifest


def _download_checked(client: CoordinatorClient, key: str, destination: Path, part: CheckpointPart) -> None:
    client.download(key, destination)
    digest = hashlib.sha256()
    size = 0
    with open(destination, "rb") as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    if digest.hexdigest() != part.sha256 or size != part.size_bytes:
        raise CheckpointError(f"part {part.key!r} arrived as {size} bytes with sha256 {digest.hexdigest()}; "
                              f"the catalog recorded {part.size_bytes} bytes with {part.sha256}")


def restore(client: CoordinatorClient, lease: Lease, ckpt_root: Path) -> Handed | None:
    """Bring the task's newest committed checkpoint into ``ckpt_root`` as a verified local
    step; None when the coordinator has none, or this machine already holds that step or a
    later one. A part that does not arrive as the catalog recorded it raises
    ``CheckpointError`` and leaves nothing behind; the coordinator's refusals and
    unreachability raise as the client's errors."""
    remote = client.latest_checkpoint(lease.job_id, lease.task_id)
    if remote is None:
        return None
    manifest = _restorable(remote)
    local = latest_valid_manifest(ckpt_root)
    if local is not None and local.step >= manifest.step:
        return None
    ckpt_root.mkdir(parents=True, exist_ok=True)
    # Downloaded beside the steps under a name no step pattern matches, then moved into place
    # and committed by its manifest, written last: a crash at any point leaves no step that verifies.
    staging = ckpt_root / f".restoring-{manifest.step}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        digests: dict[str, tuple[str, int]] = {}
        for part in manifest.parts:
            name = part.key.removeprefix(manifest.storage_prefix)
            _download_checked(client, checkpoint_artifact_key(lease, part.key), staging / name, part)
            digests[name] = (part.sha256, part.size_bytes)
        final = ckpt_root / manifest.storage_prefix.rstrip("/")
        shutil.rmtree(final, ignore_errors=True)  # no verified step there: newer than every local one
        os.replace(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    write_manifest(final, job_id=lease.job_id, attempt_id=manifest.attempt_id, step=manifest.step,
                   world_size=manifest.world_size, framework=manifest.framework, digests=digests)
    return Handed(manifest.step, manifest.manifest_id, len(manifest.parts),
                  sum(part.size_bytes for part in manifest.parts))
