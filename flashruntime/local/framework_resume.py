"""A run's framework checkpoints (see ``flashruntime.checkpoint.frameworks``) from save to
resume. While an attempt runs, ``CheckpointWatch`` fingerprints every checkpoint within
seconds of the framework finishing it, and keeps a copy of a one-file checkpoint whose name
every save reuses (``snapshot.pt``, ``last.ckpt``). Before a relaunch, ``prepare_resume``
verifies the newest one against its fingerprint and its format, moves a bad one aside (into
the job's ``quarantine/``, never deleted) so the script's own resume logic takes the previous
one, and names the checkpoint the relaunch will resume from. What was there before the run
is the user's: judged and reported, never moved.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flashruntime.checkpoint.frameworks import (
    FrameworkCheckpoint,
    checkpoint_files,
    file_problem,
    find_checkpoints,
    fingerprint,
    fingerprint_problem,
    newest,
)
from flashruntime.files import write_atomic
from flashruntime.periodic import Periodic

__all__ = ["QUARANTINE_DIR", "CheckpointWatch", "FrameworkCheckpoints", "ResumePoint"]

QUARANTINE_DIR = "quarantine"  # under the job's directory, never among the script's own files
RECORD_NAME = "framework-checkpoints.json"
VERIFIED_DIR = "framework-checkpoints-verified"
WATCH_PERIOD_S = 0.5


def _literal(pattern: str) -> bool:
    return not any(char in pattern for char in "*?[")


def _state_of(checkpoint: FrameworkCheckpoint) -> tuple[int, int, int]:
    """(files, bytes, newest mtime): unchanged across two looks means the framework is done with it."""
    files = checkpoint_files(checkpoint)
    stats = [path.stat() for path in files]
    return len(stats), sum(s.st_size for s in stats), max((s.st_mtime_ns for s in stats), default=0)


def _structural_problem(checkpoint: FrameworkCheckpoint) -> str | None:
    if checkpoint.kind == "huggingface" and not (checkpoint.path / "trainer_state.json").exists():
        return "trainer_state.json is missing (the save did not finish)"
    for path in checkpoint_files(checkpoint):
        problem = file_problem(path)
        if problem is not None:
            return problem
    return None


@dataclass
class ResumePoint:
    """What a relaunch will resume from, and what was done to get there."""

    checkpoint: FrameworkCheckpoint | None
    events: list[tuple[str, str]] = field(default_factory=list)  # (event type, message)


class FrameworkCheckpoints:
    """The framework checkpoints of one job (a run, or one trial of a sweep): where to look
    (``roots``: the working directory and ``FLASHML_CKPT_DIR``; ``patterns``: the user's own
    names), and the fingerprints taken so far (``<job dir>/framework-checkpoints.json``)."""

    def __init__(self, roots: Iterable[Path], patterns: Iterable[str], job_dir: Path, *, since_ns: int = 0) -> None:
        self.roots = [Path(root) for root in roots]
        self.patterns = list(patterns)
        self.job_dir = Path(job_dir)
        self.since_ns = since_ns  # when the run started, on the filesystem's clock
        self.record_path = job_dir / RECORD_NAME
        self.verified_dir = job_dir / VERIFIED_DIR
        self._lock = threading.Lock()
        self._records: dict[str, dict[str, Any]] = self._load()
        self._quarantined: dict[str, Path] = {}  # checkpoint path -> where it was moved aside

    def _load(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.record_path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _save(self) -> None:
        self.record_path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.record_path, json.dumps(self._records, indent=1, sort_keys=True).encode())

    def reused_name(self, checkpoint: FrameworkCheckpoint) -> bool:
        """A one-file checkpoint that every save overwrites (Lightning's ``last.ckpt``, a file the
        user named outright, ``snapshot.pt``): the previous save survives only as our copy. A
        pattern with a wildcard names a new file per save, and gets no copies."""
        if not checkpoint.path.is_file():
            return False
        if checkpoint.kind == "lightning":
            return checkpoint.path.name.startswith("last")
        root = self.root_of(checkpoint)
        return (checkpoint.kind == "pattern" and root is not None
                and str(checkpoint.path.relative_to(root)) in {p for p in self.patterns if _literal(p)})

    def find(self) -> list[FrameworkCheckpoint]:
        return find_checkpoints(self.roots, self.patterns, exclude=[self.job_dir / QUARANTINE_DIR, self.verified_dir])

    def root_of(self, checkpoint: FrameworkCheckpoint) -> Path | None:
        return next((root for root in self.roots if checkpoint.path.is_relative_to(root)), None)

    def describe(self, checkpoint: FrameworkCheckpoint) -> str:
        return checkpoint.describe(self.root_of(checkpoint))

    def recorded(self, checkpoint: FrameworkCheckpoint) -> dict[str, Any] | None:
        with self._lock:
            return self._records.get(str(checkpoint.path))

    def record(self, checkpoint: FrameworkCheckpoint) -> str:
        """Fingerprint ``checkpoint`` as it is now (and keep a copy of a reused one-file
        checkpoint); returns the event message."""
        files = fingerprint(checkpoint)
        entry: dict[str, Any] = {"kind": checkpoint.kind, "step": checkpoint.step, "unit": checkpoint.unit,
                                 "files": files, "seen_at": time.time()}
        kept = ""
        if self.reused_name(checkpoint):
            copy = self.verified_dir / _copy_name(checkpoint.path)
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(checkpoint.path, copy)
            entry["verified_copy"] = str(copy)
            kept = "; a copy is kept in case a later save of it tears"
        with self._lock:
            self._records[str(checkpoint.path)] = entry
            self._save()
        total = sum(f["size"] for f in files.values())
        return f"{self.describe(checkpoint)} fingerprinted: {len(files)} file(s), {total} bytes{kept}"

    def already_fingerprinted(self, checkpoint: FrameworkCheckpoint) -> bool:
        """Whether this save of ``checkpoint`` has its fingerprint: a change to it since is damage,
        never a reason to fingerprint it again. Only a one-file checkpoint every save overwrites
        is new when its step changed (or cannot be told: then the newest bytes are taken as a new
        save, and only its format can show damage)."""
        recorded = self.recorded(checkpoint)
        if recorded is None:
            return False
        if self.reused_name(checkpoint):
            return checkpoint.step is not None and recorded.get("step") == checkpoint.step
        return True

    def problem(self, checkpoint: FrameworkCheckpoint) -> str | None:
        """Why ``checkpoint`` must not be resumed from, or None. One fingerprinted when it was
        finished is judged by its bytes against that fingerprint (its format was checked before
        it was taken); a file this process hashed and nothing has written to since is not read
        again. One never seen finished is judged by its format alone."""
        recorded = self.recorded(checkpoint)
        if recorded is None:
            return _structural_problem(checkpoint)
        return fingerprint_problem(checkpoint, recorded.get("files", {}))

    def quarantine(self, checkpoint: FrameworkCheckpoint) -> Path:
        """Move ``checkpoint`` into the job's ``quarantine/`` (under its path below the search
        root, at a free name), out of the script's sight: a framework that lists its checkpoint
        directory finds only its own entries there. Raises ``OSError`` when it cannot be moved."""
        root = self.root_of(checkpoint)
        relative = checkpoint.path.relative_to(root) if root is not None else Path(checkpoint.path.name)
        target = self.job_dir / QUARANTINE_DIR / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        base, n = target, 0
        while os.path.lexists(target):
            n += 1
            target = base.with_name(f"{base.name}.{n}")
        shutil.move(str(checkpoint.path), str(target))  # a rename, or a copy then removal across filesystems
        self._quarantined[str(checkpoint.path)] = target
        return target

    def written_by_this_run(self, checkpoint: FrameworkCheckpoint) -> bool:
        """Whether this run wrote (or saw written) ``checkpoint``: fingerprinted by it, or changed
        since it started. What was there before is the user's, never moved nor damaged by us."""
        return self.recorded(checkpoint) is not None or checkpoint.order[1] >= self.since_ns

    def _restore(self, checkpoint: FrameworkCheckpoint) -> FrameworkCheckpoint | None:
        """Put the kept copy of a reused one-file checkpoint back in its place, if it still
        verifies; the checkpoint as restored, or None."""
        recorded = self.recorded(checkpoint)
        copy = Path(recorded["verified_copy"]) if recorded and recorded.get("verified_copy") else None
        if copy is None or not copy.is_file():
            return None
        unit = recorded.get("unit") or "step"
        restored = FrameworkCheckpoint(checkpoint.kind, copy, recorded.get("step"), checkpoint.order, unit)
        expected = recorded["files"].get(checkpoint.path.name, {})
        if fingerprint_problem(restored, {copy.name: expected}):
            return None
        quarantined = self._quarantined.get(str(checkpoint.path))
        if quarantined is not None and fingerprint_problem(
                FrameworkCheckpoint(checkpoint.kind, quarantined, None, checkpoint.order),
                {quarantined.name: expected}) is None:
            return None  # the bytes moved aside are the kept ones: putting them back changes nothing
        shutil.copy2(copy, checkpoint.path)
        return FrameworkCheckpoint(checkpoint.kind, checkpoint.path, recorded.get("step"), checkpoint.order, unit)

    def prepare_resume(self, *, failed_loading: bool = False) -> ResumePoint:
        """Verify the newest checkpoint, quarantining (and, for a reused one-file checkpoint,
        restoring the kept copy of) each bad one until one verifies. ``failed_loading``: the
        last attempt failed while loading a checkpoint, so the newest is bad whatever it reads as."""
        point = ResumePoint(None)
        distrust_newest = failed_loading
        for _ in range(64):  # each pass removes one checkpoint: never more passes than there are
            chosen = newest(self.find())
            if chosen is None:
                return point
            problem = self.problem(chosen)
            if problem is None and distrust_newest and self.recorded(chosen) is None:
                # Never fingerprinted, and loading it failed: nothing vouches for its bytes.
                problem = "the last attempt failed while loading it"
            distrust_newest = False
            if problem is None:
                point.checkpoint = chosen
                return point
            described = self.describe(chosen)
            if not self.written_by_this_run(chosen):
                point.events.append(("CHECKPOINT_UNRESUMABLE", f"{described} is not resumable: {problem}; it was "
                                     "there before this run, so it is left where it is: move it aside yourself"))
                return point
            recorded = self.recorded(chosen) if self.reused_name(chosen) else None
            try:
                moved = self.quarantine(chosen)
            except OSError as exc:
                point.events.append(("CHECKPOINT_UNRESUMABLE", f"{described} is not resumable: {problem}; it could "
                                     f"not be moved aside ({exc}), so the script may load it"))
                return point
            point.events.append(("CHECKPOINT_QUARANTINED", f"{described} is not resumable: {problem}; moved to "
                                 f"{moved} (kept, not deleted)"))
            if recorded is not None:
                restored = self._restore(chosen)
                if restored is not None:
                    point.events.append(("CHECKPOINT_RESTORED", f"{self.describe(restored)}: the copy kept when it "
                                         "was last verified is back in its place"))
        return point


