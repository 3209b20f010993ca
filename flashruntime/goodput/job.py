"""The goodput ledger of a coordinator job, from its events alone.

A fleet job's tasks run in parallel on many machines, so its figure of merit is machine
time, not wall time. Every lease is one attempt, from its ``LEASE_CLAIMED`` to the event
that ended it:

- **machine time**: the sum of every attempt's duration; **useful time**: that of the
  attempts whose output was accepted (``TASK_COMMIT_ACCEPTED``); **goodput** = useful ÷
  machine time; **lost work** = machine − useful time (attempts that failed, expired,
  were given back or cancelled).
- for each attempt that ended without a commit and was followed by another attempt of the
  same task, a **recovery**: MTTD, from the attempt's last sign of life (its claim or its
  last ``LEASE_RENEWED``) to the end being known (a failure or release reported by the
  worker, an expiry found by the sweeper), and MTTR, from then to the task's next claim.

An attempt still running counts up to ``now`` (else the newest event). Events of other
kinds are ignored; the events may come in any order. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import datetime
from itertools import pairwise
from typing import Any

from flashruntime.goodput.report import line, seconds
from flashruntime.protocol.v1alpha1 import Event, EventType

__all__ = ["JobGoodput", "JobRecovery", "job_goodput", "job_goodput_lines"]

# The event that ends a lease, and what the end is called in a recovery line.
_ENDS: dict[EventType, str] = {
    EventType.TASK_COMMIT_ACCEPTED: "committed",
    EventType.TASK_ATTEMPT_FAILED: "failed",
    EventType.LEASE_EXPIRED: "expired",
    EventType.TASK_CANCELLED: "cancelled",
    EventType.LEASE_RELEASED: "released",  # a worker that was shutting down gave it back
}
_JOB_ENDS = frozenset({EventType.JOB_SUCCEEDED, EventType.JOB_FAILED})


@dataclass(frozen=True)
class JobRecovery:
    task_id: str
    lease_id: str
    node_id: str | None
    cause: str  # failed, expired, abandoned, released
    last_alive_at: datetime
    detected_at: datetime
    next_claim_at: datetime
    next_node_id: str | None
    mttd_s: float
    mttr_s: float


@dataclass(frozen=True)
class JobGoodput:
    attempts: int
    committed: int
    running: int
    machine_s: float
    useful_s: float
    lost_work_s: float
    goodput: float | None  # None until some attempt has taken time
    wall_s: float | None  # the job's first event to its end (or ``now``)
    recoveries: tuple[JobRecovery, ...]

    def as_json(self) -> dict[str, Any]:
        document = asdict(self)
        document["recoveries"] = [
            {**row, "last_alive_at": row["last_alive_at"].isoformat(), "detected_at": row["detected_at"].isoformat(),
             "next_claim_at": row["next_claim_at"].isoformat()}
            for row in document["recoveries"]
        ]
        return document


@dataclass
class _Attempt:
    task_id: str
    lease_id: str
    node_id: str | None
    claimed_at: datetime
    last_alive_at: datetime
    ended_at: datetime | None = None
    end: str | None = None


def _seconds(later: datetime, earlier: datetime) -> float:
    return max(0.0, (later - earlier).total_seconds())


def job_goodput(events: Iterable[Event], *, now: datetime | None = None) -> JobGoodput:
    """The ledger of one job from its events (``GET /v1alpha1/jobs/{id}/events``)."""
    ordered = sorted(events, key=lambda event: event.timestamp)
    attempts: dict[str, _Attempt] = {}
    first_at = ordered[0].timestamp if ordered else None
    finished_at: datetime | None = None
    for event in ordered:
        kind, data = event.type, event.data
        if kind in _JOB_ENDS:
            finished_at = event.timestamp
            continue
        lease_id = data.get("lease_id")
        if not isinstance(lease_id, str):
            continue
        if kind is EventType.LEASE_CLAIMED:
            node = data.get("node_id")
            attempts[lease_id] = _Attempt(str(data.get("task_id")), lease_id, node if isinstance(node, str) else None,
                                          event.timestamp, event.timestamp)
            continue
        attempt = attempts.get(lease_id)
        if attempt is None or attempt.end is not None:
            continue  # a lease claimed before the events we were given, or a second end of one
        if kind is EventType.LEASE_RENEWED:
            attempt.last_alive_at = event.timestamp
        elif kind in _ENDS:
            attempt.end = "abandoned" if kind is EventType.LEASE_EXPIRED and data.get("abandoned") else _ENDS[kind]
            attempt.ended_at = event.timestamp
    newest = ordered[-1].timestamp if ordered else None
    until = now if now is not None else newest
    machine = useful = 0.0
    running = committed = 0
    by_task: dict[str, list[_Attempt]] = {}
    for attempt in attempts.values():
        by_task.setdefault(attempt.task_id, []).append(attempt)
        end = attempt.ended_at if attempt.ended_at is not None else until
        took = _seconds(end, attempt.claimed_at) if end is not None else 0.0
        machine += took
        if attempt.end == "committed":
            useful += took
            committed += 1
        elif attempt.end is None:
            running += 1
    recoveries = []
    for task_id, chain in by_task.items():
        chain.sort(key=lambda attempt: attempt.claimed_at)
        for attempt, successor in pairwise(chain):
            if attempt.ended_at is None or attempt.end in ("committed", "cancelled"):
                continue
            recoveries.append(JobRecovery(
                task_id=task_id, lease_id=attempt.lease_id, node_id=attempt.node_id, cause=str(attempt.end),
                last_alive_at=attempt.last_alive_at, detected_at=attempt.ended_at,
                next_claim_at=successor.claimed_at, next_node_id=successor.node_id,
                mttd_s=_seconds(attempt.ended_at, attempt.last_alive_at),
                mttr_s=_seconds(successor.claimed_at, attempt.ended_at),
            ))
    recoveries.sort(key=lambda recovery: recovery.detected_at)
    wall_end = finished_at if finished_at is not None else until
    return JobGoodput(
        attempts=len(attempts), committed=committed, running=running, machine_s=machine, useful_s=useful,
        lost_work_s=machine - useful, goodput=(useful / machine) if machine > 0 else None,
        wall_s=None if first_at is None or wall_end is None else _seconds(wall_end, first_at),
        recoveries=tuple(recoveries),
    )


def job_goodput_lines(ledger: JobGoodput, label_width: int = 10) -> list[str]:
    """The ledger as the lines ``flashruntime goodput`` prints."""
    lines = []
    for recovery in ledger.recoveries:
        moved = "" if recovery.next_node_id is None else f" on {recovery.next_node_id}"
        lines.append(line("recovery", (
            f"{recovery.task_id} lease {recovery.lease_id} on {recovery.node_id or '-'} {recovery.cause}: "
            f"MTTD {seconds(recovery.mttd_s)} (from its last heartbeat), MTTR {seconds(recovery.mttr_s)} (to the next "
            f"claim{moved})"), label_width))
    if ledger.goodput is None:
        lines.append(line("goodput", "no attempt has taken time yet", label_width))
    else:
        running = f", {ledger.running} running" if ledger.running else ""
        lines.append(line("goodput", (
            f"{ledger.goodput:.1%} (useful machine time {seconds(ledger.useful_s)} of {seconds(ledger.machine_s)}; lost work "
            f"{seconds(ledger.lost_work_s)}; {ledger.attempts} attempt{'' if ledger.attempts == 1 else 's'}, "
            f"{ledger.committed} committed{running}; wall {seconds(ledger.wall_s)})"), label_width))
    return lines
