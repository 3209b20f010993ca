"""The goodput ledger of a local run: how much of its wall time went into steps that count.

Every run gets one, chaos or not, computed from ``run.json`` and each attempt's
``metrics.jsonl`` (the torch helper stamps every record with ``ts``, when its step ended):

- **useful step time**: the time between consecutive records of an attempt, for the steps
  that made it into the final result. A step an attempt logged beyond the checkpoint the
  next attempt resumed from was recomputed, and does not count. The first record of each
  attempt is counted with the attempt's startup, which is not useful time.
- **goodput** = useful step time ÷ wall time; **lost work** = wall time − useful step time.
- for each failed attempt that was relaunched, a **recovery**: MTTD (from the fault — an
  injected one, else the attempt's last step — to the failure being seen), MTTR (from then
  to the relaunched attempt's first step), and the steps recomputed.
- **hung**: of the lost work, the time attempts the hang watch stopped spent without progress
  before it saw them (each from its last progress to the detection).
- **at each world size** (an elastic run's attempts say theirs): the useful step time and the
  steps kept at that many ranks.
- **preempted**: of the lost work, the time preempted attempts took from the notice to their
  end (saving the agreed step and leaving), apart from the hung time.

The ledger reads each ``metrics.jsonl`` once, front to back, keeping sums only, so a long
history costs no memory. Records without an integer ``step`` or a numeric ``ts`` are
skipped; a run whose steps carry no ``ts`` has no timed figures (``timed`` is false).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from flashruntime.goodput.report import line, seconds
from flashruntime.monitor.records import finite_number
from flashruntime.monitor.records import step_records as metrics_records

__all__ = [
    "AttemptSteps",
    "GoodputLedger",
    "Recovery",
    "goodput_ledger",
    "ledger_lines",
    "ledger_of_run",
    "step_records",
]

METRICS_FILE = "metrics.jsonl"
_ENDS_AN_ATTEMPT = frozenset({"kill_rank", "lose_rank", "kill_attempt", "hang_forever"})
_RESUMES = re.compile(r"^(\S+) (?:resumes from step ([0-9]+)|starts at step 0)")


@dataclass(frozen=True)
class AttemptSteps:
    """What one attempt's records add up to, given the step its successor resumed from."""

    first_ts: float | None
    last_ts: float | None
    last_step: int | None
    useful_s: float
    steps_kept: int
    steps_recomputed: int


@dataclass(frozen=True)
class Recovery:
    failed_attempt: str
    next_attempt: str
    fault_at: float | None  # the injected fault, else the failed attempt's last step
    injected: bool
    detected_at: float | None
    progress_again_at: float | None  # the next attempt's first step
    resumed_from_step: int | None
    steps_recomputed: int
    mttd_s: float | None
    mttr_s: float | None
    hang_s: float | None = None  # a hang: how long it went without progress until the watch saw it


@dataclass(frozen=True)
class GoodputLedger:
    wall_s: float | None
    useful_s: float
    goodput: float | None
    lost_work_s: float | None
    steps: int  # the steps of the final result
    steps_recomputed: int
    restarts: int
    timed: bool
    recoveries: tuple[Recovery, ...]
    hung_s: float = 0.0  # of the lost work: attempts hung, from their last progress to the detection
    preempted_s: float = 0.0  # of the lost work: attempts preempted, from the notice to their end (the save)
    # An elastic run's (world size, useful step time, steps kept), largest size first; empty otherwise.
    world_sizes: tuple[tuple[int, float, int], ...] = ()

    def as_json(self) -> dict[str, Any]:
        document = asdict(self)
        document["recoveries"] = list(document["recoveries"])
        return document


def step_records(path: Path) -> Iterator[tuple[int, float]]:
    """``(step, ts)`` of each usable line of a ``metrics.jsonl``, in file order (streamed)."""
    return ((step, ts) for step, ts, _record in metrics_records(path))


def attempt_steps(records: Iterable[tuple[int, float]], kept_through: float) -> AttemptSteps:
    """Sum one attempt's records: steps up to ``kept_through`` (the step its successor
    resumed from; infinity for the last attempt) are kept, later ones were recomputed."""
    first = last = None
    last_step = None
    useful, kept, recomputed = 0.0, 0, 0
    for step, ts in records:
        if step <= kept_through:
            kept += 1
            if last is not None and ts >= last:
                useful += ts - last
        else:
            recomputed += 1
        first = ts if first is None else first
        last, last_step = ts, step
    return AttemptSteps(first, last, last_step, useful, kept, recomputed)


