"""The events of the three hot transitions (claim, renewal, accepted commit), built by
plain functions so a transition that emits none pays nothing for them."""

from __future__ import annotations

from datetime import datetime

from flashruntime.leases._models import make_event
from flashruntime.protocol.v1alpha1 import Event, EventType, TaskSpec

_CLAIMED = EventType.LEASE_CLAIMED
_RENEWED = EventType.LEASE_RENEWED
_ACCEPTED = EventType.TASK_COMMIT_ACCEPTED


def lease_claimed(spec: TaskSpec, node_id: str, lease_id: str, attempt: int, deadline: datetime, now: datetime) -> Event:
    deadline_text = deadline.isoformat()
    return make_event(
        _CLAIMED,
        spec.job_id,
        now,
        f"attempt {attempt} of task {spec.task_id} leased to {node_id} until {deadline_text}",
        {
            "task_id": spec.task_id,
            "node_id": node_id,
            "lease_id": lease_id,
            "attempt_number": attempt,
            "deadline": deadline_text,
        },
    )


def lease_renewed(spec: TaskSpec, node_id: str, lease_id: str, deadline: datetime, now: datetime) -> Event:
    deadline_text = deadline.isoformat()
    return make_event(
        _RENEWED,
        spec.job_id,
        now,
        f"lease {lease_id} renewed until {deadline_text}",
        {"task_id": spec.task_id, "node_id": node_id, "lease_id": lease_id, "deadline": deadline_text},
    )


def commit_accepted(spec: TaskSpec, node_id: str | None, lease_id: str, output_sha256: str, now: datetime) -> Event:
    return make_event(
        _ACCEPTED,
        spec.job_id,
        now,
        f"output {output_sha256[:12]} of task {spec.task_id} accepted from lease {lease_id}",
        {"task_id": spec.task_id, "node_id": node_id, "lease_id": lease_id, "output_sha256": output_sha256},
    )
