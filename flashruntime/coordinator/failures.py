"""A coordinator task's failed attempt as an event: the class, the evidence, the recovery
policy's decision and whether the task runs again, for workers' tasks and the Ray backend alike;
and the reason a failed job records. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from flashruntime.protocol.v1alpha1 import Event, EventType, Lease
from flashruntime.recovery.policy import INDEPENDENT
from flashruntime.recovery.verdict import AttemptVerdict

__all__ = ["TASK_MODE", "failure_classified", "failure_reason"]

# Every coordinator task is judged as one task: a retry of it, never a restart of a group.
TASK_MODE = INDEPENDENT


def failure_classified(lease: Lease, verdict: AttemptVerdict, *, source: str, at: datetime,
                       node_id: str | None = None, data: dict[str, Any] | None = None) -> Event:
    """``FAILURE_CLASSIFIED`` for attempt ``lease``: class, evidence, action, reason, ``retried``."""
    decision = verdict.decision
    message = (f"attempt {lease.attempt_number} of task {lease.task_id}: {verdict.line()}"
               + ("" if verdict.retry else " (the task is not retried)"))
    return Event(job_id=lease.job_id, type=EventType.FAILURE_CLASSIFIED, timestamp=at, source=source,
                 message=message,
                 data={"task_id": lease.task_id, "node_id": node_id or lease.node_id, "lease_id": lease.lease_id,
                       "attempt_number": lease.attempt_number, "failure_class": str(verdict.failure_class),
                       "evidence": verdict.evidence, "action": str(decision.action), "reason": decision.reason,
                       "retried": verdict.retry, **(data or {})})


def failure_reason(events: Sequence[Event]) -> str | None:
    """Why a job failed, from its events, for its record: how many tasks failed, and the last
    one's last failed attempt (its class and decision where it was judged, else its reason)."""
    exhausted = [e for e in events if e.type is EventType.TASK_EXHAUSTED]
    if not exhausted:
        return None
    task_id = exhausted[-1].data.get("task_id")
    about = [e for e in events if e.data.get("task_id") == task_id
             and e.type in (EventType.FAILURE_CLASSIFIED, EventType.TASK_ATTEMPT_FAILED)]
    judged = [e for e in about if e.type is EventType.FAILURE_CLASSIFIED]
    last = (judged or about or exhausted)[-1].message
    failed = len({e.data.get("task_id") for e in exhausted})
    return f"{failed} task(s) failed; {task_id}: {last}"[:2000]
