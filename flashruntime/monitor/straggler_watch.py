"""While an attempt runs: a rank that computes much slower than its peers, a straggler that
every all-reduce waits for. Each rank's heartbeat (``ranks/rank-<r>.json``) carries its recent
compute times (``compute_s``, written by ``flashruntime.torch``); ``detect`` is the rule, pure,
and ``StragglerWatch`` reads the files once a second and records one ``STRAGGLER_DETECTED``
event per episode, with the episode in the attempt's row of run.json.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flashruntime.periodic import Periodic
from flashruntime.protocol.v1alpha1 import EventType
from flashruntime.rank_files import heartbeat_paths

__all__ = ["FACTOR", "RECOVERED_BELOW", "WINDOW", "Episodes", "RankTimes", "Straggler", "StragglerWatch", "detect",
           "ratios", "read_rank_times"]

FACTOR = 1.5  # a rank this many times slower than the others' median is a straggler
WINDOW = 10  # steps: each rank's median over its last WINDOW compute times
# An episode ends once the rank is back under this ratio; between it and FACTOR a rank that
# straggled still does, so a ratio hovering near FACTOR reports one episode, not one per poll.
RECOVERED_BELOW = 1.25
PERIOD_S = 1.0
_MAX_BYTES = 64 * 1024


@dataclass(frozen=True)
class RankTimes:
    """What one rank's heartbeat says about its compute."""

    rank: int
    host: str | None
    step: int | None
    compute_s: tuple[float, ...]


@dataclass(frozen=True)
class Straggler:
    """A rank's median compute time over the window against the median of the other ranks'."""

    rank: int
    host: str | None
    step: int | None
    ratio: float
    median_s: float
    others_s: float


def ratios(ranks: Iterable[RankTimes], *, window: int = WINDOW) -> list[Straggler]:
    """Pure: every rank compared with the others (the rank's ``ratio`` is its median over its
    last ``window`` times divided by the median of the other ranks' medians). Empty unless at
    least two ranks have a full window; a rank without one is left out."""
    medians = {}
    seen = {}
    for times in ranks:
        recent = [t for t in times.compute_s[-window:] if t >= 0]
        if window > 0 and len(recent) >= window:
            medians[times.rank] = statistics.median(recent)
            seen[times.rank] = times
    if len(medians) < 2:
        return []
    compared = []
    for rank, median in sorted(medians.items()):
        others = statistics.median(value for other, value in medians.items() if other != rank)
        if others <= 0:
            continue
        compared.append(Straggler(rank=rank, host=seen[rank].host, step=seen[rank].step, ratio=median / others,
                                  median_s=median, others_s=others))
    return compared


def detect(ranks: Iterable[RankTimes], *, factor: float = FACTOR, window: int = WINDOW) -> list[Straggler]:
    """Pure: the ranks whose median compute time over the last ``window`` steps is at least
    ``factor`` times the other ranks' median."""
    return [entry for entry in ratios(ranks, window=window) if entry.ratio >= factor]


class Episodes:
    """Which ranks straggle now: a rank starts an episode at ``factor`` and ends it below
    ``recovered_below``. Pure state; time and readings come in as arguments."""

    def __init__(self, *, factor: float = FACTOR, recovered_below: float = RECOVERED_BELOW) -> None:
        if not 1.0 <= recovered_below <= factor:
            raise ValueError(f"recovered_below ({recovered_below}) must lie between 1 and factor ({factor}); "
                             f"it is the ratio under which a straggling rank counts as caught up")
        self.factor = factor
        self.recovered_below = recovered_below
        self.active: dict[int, Straggler] = {}

    def update(self, compared: Iterable[Straggler]) -> tuple[list[Straggler], list[Straggler]]:
        """Fold one reading in: (the episodes it starts, the episodes it ends). A rank missing
        from the reading keeps its state."""
        started, ended = [], []
        for entry in compared:
            if entry.rank in self.active:
                if entry.ratio < self.recovered_below:
                    del self.active[entry.rank]
                    ended.append(entry)
            elif entry.ratio >= self.factor:
                self.active[entry.rank] = entry
                started.append(entry)
        return started, ended