def _copy_name(path: Path) -> str:
    """A file name for the kept copy of ``path`` that two checkpoints of one job never share
    (a digest of the whole path, then its own name, cut to stay a valid file name)."""
    return f"{hashlib.sha256(str(path).encode()).hexdigest()[:16]}-{path.name[-100:]}"


class CheckpointWatch:
    """While an attempt runs: fingerprint each new save once it stops changing (its files,
    bytes and newest mtime the same on two looks ``period_s`` apart, and its format sound),
    reporting each through ``on_event(type, message)``. A save fingerprinted before (by this
    attempt or an earlier one) is never fingerprinted again: a later change is damage."""

    def __init__(self, checkpoints: FrameworkCheckpoints, on_event: Callable[[str, str], None], *,
                 period_s: float = WATCH_PERIOD_S) -> None:
        self._checkpoints = checkpoints
        self._on_event = on_event
        self._pending: dict[Path, tuple[int, int, int]] = {}
        self._done: dict[Path, tuple[int, int, int]] = {}
        self._periodic = Periodic(self.look, period_s, "flashruntime-checkpoint-watch")

    def start(self) -> CheckpointWatch:
        self._periodic.start()
        return self

    def stop(self) -> None:
        """Stop, after one last look: a checkpoint unchanged since the previous look counts; one
        still changing when the attempt ended is left to ``prepare_resume`` to judge."""
        self._periodic.stop()

    def look(self) -> None:
        try:
            found = self._checkpoints.find()
        except Exception:  # noqa: BLE001 - watching must never fail the attempt
            return
        for checkpoint in found:
            try:
                self._look_at(checkpoint)
            except Exception:  # noqa: BLE001 - one unreadable checkpoint never stops the others' turn
                continue

    def _look_at(self, checkpoint: FrameworkCheckpoint) -> None:
        state = _state_of(checkpoint)
        if self._done.get(checkpoint.path) == state:
            return
        if self._checkpoints.already_fingerprinted(checkpoint):
            self._done[checkpoint.path] = state  # changed since? prepare_resume will say so
            return
        previous = self._pending.get(checkpoint.path)
        self._pending[checkpoint.path] = state
        if previous != state or _structural_problem(checkpoint) is not None:
            return  # still being written (or torn: prepare_resume will say so)
        self._on_event("CHECKPOINT_SEEN", self._checkpoints.record(checkpoint))
        self._done[checkpoint.path] = state
