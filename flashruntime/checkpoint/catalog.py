"""Coordinator-side checkpoint metadata: parts are registered as they are
uploaded, a manifest is committed only when every expected part is registered with
the same sha256, and selection walks the validation ladder
``hash_verified -> restore_verified -> invalid`` with topology compatibility.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Iterable
from typing import Any

from flashruntime.checkpoint.store import InMemoryManifestStore, ManifestStore
from flashruntime.errors import CheckpointError
from flashruntime.protocol.v1alpha1 import (
    CheckpointManifest,
    CheckpointPart,
    CheckpointValidation,
    Event,
    EventType,
)

__all__ = ["CheckpointCatalog", "CheckpointError"]

EVENT_SOURCE = "flashruntime.checkpoint"

_PartKey = tuple[str, str, int]


class CheckpointCatalog:
    """Two-phase checkpoint commits and selection, over a ``ManifestStore``.

    Pending parts live in the store when it implements ``put_part``/``parts`` (so
    they survive a restart with ``SqliteManifestStore``), otherwise in memory.
    Events go to ``on_event`` after the store write; none are built without it.
    """

    def __init__(
        self,
        on_event: Callable[[Event], None] | None = None,
        store: ManifestStore | None = None,
    ) -> None:
        self.store: ManifestStore = store if store is not None else InMemoryManifestStore()
        self._on_event = on_event
        self._lock = threading.RLock()
        self._parts_in_store = callable(getattr(self.store, "put_part", None)) and callable(
            getattr(self.store, "parts", None)
        )
        self._pending: dict[_PartKey, dict[str, tuple[str, int]]] = {}

    # --- events -----------------------------------------------------------------

    def _emit(self, type_: EventType, job_id: str, message: str, data: dict[str, Any]) -> None:
        if self._on_event is not None:
            self._on_event(Event(job_id=job_id, type=type_, source=EVENT_SOURCE, message=message, data=data))

    # --- parts ------------------------------------------------------------------

    def register_part(self, job_id: str, attempt_id: str, step: int, part: CheckpointPart) -> None:
        """Record an uploaded part; the last registration of a key wins. No event."""
        with self._lock:
            if self._parts_in_store:
                self.store.put_part(job_id, attempt_id, step, part)  # type: ignore[attr-defined]
            else:
                self._pending.setdefault((job_id, attempt_id, step), {})[part.key] = (part.sha256, part.size_bytes)

    def _registered(self, job_id: str, attempt_id: str, step: int) -> dict[str, tuple[str, int]]:
        if self._parts_in_store:
            return dict(self.store.parts(job_id, attempt_id, step))  # type: ignore[attr-defined]
        return dict(self._pending.get((job_id, attempt_id, step), {}))

    # --- commit -----------------------------------------------------------------

    def commit(
        self,
        *,
        job_id: str,
        attempt_id: str,
        step: int,
        expected_parts: Iterable[CheckpointPart],
        storage_prefix: str,
        world_size: int = 1,
        compatible_world_sizes: Iterable[int] | None = None,
        framework: str = "",
        strategy_family: str = "",
        checkpoint_duration_s: float | None = None,
    ) -> CheckpointManifest:
        """Commit a manifest if every expected part is registered for ``(job_id,
        attempt_id, step)`` with the same sha256; otherwise emit CHECKPOINT_REJECTED and
        raise ``CheckpointError`` naming every problem. Sizes are not compared."""
        expected = list(expected_parts)
        with self._lock:
            registered = self._registered(job_id, attempt_id, step)
            problems: list[str] = []
            sizes = [world_size] if compatible_world_sizes is None else [world_size, *compatible_world_sizes]
            bad_sizes = [size for size in sizes if isinstance(size, bool) or not isinstance(size, int) or size < 1]
            if bad_sizes:
                problems.append(f"world sizes must be integers >= 1, got {bad_sizes}")
            if not expected:
                problems.append("no expected parts")
            for part in expected:
                found = registered.get(part.key)
                if found is None:
                    problems.append(f"part {part.key!r} not registered")
                elif found[0] != part.sha256:
                    problems.append(
                        f"part {part.key!r} sha256 mismatch (expected {part.sha256}, registered {found[0]})"
                    )
            if problems:
                message = f"step {step}: " + "; ".join(problems)
                self._emit(
                    EventType.CHECKPOINT_REJECTED,
                    job_id,
                    message,
                    {"attempt_id": attempt_id, "step": step, "problems": problems},
                )
                raise CheckpointError(message)
            manifest = CheckpointManifest(
                manifest_id="ck-" + secrets.token_hex(6),
                job_id=job_id,
                attempt_id=attempt_id,
                step=step,
                framework=framework,
                strategy_family=strategy_family,
                world_size=world_size,
                compatible_world_sizes=(
                    [world_size] if compatible_world_sizes is None else list(compatible_world_sizes)
                ),
                storage_prefix=storage_prefix,
                parts=[part.model_copy() for part in expected],
                validation=CheckpointValidation.HASH_VERIFIED,
                checkpoint_duration_s=checkpoint_duration_s,
            )
            self.store.add(manifest)
        self._emit(
            EventType.CHECKPOINT_MANIFEST_COMMITTED,
            job_id,
            f"step {step}: manifest {manifest.manifest_id} committed ({len(expected)} parts)",
            {"manifest_id": manifest.manifest_id, "attempt_id": attempt_id, "step": step, "parts": len(expected)},
        )
        return manifest

    # --- validation ladder ---------------------------------------------------------

    def _require(self, manifest_id: str) -> CheckpointManifest:
        manifest = self.store.get(manifest_id)
        if manifest is None:
            raise CheckpointError(f"unknown manifest id {manifest_id!r}")
        return manifest

    def mark_restore_verified(self, manifest_id: str) -> CheckpointManifest:
        """``hash_verified -> restore_verified``. Unknown id, or a quarantined manifest
        (which is never selectable again) → ``CheckpointError``."""
        with self._lock:
            manifest = self._require(manifest_id)
            if manifest.validation == CheckpointValidation.INVALID:
                raise CheckpointError(
                    f"manifest {manifest_id!r} is quarantined (invalid) and can never be restore-verified"
                )
            updated = manifest.model_copy(update={"validation": CheckpointValidation.RESTORE_VERIFIED})
            self.store.save(updated)
        self._emit(
            EventType.CHECKPOINT_RESTORE_VERIFIED,
            updated.job_id,
            f"step {updated.step}: manifest {manifest_id} restore-verified",
            {"manifest_id": manifest_id, "attempt_id": updated.attempt_id, "step": updated.step},
        )
        return updated

    def quarantine(self, manifest_id: str, reason: str) -> CheckpointManifest:
        """Mark a manifest ``invalid``: it is never selected again. Unknown id →
        ``CheckpointError``."""
        with self._lock:
            manifest = self._require(manifest_id)
            updated = manifest.model_copy(update={"validation": CheckpointValidation.INVALID})
            self.store.save(updated)
        self._emit(
            EventType.CHECKPOINT_REJECTED,
            updated.job_id,
            reason,
            {"manifest_id": manifest_id, "attempt_id": updated.attempt_id, "step": updated.step, "reason": reason},
        )
        return updated

    # --- selection --------------------------------------------------------------

    def latest_valid(
        self, job_id: str, world_size: int | None = None, require_restore_verified: bool = False
    ) -> CheckpointManifest | None:
        """The selectable manifest of ``job_id`` with the highest ``(step,
        restore-verified, created)``; only topology-compatible ones when ``world_size``
        is given. ``None`` if nothing is selectable."""
        allowed = (
            {CheckpointValidation.RESTORE_VERIFIED}
            if require_restore_verified
            else {CheckpointValidation.HASH_VERIFIED, CheckpointValidation.RESTORE_VERIFIED}
        )
        candidates = [
            manifest
            for manifest in self.store.all(job_id)
            if manifest.validation in allowed and (world_size is None or world_size in manifest.compatible_world_sizes)
        ]
        if not candidates:
            return None
        return max(
            candidates,
            key=lambda m: (m.step, m.validation == CheckpointValidation.RESTORE_VERIFIED, m.created),
        )

    def lost_work(self, job_id: str, failed_at_step: int, world_size: int | None = None) -> int | None:
        """Steps to recompute after failing at ``failed_at_step``; ``None`` when
        nothing is selectable."""
        latest = self.latest_valid(job_id, world_size)
        if latest is None:
            return None
        return max(0, failed_at_step - latest.step)
