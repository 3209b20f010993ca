"""``ExitWatch``: which process of a multi-process attempt went first. A thread looks at
the attempt's processes a few times a second and notes, for every rank it sees, its pid,
its rank (from ``RANK`` / ``LOCAL_RANK`` in its environment) and when it was last seen
alive; ``first_exit`` then names the rank that was gone while the others still ran — the
root cause of their collective errors. Watching never hurts the job: errors are swallowed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from flashruntime.periodic import Periodic

__all__ = ["ExitWatch", "ProcessSighting", "first_exit", "rank_of"]

PERIOD_S = 0.2
_RANK_VARIABLES = (b"RANK=", b"LOCAL_RANK=")


@dataclass
class ProcessSighting:
    """One process of the attempt as the watch saw it."""

    pid: int
    rank: int | None  # None: not a rank of its own (a helper, a loader worker, the launcher)
    first_seen: float
    last_seen: float
    gone_at: float | None = None  # the first look that found it gone (or a zombie)


def rank_of(pid: int) -> int | None:
    """The process's ``RANK`` (else ``LOCAL_RANK``) from the environment it was started with."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    values = {}
    for entry in environ:
        for name in _RANK_VARIABLES:
            if entry.startswith(name) and entry[len(name):].isdigit():
                values[name] = int(entry[len(name):])
    return values.get(b"RANK=", values.get(b"LOCAL_RANK="))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            state = handle.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


class ExitWatch:
    """Watch the processes ``find()`` names (the attempt's) until ``stop()``."""

    def __init__(self, find: Callable[[], Iterable[int]], *, period_s: float = PERIOD_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._find = find
        self._clock = clock
        self._seen: dict[int, ProcessSighting] = {}
        self._lock = threading.Lock()
        self._periodic = Periodic(self.look, period_s, "flashruntime-exit-watch", at_once=True)

    def start(self) -> ExitWatch:
        self._periodic.start()
        return self

    def stop(self) -> list[ProcessSighting]:
        """Stop watching (one last look first); the sightings, in the order they were first seen."""
        self._periodic.stop()
        with self._lock:
            return sorted(self._seen.values(), key=lambda s: (s.first_seen, s.pid))

    def look(self) -> None:
        """One look: new processes are noted with their rank, the ones gone are marked."""
        try:
            now = self._clock()
            current = {pid for pid in self._find() if _alive(pid)}
            with self._lock:
                for pid in current:
                    sighting = self._seen.get(pid)
                    if sighting is None or sighting.gone_at is not None:
                        self._seen[pid] = ProcessSighting(pid, rank_of(pid), now, now)
                    else:
                        sighting.last_seen = now
                for pid, sighting in self._seen.items():
                    if sighting.gone_at is None and pid not in current:
                        sighting.gone_at = now
        except Exception:  # noqa: BLE001 - watching must never fail the attempt
            return


def first_exit(sightings: Iterable[ProcessSighting], leader: int) -> ProcessSighting | None:
    """The rank that was gone first while another rank (or the leader) still ran: among the
    processes with a rank of their own (the topmost per rank value, so a rank's loader workers
    never stand for it), the earliest gone, if some other rank or the leader was seen alive
    after it went. None when nothing went first (all went at once, or no rank was seen). Pure."""
    rows = list(sightings)
    ranks: dict[int, ProcessSighting] = {}
    for sighting in rows:  # first seen first: a rank's own process before its children
        if sighting.rank is not None and sighting.rank not in ranks:
            ranks[sighting.rank] = sighting
    candidates = [s for s in ranks.values() if s.gone_at is not None]
    if not candidates:
        return None
    first = min(candidates, key=lambda s: (s.gone_at, s.pid))
    if sum(1 for s in candidates if s.gone_at == first.gone_at) > 1:
        return None  # several went in the same look: which was first cannot be told
    others = [s for s in rows if s is not first and (s.rank is not None or s.pid == leader)]
    if any(s.last_seen >= (first.gone_at or 0.0) for s in others):
        return first
    return None
