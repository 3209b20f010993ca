"""Lease jobs' state, derived from their tasks' counts: a pure rule and
the refresh that freezes a job once it is terminal."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from flashruntime.protocol.v1alpha1 import Event, EventType, JobRecord, JobState

__all__ = ["TERMINAL_JOB_STATES", "derived_state", "refreshed"]

TERMINAL_JOB_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
LEASES_SOURCE = "flashruntime.leases"


def derived_state(counts: Mapping[str, int], *, gang_result: bool | None = None) -> JobState:
    """No tasks → PENDING; any PENDING or LEASED → RUNNING; else any FAILED → FAILED;
    all COMPLETED → SUCCEEDED; otherwise (some cancelled) CANCELLED. A multi-node job is one
    run (``gang_result`` not None: whether a node committed the run's metrics): once its
    nodes have all ended it SUCCEEDS with that commit, whatever became of the nodes it lost
    on the way, and FAILS without it (a node's empty commit is no result)."""
    total = sum(counts.values())
    if total == 0:
        return JobState.PENDING
    if counts.get("PENDING", 0) or counts.get("LEASED", 0):
        return JobState.RUNNING
    if gang_result is not None:
        if gang_result:
            return JobState.SUCCEEDED
        return JobState.FAILED if counts.get("FAILED", 0) or counts.get("COMPLETED", 0) else JobState.CANCELLED
    if counts.get("FAILED", 0):
        return JobState.FAILED
    if counts.get("COMPLETED", 0) == total:
        return JobState.SUCCEEDED
    return JobState.CANCELLED


def refreshed(record: JobRecord, counts: Mapping[str, int], now: datetime,
              gang_result: bool | None = None) -> tuple[JobRecord, Event | None]:
    """``record`` with its derived state; a terminal record is returned unchanged (frozen).
    Reaching SUCCEEDED or FAILED stamps ``finished_at`` and yields JOB_SUCCEEDED / JOB_FAILED.
    ``gang_result``: see ``derived_state``."""
    if record.state in TERMINAL_JOB_STATES:
        return record, None
    state = derived_state(counts, gang_result=gang_result)
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