def goodput_ledger(
    document: dict[str, Any], records_of: Callable[[dict[str, Any]], Iterable[tuple[int, float]]],
    *, now: float | None = None,
) -> GoodputLedger:
    """The ledger of the run ``document`` (a ``run.json``), reading each attempt's step
    records through ``records_of(attempt_row)``. Pure apart from what ``records_of`` reads."""
    attempts = [row for row in document.get("attempts") or [] if isinstance(row, dict)]
    resumed_from: dict[str, int] = {}
    for event in document.get("events") or []:
        if isinstance(event, dict) and event.get("type") == "RESUME_SELECTED":
            match = _RESUMES.match(str(event.get("message", "")))
            if match:
                resumed_from[match.group(1)] = int(match.group(2) or 0)
    # The fault an attempt's failure is timed from: the last kill injected into it, else the
    # last fault of any kind (a corrupted checkpoint does not end an attempt; a kill does).
    injected: dict[str, tuple[bool, float]] = {}
    for fault in (document.get("chaos") or {}).get("injected") or []:
        if not isinstance(fault, dict) or not fault.get("done") or finite_number(fault.get("ts")) is None:
            continue
        attempt_id, kill = str(fault.get("attempt_id")), fault.get("kind") in _ENDS_AN_ATTEMPT
        if kill or not injected.get(attempt_id, (False, 0.0))[0]:
            injected[attempt_id] = (kill, float(fault["ts"]))

    by_job: dict[str, list[dict[str, Any]]] = {}
    for row in attempts:
        by_job.setdefault(str(row.get("job_id")), []).append(row)
    useful, kept, recomputed, timed = 0.0, 0, 0, False
    recoveries: list[Recovery] = []
    at_size: dict[int, list[float]] = {}  # world size -> [useful s, steps kept]
    for rows in by_job.values():
        sums = []
        for index, row in enumerate(rows):
            successor = rows[index + 1] if index + 1 < len(rows) else None
            through = math.inf if successor is None else resumed_from.get(str(successor.get("attempt_id")), 0)
            sums.append(attempt_steps(records_of(row), through))
        for index, (row, steps) in enumerate(zip(rows, sums)):
            useful += steps.useful_s
            kept += steps.steps_kept
            recomputed += steps.steps_recomputed
            timed = timed or steps.first_ts is not None
            size = row.get("world_size")
            if isinstance(size, int) and not isinstance(size, bool):
                sums_at = at_size.setdefault(size, [0.0, 0])
                sums_at[0] += steps.useful_s
                sums_at[1] += steps.steps_kept
            if index + 1 < len(rows):
                recoveries.append(_recovery(row, rows[index + 1], steps, sums[index + 1], resumed_from, injected))
    started, finished = finite_number(document.get("started_at")), finite_number(document.get("finished_at"))
    end = finished if finished is not None else now
    wall = None if started is None or end is None else max(0.0, end - started)
    return GoodputLedger(
        wall_s=wall, useful_s=useful,
        goodput=(useful / wall) if timed and wall else None,
        lost_work_s=(wall - useful) if timed and wall is not None else None,
        steps=kept, steps_recomputed=recomputed, restarts=sum(len(rows) - 1 for rows in by_job.values()),
        timed=timed, recoveries=tuple(recoveries),
        hung_s=sum(idle for idle in (_hang_idle(row) for row in attempts) if idle is not None),
        preempted_s=sum(ended for ended in (_preemption_s(row) for row in attempts) if ended is not None),
        world_sizes=tuple((size, total, int(count)) for size, (total, count) in sorted(at_size.items(), reverse=True)),
    )


def _preemption_s(row: dict[str, Any]) -> float | None:
    """How long a preempted attempt took from the notice to its end (saving, leaving), or None."""
    preempted = row.get("preempted")
    return finite_number(preempted.get("ended_in_s")) if isinstance(preempted, dict) else None


def _hang(row: dict[str, Any]) -> dict[str, Any] | None:
    failure = row.get("failure")
    hang = failure.get("hang") if isinstance(failure, dict) else None
    return hang if isinstance(hang, dict) else None


def _hang_idle(row: dict[str, Any]) -> float | None:
    hang = _hang(row)
    return None if hang is None else finite_number(hang.get("idle_s"))


