"""Lease jobs' state, derived from their tasks' counts: a pure rule and
the refresh that freezes a job once it is terminal."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from flashruntime.coordinator.gangs import is_gang
from flashruntime.protocol.v1alpha1 import Event, EventType, JobRecord, JobState

__all__ = ["TERMINAL_JOB_STATES", "derived_state", "refreshed"]

TERMINAL_JOB_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
LEASES_SOURCE = "flashruntime.leases"


def derived_state(counts: Mapping[str, int], *, gang: bool = False) -> JobState:
    """No tasks → PENDING; any PENDING or LEASED → RUNNING; else any FAILED → FAILED;
    all COMPLETED → SUCCEEDED; otherwise (some cancelled) CANCELLED. A multi-node job
    (``gang``) is one run: once its nodes have all ended, any node COMPLETED is its success
    (the group finished; a node it lost on the way, failed or cancelled as not needed, no more)."""
    total = sum(counts.values())
    if total == 0:
        return JobState.PENDING
    if counts.get("PENDING", 0) or counts.get("LEASED", 0):
        return JobState.RUNNING
    if gang and counts.get("COMPLETED", 0):
        return JobState.SUCCEEDED
    if counts.get("FAILED", 0):
        return JobState.FAILED
    if counts.get("COMPLETED", 0) == total:
        return JobState.SUCCEEDED
    return JobState.CANCELLED


def refreshed(record: JobRecord, counts: Mapping[str, int], now: datetime) -> tuple[JobRecord, Event | None]:
    """``record`` with its derived state; a terminal record is returned unchanged (frozen).
    Reaching SUCCEEDED or FAILED stamps ``finished_at`` and yields JOB_SUCCEEDED / JOB_FAILED."""
    if record.state in TERMINAL_JOB_STATES:
        return record, None
    state = derived_state(counts, gang=is_gang(record.spec))
    if state == record.state:
        return record, None
    update: dict[str, object] = {"state": state}
    event = None
    if state in TERMINAL_JOB_STATES:
        update["finished_at"] = now
        if state in (JobState.SUCCEEDED, JobState.FAILED):
            summary = ", ".join(f"{n} {name.lower()}" for name, n in sorted(counts.items()) if n)
            event = Event(
                job_id=record.job_id,
                type=EventType.JOB_SUCCEEDED if state is JobState.SUCCEEDED else EventType.JOB_FAILED,
                timestamp=now,
                source=LEASES_SOURCE,
                message=f"job {record.job_id} {state.value.lower()}: {summary}",
                data={"counts": dict(counts)},
            )
    return record.model_copy(update=update), event
