"""While an attempt runs: watch its progress and, once it has made none for the hang timeout
(``flashruntime.monitor.hangs`` judges), record a ``HANG_DETECTED`` event, dump every rank's
Python stack into the attempt's ``hang-stacks.txt`` and stop the attempt's processes, so the
attempt loop classifies the failure ``hang`` and relaunches it from the last valid checkpoint.
The thread only reads, asks ``judge`` and acts once.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flashruntime.errors import InvalidSubmission
from flashruntime.launchers.local import LOG_NAME
from flashruntime.monitor.exits import rank_of
from flashruntime.monitor.hangs import FLOOR_S, Hang, Progress, judge, observe, read_progress
from flashruntime.monitor.stacks import STACKS_NAME, dump_stacks, render_stacks
from flashruntime.periodic import Periodic

__all__ = ["ENV", "HangVerdict", "HangWatch", "ReportedHang", "hang_setting", "stop_processes"]

ENV = "FLASHML_HANG_TIMEOUT_S"
PERIOD_S = 0.5
STOP_GRACE_S = 5.0  # SIGTERM, then SIGKILL: a hung rank has nothing left to save
_POLL_S = 0.05
_MOST_UNRANKED = 16  # processes of a command without ranks whose stacks are dumped


def hang_setting(value: float | None, environ: Mapping[str, str]) -> float | None:
    """The hang timeout a run uses: ``value`` (``flash.submit(hang_timeout_s=...)``), else
    ``$FLASHML_HANG_TIMEOUT_S``, else None (the default rule of ``hang_timeout``); 0 turns the
    watch off. Raises ``InvalidSubmission`` for anything but a finite number >= 0."""
    where = "hang_timeout_s"
    if value is None:
        raw = environ.get(ENV, "").strip()
        if not raw:
            return None
        where = ENV
        try:
            value = float(raw)
        except ValueError:
            raise InvalidSubmission(f"{ENV}={raw!r} is not a number of seconds; set it to e.g. 300, or 0 to turn "
                                    "the hang watch off") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise InvalidSubmission(f"{where} must be a finite number of seconds >= 0 (0 turns the hang watch off), "
                                f"got {value!r}")
    return float(value)


def task_hang_setting(task_env: Mapping[str, str], machine_setting: float | None) -> float | None:
    """The hang timeout of a fleet task: its job's own ``FLASHML_HANG_TIMEOUT_S`` (in the
    command's ``parameters.env``) where it sets one, else the machine's setting. A value that
    is not a number of seconds >= 0 raises ``InvalidSubmission``."""
    if task_env.get(ENV, "").strip():
        return hang_setting(None, task_env)
    return machine_setting


@dataclass(frozen=True)
class HangVerdict:
    """What the watch found and did: the hang, when it was seen (wall time), where the stacks are
    and how each rank's was taken."""

    hang: Hang
    detected_at: float
    stacks_path: Path
    methods: dict[str, str]  # "rank 1" -> "py-spy"

    def evidence(self) -> str:
        taken = ", ".join(f"{who}: {method}" for who, method in self.methods.items()) or "none"
        return f"{self.hang.describe()}; stacks ({taken}) in {self.stacks_path}"

    def as_json(self) -> dict[str, Any]:
        return {**self.hang.as_json(), "detected_at": self.detected_at, "stacks": str(self.stacks_path),
                "stack_methods": dict(self.methods)}


@dataclass(frozen=True)
class ReportedHang:
    """A ``HangVerdict`` as it crossed a process boundary (a Ray task reports the one its watch
    reached on the attempt's node): the same evidence and document."""

    words: str
    document: dict[str, Any]

    @classmethod
    def of(cls, verdict: HangVerdict) -> ReportedHang:
        return cls(verdict.evidence(), verdict.as_json())

    def evidence(self) -> str:
        return self.words

    def as_json(self) -> dict[str, Any]:
        return dict(self.document)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except OSError:
        pass


