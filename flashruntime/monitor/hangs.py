"""Telling a hung attempt from a slow one: what counts as progress, how long an attempt may go
without it, and which ranks stopped first.

Progress comes from three sources, in order of trust: the torch helper's per-rank heartbeats
(``ranks/rank-<r>.json``, with step and ts), the steps of ``metrics.jsonl``, and any output to
the attempt's log. Once a more trusted source has appeared, the less trusted ones no longer
count: a rank's helper threads may go on printing while its training loop is stuck. Everything
here is pure (readings and the clock come in as arguments) except ``read_progress``, which
takes one reading of an attempt directory.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from flashruntime.monitor.records import finite_number, json_object, last_step_record
from flashruntime.rank_files import RANKS_DIR, heartbeat_paths

__all__ = [
    "FLOOR_S",
    "HEARTBEATS",
    "LOG",
    "METRICS",
    "STEP_TIMES",
    "Hang",
    "Progress",
    "ProgressReading",
    "RankBeat",
    "hang_timeout",
    "judge",
    "observe",
    "read_progress",
]

HEARTBEATS, METRICS, LOG = "heartbeats", "metrics.jsonl", "log"
_TRUST = {None: 0, LOG: 1, METRICS: 2, HEARTBEATS: 3}
STEP_TIMES = 10.0  # the default timeout, in median step times ...
FLOOR_S = 60.0  # ... and never less than this
_SAMPLES = 64  # the step-time samples the median is taken over (the newest)


@dataclass(frozen=True)
class RankBeat:
    """One rank's heartbeat as last read: its step, the wall time (``ts``) it wrote it, and whether
    the rank said it is exiting (its script ended: what follows is the interpreter's teardown)."""

    rank: int
    step: int | None
    ts: float | None
    pid: int | None = None
    exiting: bool = False


@dataclass(frozen=True)
class ProgressReading:
    """One look at an attempt: every rank's heartbeat, the last step of ``metrics.jsonl`` (with
    its ts) and the size of the attempt's log."""

    beats: tuple[RankBeat, ...] = ()
    metrics_step: int | None = None
    metrics_ts: float | None = None
    log_size: int = 0

    def source(self) -> str | None:
        """The most trusted source this reading has."""
        if self.beats:
            return HEARTBEATS
        if self.metrics_step is not None:
            return METRICS
        return LOG if self.log_size > 0 else None

    def mark(self, source: str | None) -> Any:
        """What must change in ``source`` for it to count as progress (None: the reading lacks it)."""
        if source == HEARTBEATS:
            return tuple(sorted((b.rank, b.step, b.ts, b.exiting) for b in self.beats)) if self.beats else None
        if source == METRICS:
            return None if self.metrics_step is None else (self.metrics_step, self.metrics_ts)
        if source == LOG:
            return self.log_size if self.log_size > 0 else None
        return None

    def top_step(self, source: str | None) -> int | None:
        if source == HEARTBEATS:
            steps = [b.step for b in self.beats if b.step is not None]
            return max(steps) if steps else None
        return self.metrics_step if source == METRICS else None


@dataclass(frozen=True)
class Progress:
    """What the watch has learned of one attempt so far; ``observe`` returns the next one.
    Times are readings of the watch's own (monotonic) clock."""

    started_at: float
    source: str | None = None
    mark: Any = None
    advanced: bool = False  # the source changed at least once after it appeared: the script is in its loop
    last_progress_at: float | None = None
    top_step: int | None = None
    top_step_at: float | None = None
    step_times: tuple[float, ...] = ()
    ranks: tuple[RankBeat, ...] = ()
    rank_changed_at: dict[int, float] = field(default_factory=dict)

    @property
    def median_step_s(self) -> float | None:
        return statistics.median(self.step_times) if self.step_times else None


def observe(progress: Progress, reading: ProgressReading, now: float) -> Progress:
    """``progress`` after ``reading``, taken at ``now``. Sources only ever rise in trust: a
    reading that lacks the source in use (a heartbeat file being replaced) changes nothing."""
    source = reading.source()
    if _TRUST[source] < _TRUST[progress.source]:
        source = progress.source
    mark = reading.mark(source)
    if mark is None:
        return progress
    changes: dict[str, Any] = {}
    switched = source != progress.source
    if switched:
        # A step record is written once its step is done: progress made, however soon after it
        # the watch first looked. Not so a heartbeat (``prepare`` beats before the first step)
        # or output (a start prints too).
        stepped = source == METRICS and reading.top_step(source) is not None
        changes.update(source=source, mark=mark, advanced=stepped, last_progress_at=now, top_step=None,
                       top_step_at=None)
    elif mark != progress.mark:
        changes.update(mark=mark, advanced=True, last_progress_at=now)
    top = reading.top_step(source)
    previous_top = None if switched else progress.top_step
    previous_at = None if switched else progress.top_step_at
    if top is not None and (previous_top is None or top > previous_top):
        if previous_top is not None and previous_at is not None:
            sample = (now - previous_at) / (top - previous_top)
            changes["step_times"] = (*progress.step_times, sample)[-_SAMPLES:]
        changes.update(top_step=top, top_step_at=now)
    if source == HEARTBEATS:
        before = {b.rank: b for b in progress.ranks}
        changed = dict(progress.rank_changed_at)
        for beat in reading.beats:
            old = before.get(beat.rank)
            if old is None or (old.step, old.ts, old.exiting) != (beat.step, beat.ts, beat.exiting):
                changed[beat.rank] = now
        changes.update(ranks=tuple(sorted(reading.beats, key=lambda b: b.rank)), rank_changed_at=changed)
    return replace(progress, **changes) if changes else progress


def hang_timeout(setting: float | None, median_step_s: float | None, source: str | None,
                 floor_s: float = FLOOR_S) -> float | None:
    """Seconds without progress that make a hang, None when nothing can be judged. ``setting``
    (``hang_timeout_s``) wins when given; without it, once step times are known (heartbeats or
    ``metrics.jsonl``), ``max(10 x median step time, floor_s)`` (60 s; more where the run may
    be silent longer, as a multi-node group meeting again); a log without steps says nothing
    of how long a step may take, so it is judged only against a setting."""
    if setting is not None:
        return float(setting) if setting > 0 else None
    if source in (HEARTBEATS, METRICS) and median_step_s is not None:
        return max(STEP_TIMES * median_step_s, floor_s)
    return None


@dataclass(frozen=True)
class Hang:
    """No progress for ``idle_s`` (≥ ``timeout_s``) by ``source``. ``stalled``: the ranks that
    stopped advancing (the lowest step; where every rank is at it, those whose heartbeat stopped
    first), with ``stopped_s`` seconds since each rank's heartbeat last changed."""

    idle_s: float
    timeout_s: float
    source: str
    last_step: int | None
    stalled: tuple[RankBeat, ...] = ()
    ranks: tuple[RankBeat, ...] = ()
    stopped_s: dict[int, float] = field(default_factory=dict)
    median_step_s: float | None = None

    def describe(self) -> str:
        """One line: how long without progress, against what timeout, and who stopped where."""
        text = f"no progress for {self.idle_s:.1f} s (hang timeout {self.timeout_s:g} s, by {self.source})"
        if self.stalled:
            names = ", ".join(str(b.rank) for b in self.stalled)
            step = self.stalled[0].step
            ago = max(self.stopped_s.get(b.rank, self.idle_s) for b in self.stalled)
            everyone = all(b.step == step for b in self.ranks if not b.exiting)
            who = f"rank{'s' if len(self.stalled) > 1 else ''} {names}"
            if everyone and len(self.ranks) > 1:
                text += f": every rank stopped at step {step}; {who} stopped first ({ago:.1f} s ago)"
            else:
                others = ", ".join(f"rank {b.rank} at step {b.step}" for b in self.ranks if b not in self.stalled)
                text += f": {who} stopped advancing at step {step} ({ago:.1f} s ago)"
                if others:
                    text += f"; {others}"
        elif self.last_step is not None:
            text += f": last step {self.last_step}"
        return text

    def as_json(self) -> dict[str, Any]:
        return {
            "idle_s": round(self.idle_s, 3), "timeout_s": self.timeout_s, "source": self.source,
            "last_step": self.last_step,
            "median_step_s": None if self.median_step_s is None else round(self.median_step_s, 6),
            "stalled_ranks": [{"rank": b.rank, "step": b.step, "pid": b.pid} for b in self.stalled],
            "ranks": [{"rank": b.rank, "step": b.step, "pid": b.pid,
                       "stopped_s": round(self.stopped_s.get(b.rank, self.idle_s), 3)} for b in self.ranks],
        }


def _stalled(ranks: tuple[RankBeat, ...], changed_at: dict[int, float]) -> tuple[RankBeat, ...]:
    known = [b for b in ranks if b.step is not None and not b.exiting]
    if not known:
        return ()
    lowest = min(b.step for b in known)  # type: ignore[type-var]
    behind = [b for b in known if b.step == lowest]
    if len(behind) == len(known) and len(behind) > 1:  # all at one step (DDP: everyone blocks): who went quiet first
        first = min(changed_at.get(b.rank, 0.0) for b in behind)
        behind = [b for b in behind if changed_at.get(b.rank, 0.0) == first]
    return tuple(behind)


def judge(progress: Progress, now: float, setting: float | None, floor_s: float = FLOOR_S) -> Hang | None:
    """The hang ``progress`` shows at ``now``, or None. Nothing is judged before the source in use
    has advanced once, or shown a step done (imports, data loading and rendezvous take what
    they take), nor without a timeout (see ``hang_timeout``), nor once every rank has said it is
    exiting (a teardown, however slow, is no training step)."""
    if not progress.advanced or progress.source is None or progress.last_progress_at is None:
        return None
    if progress.ranks and all(b.exiting for b in progress.ranks):
        return None
    median = progress.median_step_s
    timeout = hang_timeout(setting, median, progress.source, floor_s)
    idle = now - progress.last_progress_at
    if timeout is None or idle < timeout:
        return None
    stopped = {rank: now - at for rank, at in progress.rank_changed_at.items()}
    return Hang(idle_s=idle, timeout_s=timeout, source=progress.source, last_step=progress.top_step,
                stalled=_stalled(progress.ranks, progress.rank_changed_at), ranks=progress.ranks,
                stopped_s=stopped, median_step_s=median)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_progress(attempt_dir: Path, log_name: str) -> ProgressReading:
    """One reading of ``attempt_dir``: its ranks' heartbeats, the last step of its
    ``metrics.jsonl`` and the size of its log ``log_name``. Never raises."""
    beats = []
    for path in heartbeat_paths(attempt_dir / RANKS_DIR):
        record = json_object(path)
        rank = None if record is None else _int(record.get("rank"))
        if record is not None and rank is not None:
            beats.append(RankBeat(rank, _int(record.get("step")), finite_number(record.get("ts")),
                                  _int(record.get("pid")), exiting=record.get("exiting") is True))
    last = last_step_record(attempt_dir / "metrics.jsonl")
    step, ts = (None, None) if last is None else (last["step"], finite_number(last.get("ts")))
    try:
        size = (attempt_dir / log_name).stat().st_size
    except OSError:
        size = 0
    return ProgressReading(beats=tuple(beats), metrics_step=step, metrics_ts=ts, log_size=size)