def _recovery(row: dict[str, Any], successor: dict[str, Any], steps: AttemptSteps, next_steps: AttemptSteps,
              resumed_from: dict[str, int], injected: dict[str, tuple[bool, float]]) -> Recovery:
    attempt_id, next_id = str(row.get("attempt_id")), str(successor.get("attempt_id"))
    fault_at = injected[attempt_id][1] if attempt_id in injected else steps.last_ts
    hang = _hang(row)
    # A hang is seen when the watch judges it, before the stack dumps and the stop that end the attempt.
    detected = finite_number(hang.get("detected_at")) if hang is not None else None
    if detected is None:
        detected = finite_number(row.get("finished_at"))
    progress = next_steps.first_ts
    return Recovery(
        failed_attempt=attempt_id, next_attempt=next_id, fault_at=fault_at, injected=attempt_id in injected,
        detected_at=detected, progress_again_at=progress, resumed_from_step=resumed_from.get(next_id),
        steps_recomputed=steps.steps_recomputed,
        mttd_s=None if fault_at is None or detected is None else max(0.0, detected - fault_at),
        mttr_s=None if detected is None or progress is None else max(0.0, progress - detected),
        hang_s=_hang_idle(row),
    )


def ledger_of_run(run_dir: str | Path, *, now: float | None = None) -> GoodputLedger:
    """The ledger of the run in ``run_dir`` (its ``run.json`` and attempts' ``metrics.jsonl``).
    Raises ``OSError`` / ``ValueError`` when run.json cannot be read."""
    document = json.loads((Path(run_dir) / "run.json").read_text(encoding="utf-8"))
    if not isinstance(document, dict):
        raise ValueError(f"{run_dir}/run.json is not a run document")

    def records(row: dict[str, Any]) -> Iterator[tuple[int, float]]:
        output = row.get("output_dir")
        return step_records(Path(output) / METRICS_FILE) if isinstance(output, str) else iter(())

    return goodput_ledger(document, records, now=now)


def logged_steps(document: dict[str, Any]) -> bool:
    """Whether any attempt of the run in ``document`` (its run.json) wrote a ``metrics.jsonl``."""
    attempts = document.get("attempts")
    return any(isinstance(row, dict) and isinstance(row.get("output_dir"), str)
               and (Path(row["output_dir"]) / METRICS_FILE).is_file()
               for row in (attempts if isinstance(attempts, list) else ()))


def ledger_lines(ledger: GoodputLedger, label_width: int = 10, *, steps_logged: bool = True) -> list[str]:
    """The ledger as the report lines ``flashruntime runs --show`` and ``chaos`` print.
    ``steps_logged``: whether the run wrote a ``metrics.jsonl`` at all (else the goodput line
    says that, not that its steps lack times)."""
    lines = []
    for recovery in ledger.recoveries:
        resumed = "-" if recovery.resumed_from_step is None else str(recovery.resumed_from_step)
        cause = "the fault" if recovery.injected else "its last step"
        hung = "" if recovery.hang_s is None else f", hung {seconds(recovery.hang_s)} without progress"
        lines.append(line("recovery", (
            f"{recovery.failed_attempt} -> {recovery.next_attempt}: MTTD {seconds(recovery.mttd_s)} (from {cause}), "
            f"MTTR {seconds(recovery.mttr_s)}, resumed from step {resumed}, "
            f"{recovery.steps_recomputed} steps recomputed{hung}"), label_width))
    if ledger.timed and ledger.goodput is not None:
        lines.append(line("goodput", (
            f"{ledger.goodput:.1%} (useful step time {seconds(ledger.useful_s)} of {seconds(ledger.wall_s)} wall; "
            f"lost work {seconds(ledger.lost_work_s)}"
            f"{f', of it hung {seconds(ledger.hung_s)}' if ledger.hung_s else ''}"
            f"{f', of it ending in a preemption {seconds(ledger.preempted_s)}' if ledger.preempted_s else ''}; "
            f"{ledger.steps} steps kept, "
            f"{ledger.steps_recomputed} recomputed, {ledger.restarts} restart{'' if ledger.restarts == 1 else 's'})"), label_width))
        if ledger.world_sizes:
            lines.append(line("sizes", ", ".join(
                f"{size} rank{'' if size == 1 else 's'} {seconds(useful)} ({steps} steps)"
                for size, useful, steps in ledger.world_sizes), label_width))
    elif not steps_logged:
        lines.append(line("goodput", "not timed: the run logged no steps (a metrics.jsonl line per step, with its "
                                     "step and ts; flashruntime.torch's log_metrics writes them)", label_width))
    else:
        lines.append(line("goodput", "not timed: the steps in metrics.jsonl carry no ts (flashruntime.torch's "
                                     "log_metrics adds it)", label_width))
    return lines