def stop_processes(find: Callable[[], set[int]], grace_s: float, *, clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> None:
    """SIGTERM every process ``find`` names, and SIGCONT it (a stopped rank acts on its pending
    SIGTERM only once continued); SIGKILL what is left after ``grace_s``."""
    pids = find()
    for pid in pids:
        _signal(pid, signal.SIGTERM)
        _signal(pid, signal.SIGCONT)
    deadline = clock() + grace_s
    while pids and clock() < deadline:
        sleep(_POLL_S)
        pids = find()
    for pid in pids:
        _signal(pid, signal.SIGKILL)


class HangWatch:
    """Watch ``handle`` (a local attempt) until ``stop()``; ``setting``: the run's hang timeout
    (see ``hang_setting``); ``floor_s``: the least timeout of the default rule (``hangs.hang_timeout``).
    ``record_event(type, message)`` records the detection."""

    def __init__(self, handle: Any, attempt_id: str, setting: float | None,
                 record_event: Callable[[str, str], None], *, period_s: float = PERIOD_S,
                 clock: Callable[[], float] = time.monotonic, use_py_spy: bool = True,
                 floor_s: float = FLOOR_S) -> None:
        self._floor_s = floor_s
        self._handle = handle
        self._dir = Path(handle.output_dir)
        self._attempt_id = attempt_id
        self._setting = setting
        self._record_event = record_event
        self._clock = clock
        self._use_py_spy = use_py_spy
        self._progress = Progress(started_at=clock())
        self.verdict: HangVerdict | None = None
        self._periodic = Periodic(self.tick, period_s, "flashruntime-hang-watch", last_tick=False)

    def start(self) -> HangWatch:
        self._periodic.start()
        return self

    def stop(self) -> HangVerdict | None:
        """Stop watching (after a detection in progress has stopped the attempt); the verdict, if any."""
        self._periodic.stop()
        return self.verdict

    def tick(self) -> bool | None:
        """One look; on a hang, act and end the watch. Never raises: watching never fails an attempt."""
        try:
            now = self._clock()
            self._progress = observe(self._progress, read_progress(self._dir, LOG_NAME), now)
            hang = judge(self._progress, now, self._setting, self._floor_s)
            if hang is None:
                return None
            self._act(hang)
        except Exception:  # noqa: BLE001 - a broken look is no hang; the attempt goes on
            return None
        return False

    def _act(self, hang: Hang) -> None:
        path = self._dir / STACKS_NAME
        detected_at = time.time()
        self._record_event("HANG_DETECTED", f"{self._attempt_id}: {hang.describe()}; every rank's stack → {path}")
        processes = self._ranks(hang)
        stacks = dump_stacks(processes, self._dir / "ranks", use_py_spy=self._use_py_spy)
        path.write_text(render_stacks(stacks, f"{self._attempt_id}: {hang.describe()}"), encoding="utf-8")
        methods = {("process" if s.rank is None else f"rank {s.rank}"): s.method for s in stacks}
        self.verdict = HangVerdict(hang, detected_at, path, methods)
        stop_processes(self._handle.processes, STOP_GRACE_S)

    def _ranks(self, hang: Hang) -> dict[int, int | None]:
        """pid -> rank of the attempt's ranks: the heartbeats' pids, else each rank's first process
        (by the ``RANK`` it was started with); when it has no ranks, each of its processes (up to
        ``_MOST_UNRANKED``): the command may run under a launcher of its own (a sandbox's)."""
        live = self._handle.processes()
        ranks: dict[int, int | None] = {b.pid: b.rank for b in hang.ranks if b.pid is not None and b.pid in live}
        named = set(ranks.values())
        for pid in sorted(live):
            rank = rank_of(pid)
            if rank is not None and rank not in named:
                ranks[pid] = rank
                named.add(rank)
        if not ranks:
            leader = int(self._handle.execution_id)
            for pid in [leader, *sorted(live - {leader})][:_MOST_UNRANKED]:
                ranks[pid] = None
        return ranks
