"""Where the coordinator keeps committed checkpoint manifests.

``ManifestStore`` is the contract; ``InMemoryManifestStore`` is the default and
``SqliteManifestStore`` (``flashruntime.checkpoint.sqlite_store``) survives a
coordinator restart. A store may also keep the registry of uploaded parts
(``put_part``/``parts``); the catalog uses it when present.
"""

from __future__ import annotations

import threading
from typing import Protocol, runtime_checkable

from flashruntime.protocol.v1alpha1 import CheckpointManifest, CheckpointPart

__all__ = ["InMemoryManifestStore", "ManifestStore", "PartRegistry"]


@runtime_checkable
class ManifestStore(Protocol):
    """Required by ``CheckpointCatalog``.

    ``add`` raises ``ValueError`` on a duplicate ``manifest_id``; ``save`` replaces the
    stored manifest of the same id (inserting it if unknown) and keeps its position;
    ``all`` lists in insertion order, filtered on ``manifest.job_id`` when ``scope`` is
    given. Returned manifests are copies: changing them changes nothing stored.
    """

    def add(self, manifest: CheckpointManifest) -> None: ...

    def save(self, manifest: CheckpointManifest) -> None: ...

    def get(self, manifest_id: str) -> CheckpointManifest | None: ...

    def all(self, scope: str | None = None) -> list[CheckpointManifest]: ...


@runtime_checkable
class PartRegistry(Protocol):
    """Optional part registry of a store: pending parts keyed by ``(job_id, attempt_id,
    step)``, ``{part key: (sha256, size_bytes)}``, last write wins per key."""

    def put_part(self, job_id: str, attempt_id: str, step: int, part: CheckpointPart) -> None: ...

    def parts(self, job_id: str, attempt_id: str, step: int) -> dict[str, tuple[str, int]]: ...


class InMemoryManifestStore:
    """An insertion-ordered dict of manifests (no part registry). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._manifests: dict[str, CheckpointManifest] = {}

    def add(self, manifest: CheckpointManifest) -> None:
        with self._lock:
            if manifest.manifest_id in self._manifests:
                raise ValueError(f"manifest {manifest.manifest_id!r} is already stored; use save() to update it")
            self._manifests[manifest.manifest_id] = manifest.model_copy(deep=True)

    def save(self, manifest: CheckpointManifest) -> None:
        with self._lock:
            self._manifests[manifest.manifest_id] = manifest.model_copy(deep=True)

    def get(self, manifest_id: str) -> CheckpointManifest | None:
        with self._lock:
            found = self._manifests.get(manifest_id)
            return None if found is None else found.model_copy(deep=True)

    def all(self, scope: str | None = None) -> list[CheckpointManifest]:
        with self._lock:
            return [
                manifest.model_copy(deep=True)
                for manifest in self._manifests.values()
                if scope is None or manifest.job_id == scope
            ]

    def __len__(self) -> int:
        with self._lock:
            return len(self._manifests)
