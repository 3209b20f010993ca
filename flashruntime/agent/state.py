"""A worker's own files in its work directory: the lock that keeps a second worker out, and
the journal of the attempts it runs, which lets a restarted worker stop what a killed one
left running and tell the coordinator those leases are abandoned.

``<work_dir>/.flashruntime-worker/lock`` is held (``flock``) for the worker's whole life and
says who holds it (pid, node id, whether SIGUSR1 drains it). The kernel drops the hold when
the process dies, ``kill -9`` included, so a killed worker never blocks its restart.
``attempts.json`` lists the attempts running now, each rewritten atomically as it starts and
ends: a lease id and the attempt's output directory, which every process of the attempt
carries in its environment (``FLASHML_OUTPUT_DIR``), with the pid of its first process and,
where attempts run in cgroups, the attempt's cgroup directory, which holds every process of
it whatever its session or environment.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from flashruntime.errors import WorkDirInUse
from flashruntime.files import write_atomic

__all__ = ["STATE_DIR", "AttemptEntry", "AttemptJournal", "LockHolder", "WorkDirLock", "lock_holder"]

logger = logging.getLogger("flashruntime.worker")

STATE_DIR = ".flashruntime-worker"
_LOCK = "lock"
_JOURNAL = "attempts.json"


@dataclass(frozen=True)
class LockHolder:
    """The worker holding a work directory, as its lock file says."""

    pid: int | None
    node_id: str | None
    drains_on_sigusr1: bool


def _lock_fd(fd: int) -> bool:
    """Take the exclusive lock on ``fd`` without waiting; False when another process holds it."""
    try:
        import fcntl
    except ImportError:  # Windows: a byte-range lock on the first byte
        import msvcrt

        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)  # type: ignore[attr-defined]
        except OSError:
            return False
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _read_holder(path: Path) -> LockHolder:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # being written this instant, or unreadable: who is unknown
        document = {}
    if not isinstance(document, dict):
        document = {}
    pid = document.get("pid")
    node_id = document.get("node_id")
    return LockHolder(pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None,
                      node_id if isinstance(node_id, str) else None,
                      document.get("drains_on_sigusr1") is True)


def lock_holder(work_dir: Path) -> LockHolder | None:
    """The worker running in ``work_dir`` now, or None when none holds its lock."""
    path = Path(work_dir) / STATE_DIR / _LOCK
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        if _lock_fd(fd):
            return None  # free: closing the descriptor below drops the lock again
        return _read_holder(path)
    finally:
        os.close(fd)


class WorkDirLock:
    """The lock of one work directory, held from ``acquire`` until ``release`` (or death)."""

    def __init__(self, work_dir: Path) -> None:
        self.path = Path(work_dir) / STATE_DIR / _LOCK
        self._fd: int | None = None

    def acquire(self, node_id: str, *, drains_on_sigusr1: bool) -> None:
        """Hold the lock and write who holds it; ``WorkDirInUse`` when a running worker has it,
        ``OSError`` when the directory is unusable."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Not inherited by children (Python's default): an orphaned task must never keep the
        # lock of the worker that started it.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if not _lock_fd(fd):
            os.close(fd)
            holder = _read_holder(self.path)
            who = ", ".join(part for part in (f"pid {holder.pid}" if holder.pid else "",
                                              f"node {holder.node_id}" if holder.node_id else "") if part)
            raise WorkDirInUse(
                f"work directory {self.path.parent.parent} is in use by another worker"
                + (f" ({who})" if who else "")
                + ": two workers in one directory would stop each other's tasks; stop or drain that worker "
                f"(flashruntime worker --drain --work-dir {self.path.parent.parent}), or give this one another "
                "--work-dir",
                holder.pid,
            )
        self._fd = fd
        document = {"pid": os.getpid(), "node_id": node_id, "drains_on_sigusr1": drains_on_sigusr1}
        try:
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, json.dumps(document).encode("utf-8"))
        except OSError:
            self.release()
            raise

    def release(self) -> None:
        """Empty the file (a clean exit leaves no holder to read) and drop the lock."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)


@dataclass(frozen=True)
class AttemptEntry:
    """One attempt this worker runs: enough to find its processes and name its lease."""

    lease_id: str
    job_id: str
    task_id: str
    node_id: str
    output_dir: str  # FLASHML_OUTPUT_DIR (os.fsdecode of its bytes): the marker of its processes
    pid: int | None = None  # its first process, which leads its own process group
    cgroup: str | None = None  # its cgroup v2 directory, where attempts run in cgroups

    @classmethod
    def from_json(cls, value: Any) -> AttemptEntry | None:
        if not isinstance(value, dict):
            return None
        texts = [value.get(name) for name in ("lease_id", "job_id", "task_id", "node_id", "output_dir")]
        pid, cgroup = value.get("pid"), value.get("cgroup")
        if not all(isinstance(text, str) and text for text in texts):
            return None
        if pid is not None and (isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0):
            pid = None
        return cls(*texts, pid=pid,  # type: ignore[arg-type]
                   cgroup=cgroup if isinstance(cgroup, str) and cgroup.startswith("/") else None)


class AttemptJournal:
    """``attempts.json``: the attempts running now, in the order they started."""

    def __init__(self, work_dir: Path) -> None:
        self.path = Path(work_dir) / STATE_DIR / _JOURNAL
        self._lock = threading.Lock()

    def entries(self) -> list[AttemptEntry]:
        """What the journal lists; an unreadable or damaged journal lists nothing (and says so)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            logger.warning("cannot read %s: %s", self.path, exc)
            return []
        try:
            document = json.loads(raw)
        except ValueError as exc:
            logger.warning("%s is not JSON (%s): its attempts cannot be swept", self.path, exc)
            return []
        items = document.get("attempts") if isinstance(document, dict) else None
        entries = [AttemptEntry.from_json(item) for item in (items if isinstance(items, list) else [])]
        return [entry for entry in entries if entry is not None]

    def add(self, entry: AttemptEntry) -> None:
        """Record ``entry`` (replacing one of the same lease); durable when this returns."""
        with self._lock:
            kept = [item for item in self.entries() if item.lease_id != entry.lease_id]
            self._write([*kept, entry])

    def forget(self, lease_id: str) -> None:
        with self._lock:
            entries = self.entries()
            kept = [item for item in entries if item.lease_id != lease_id]
            if len(kept) != len(entries):
                self._write(kept)

    def _write(self, entries: list[AttemptEntry]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps({"attempts": [asdict(entry) for entry in entries]}, indent=1) + "\n")