def read_rank_times(ranks_dir: Path) -> list[RankTimes]:
    """The compute times of every heartbeat file under ``ranks_dir`` that has them; a torn,
    foreign or unreadable file is skipped (the next reading sees it whole)."""
    found = []
    for path in heartbeat_paths(ranks_dir):
        try:
            with open(path, "rb") as handle:
                record = json.loads(handle.read(_MAX_BYTES))
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict):
            continue
        rank, times = record.get("rank"), record.get("compute_s")
        if not isinstance(rank, int) or isinstance(rank, bool) or not isinstance(times, list):
            continue
        numbers = tuple(float(t) for t in times if isinstance(t, (int, float)) and not isinstance(t, bool))
        host = record.get("host")
        step = record.get("step")
        found.append(RankTimes(rank=rank, host=host if isinstance(host, str) else None,
                               step=step if isinstance(step, int) and not isinstance(step, bool) else None,
                               compute_s=numbers))
    return found


def describe(attempt_id: str, entry: Straggler, window: int = WINDOW) -> str:
    """The event's message: who, where, how much slower, and what it costs."""
    where = f" on {entry.host}" if entry.host else ""
    at = f" at step {entry.step}" if entry.step is not None else ""
    return (f"{attempt_id}: rank {entry.rank}{where} is a straggler: it computes {entry.ratio:.1f}x as long as the "
            f"other ranks' median ({entry.median_s:.3f} s against {entry.others_s:.3f} s per step over its last "
            f"{window} steps{at}); every all-reduce waits for it")


def episode_record(entry: Straggler, ts: float) -> dict[str, Any]:
    """An episode as run.json keeps it in the attempt's ``stragglers`` list."""
    return {"rank": entry.rank, "host": entry.host, "step": entry.step, "ratio": round(entry.ratio, 3),
            "median_s": round(entry.median_s, 6), "others_s": round(entry.others_s, 6), "ts": ts,
            "ended_step": None}


class StragglerWatch:
    """Read the attempt's heartbeats every ``period_s`` and report each straggling episode."""

    def __init__(self, attempt_dir: Path, attempt_id: str, record_event: Callable[[str, str], None],
                 update_attempt: Callable[[str, dict[str, Any]], None], *, factor: float = FACTOR,
                 window: int = WINDOW, recovered_below: float = RECOVERED_BELOW, period_s: float = PERIOD_S,
                 clock: Callable[[], float] = time.time) -> None:
        self._ranks_dir = Path(attempt_dir) / "ranks"
        self._attempt_id = attempt_id
        self._record_event = record_event
        self._update_attempt = update_attempt
        self._window = window
        self._clock = clock
        self._episodes = Episodes(factor=factor, recovered_below=recovered_below)
        self._records: list[dict[str, Any]] = []
        self._open: dict[int, dict[str, Any]] = {}
        self._periodic = Periodic(self.read, period_s, "flashruntime-straggler-watch")

    def start(self) -> StragglerWatch:
        self._periodic.start()
        return self

    def stop(self) -> None:
        """Stop, after one last reading (a run shorter than a period is still judged)."""
        self._periodic.stop()

    def read(self) -> None:
        """One reading. Never raises: a straggler report never fails an attempt."""
        try:
            started, ended = self._episodes.update(ratios(read_rank_times(self._ranks_dir), window=self._window))
            if not started and not ended:
                return
            for entry in ended:
                record = self._open.pop(entry.rank, None)
                if record is not None:
                    record["ended_step"] = entry.step
            for entry in started:
                record = episode_record(entry, self._clock())
                self._records.append(record)
                self._open[entry.rank] = record
            self._update_attempt(self._attempt_id, {"stragglers": [dict(r) for r in self._records]})
            for entry in started:
                self._record_event(str(EventType.STRAGGLER_DETECTED), describe(self._attempt_id, entry, self._window))
        except Exception:  # noqa: BLE001 - a straggler report never fails an attempt
            return
