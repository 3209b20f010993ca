"""Metric curves of a whole run at a bounded size, read incrementally from ``metrics.jsonl``.

A metrics file only grows while its attempt runs, so each poll reads just the bytes
appended since the previous one and folds the new records into a downsampled series:
min/max per bucket of consecutive points, the first and the last point always kept. The
chart so shows the whole history (never only its end) in at most ``SERIES_POINTS``
points per curve, and a poll costs at most ``READ_BYTES_PER_POLL`` of reading, however
long the run has been going.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "MAX_LINE_BYTES",
    "READ_BYTES_PER_POLL",
    "RECENT_RECORDS",
    "SERIES_POINTS",
    "Downsampler",
    "MetricsCache",
    "MetricsView",
    "ReadBudget",
    "reduce_points",
    "strict_loads",
]

# Points per curve: one task's loss curve (all its attempts together) and each file's own series.
SERIES_POINTS = 600
# Bytes of metrics read per poll, all files together; a longer backlog is read over the next polls.
READ_BYTES_PER_POLL = 8 * 1024 * 1024
# Newest records of each file kept as they are, for the step and steps/s figures.
RECENT_RECORDS = 100
# A record longer than this is dropped (it could otherwise hold every later poll on one line).
MAX_LINE_BYTES = 1024 * 1024
# Files whose reading position and series are remembered between polls (least recently read go first).
CACHED_FILES = 1024
# Bytes at the head of a file compared on every poll: a file truncated and written again
# (same inode, no smaller) is read again from its start.
_HEAD_BYTES = 64

# (index among the file's records, step or None, value)
Point = tuple[int, "float | None", float]


def _no_constant(name: str) -> None:
    """NaN and ±Infinity (which Python's json writes) become null: the page gets strict JSON."""


def _finite_float(text: str) -> float | None:
    """A JSON number; one too large for a float (``1e999``) becomes null like ``Infinity``."""
    value = float(text)
    return value if math.isfinite(value) else None


def strict_loads(data: str | bytes) -> Any:
    """``json.loads`` with every non-finite number (NaN, ±Infinity, ``1e999``) read as null."""
    return json.loads(data, parse_constant=_no_constant, parse_float=_finite_float)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# --- downsampling --------------------------------------------------------------------------


def _lower(a: Point, b: Point) -> Point:
    return b if b[2] < a[2] else a  # ties keep the earlier point


def _higher(a: Point, b: Point) -> Point:
    return b if b[2] > a[2] else a


class Downsampler:
    """At most ``limit`` points of a stream, whatever its length: the first and the last
    point, and the lowest and highest point of each bucket of ``width`` consecutive points.

    When the buckets outgrow the limit, neighbours merge pairwise (the lowest and highest of
    a pair are the lowest and highest of its two buckets, so nothing is recomputed) and the
    width doubles. Adding a point is O(1) amortised; memory is O(limit).
    """

    def __init__(self, limit: int = SERIES_POINTS) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 4:
            raise ValueError(f"limit must be an int >= 4 (first, last and one bucket's low and high), got {limit!r}")
        self.limit = limit
        # Room for the first and last point and the open bucket's two; even, so buckets merge in pairs.
        self._most = ((limit - 4) // 2) & ~1
        self.width = 1
        self.count = 0
        self.first: Point | None = None
        self.last: Point | None = None
        self._buckets: list[tuple[Point, Point]] = []
        self._open: tuple[Point, Point] | None = None
        self._filled = 0

    def add(self, point: Point) -> None:
        self.count += 1
        if self.first is None:
            self.first = point
        self.last = point
        if self._open is None:
            self._open, self._filled = (point, point), 1
        else:
            low, high = self._open
            self._open, self._filled = (_lower(low, point), _higher(high, point)), self._filled + 1
        if self._filled < self.width:
            return
        self._buckets.append(self._open)
        self._open, self._filled = None, 0
        if len(self._buckets) > self._most:
            self._merge()

    def extend(self, points: Iterable[Point]) -> Downsampler:
        for point in points:
            self.add(point)
        return self

    def _merge(self) -> None:
        pairs, spare = self._buckets[:self._most], self._buckets[self._most:]
        self._buckets = [(_lower(a[0], b[0]), _higher(a[1], b[1])) for a, b in zip(pairs[::2], pairs[1::2])]
        self.width *= 2
        # The bucket past the last pair is half of the first bucket of the doubled width.
        self._open, self._filled = spare[0], self.width // 2

    def points(self) -> list[Point]:
        """The kept points in stream order, each once."""
        chosen: dict[int, Point] = {}
        for pair in [*self._buckets, *([self._open] if self._open is not None else [])]:
            for point in pair:
                chosen[point[0]] = point
        for point in (self.first, self.last):
            if point is not None:
                chosen[point[0]] = point
        return [chosen[index] for index in sorted(chosen)]


def reduce_points(points: list[Point], limit: int) -> list[Point]:
    """``points`` (in stream order) cut to at most ``limit`` the way ``Downsampler`` does;
    below 4 only the first and last point remain."""
    if len(points) <= limit:
        return list(points)
    if limit < 4:
        return [points[0], points[-1]][:max(limit, 1)]
    return Downsampler(limit).extend(points).points()


# --- incremental reading -------------------------------------------------------------------


class ReadBudget:
    """The bytes one poll may still read, shared by all the files it reads."""

    def __init__(self, total: int = READ_BYTES_PER_POLL) -> None:
        self.left = total

    def take(self, wanted: int) -> int:
        granted = max(0, min(wanted, self.left))
        self.left -= granted
        return granted


@dataclass
class _Series:
    points: Downsampler = field(default_factory=Downsampler)
    by_step: bool = True  # every point so far had a numeric step

    def add(self, index: int, step: float | None, value: float) -> None:
        self.points.add((index, step, value))
        self.by_step = self.by_step and step is not None


class _FileState:
    """Where reading stopped in one file, and what its records so far add up to."""

    def __init__(self, ident: tuple[int, int]) -> None:
        self.ident = ident
        self.head = b""
        self.offset = 0
        self.size = 0
        self.skipping = False  # inside a line longer than a poll's read: dropped up to its newline
        self.records = 0
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_RECORDS)
        self.loss = _Series()
        self.other_key: str | None = None
        self.other = _Series()

    def consume(self, data: bytes) -> None:
        """Fold the complete lines of ``data`` (read at ``offset``) in; a last line without
        its newline is still being written and is read again, whole, by a later poll."""
        start = 0
        if self.skipping:
            newline = data.find(b"\n")
            if newline < 0:
                self.offset += len(data)
                return
            start, self.skipping = newline + 1, False
        end = data.rfind(b"\n")
        if end < start:
            if len(data) - start >= MAX_LINE_BYTES:
                self.offset += len(data)
                self.skipping = True
            else:
                self.offset += start
            return
        for line in data[start:end].split(b"\n"):
            self._record(line)
        self.offset += end + 1

    def _record(self, line: bytes) -> None:
        if not line.strip():
            return
        try:
            record = strict_loads(line)
        except ValueError:
            return  # not JSON (a torn write that was later followed by a newline): skipped
        if not isinstance(record, dict):
            return
        index = self.records
        self.records += 1
        self.recent.append(record)
        step = record.get("step")
        step = step if _number(step) else None
        if _number(record.get("loss")):
            self.loss.add(index, step, record["loss"])
        if self.other_key is None:
            self.other_key = next((key for key, value in record.items()
                                   if key not in ("step", "ts", "loss") and _number(value)), None)
        if self.other_key is not None and _number(record.get(self.other_key)):
            self.other.add(index, step, record[self.other_key])


@dataclass(frozen=True)
class MetricsView:
    """One file's state after a poll: what the page needs of it."""

    records: int = 0                      # complete records read so far
    recent: list[dict[str, Any]] = field(default_factory=list)
    series: dict[str, tuple[list[Point], bool]] = field(default_factory=dict)  # key -> (points, by_step)
    read_fraction: float = 1.0            # bytes read / file size: below 1 while a backlog is being read


class MetricsCache:
    """Reading positions and series of ``metrics.jsonl`` files, kept between polls.

    ``read(path, budget)`` reads what was appended since the last call (within the
    budget) and returns the file's ``MetricsView``. A file replaced (another inode),
    truncated, or rewritten from its start is read again from the beginning. Never raises
    for an unreadable file: it gives an empty view.
    """

    def __init__(self, max_files: int = CACHED_FILES) -> None:
        self.max_files = max_files
        self._files: OrderedDict[str, _FileState] = OrderedDict()
        self._lock = threading.Lock()

    def read(self, path: str | os.PathLike[str], budget: ReadBudget | None = None) -> MetricsView:
        budget = budget if budget is not None else ReadBudget()
        key = os.fspath(path)
        with self._lock:
            try:
                state = self._advance(Path(key), self._files.get(key), budget)
            except OSError:
                state = None
            if state is None:
                self._files.pop(key, None)
                return MetricsView()
            self._files[key] = state
            self._files.move_to_end(key)
            while len(self._files) > self.max_files:
                self._files.popitem(last=False)
            return _view(state)

    @staticmethod
    def _advance(path: Path, state: _FileState | None, budget: ReadBudget) -> _FileState | None:
        try:
            with open(path, "rb") as handle:
                info = os.fstat(handle.fileno())
                ident = (info.st_dev, info.st_ino)
                if state is not None and (state.ident != ident or info.st_size < state.offset
                                          or (state.head and handle.read(len(state.head)) != state.head)):
                    state = None
                if state is None:
                    state = _FileState(ident)
                state.size = info.st_size
                pending = info.st_size - state.offset
                wanted = budget.take(pending) if pending > 0 else 0
                if wanted:
                    handle.seek(state.offset)
                    data = handle.read(wanted)
                    if state.offset == 0:
                        state.head = data[:_HEAD_BYTES]
                    state.consume(data)
                return state
        except FileNotFoundError:
            return None


def _view(state: _FileState) -> MetricsView:
    series: dict[str, tuple[list[Point], bool]] = {}
    if state.loss.points.count:
        series["loss"] = (state.loss.points.points(), state.loss.by_step)
    if state.other_key is not None and state.other.points.count:
        series[state.other_key] = (state.other.points.points(), state.other.by_step)
    fraction = 1.0 if state.size <= 0 else min(1.0, state.offset / state.size)
    return MetricsView(records=state.records, recent=list(state.recent), series=series, read_fraction=fraction)
