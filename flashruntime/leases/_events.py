"""The events of the lease transitions, built by plain functions so a transition that emits
none pays nothing for them, and so that each event's wording lives in one place."""

from __future__ import annotations

from datetime import datetime

from flashruntime.leases._models import make_event
from flashruntime.protocol.v1alpha1 import Event, EventType, Lease, TaskSpec

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


def attempt_failed(spec: TaskSpec, lease: Lease, reason: str, now: datetime) -> Event:
    return make_event(
        EventType.TASK_ATTEMPT_FAILED,
        spec.job_id,
        now,
        reason,
        {
            "task_id": spec.task_id,
            "node_id": lease.node_id,
            "lease_id": lease.lease_id,
            "attempt_number": lease.attempt_number,
            "reason": reason,
        },
    )


def lease_released(spec: TaskSpec, lease: Lease, reason: str, released: int, now: datetime) -> tuple[Event, Event]:
    """LEASE_RELEASED and the TASK_REQUEUED that follows it (no budget spent)."""
    base = {"task_id": spec.task_id, "node_id": lease.node_id, "lease_id": lease.lease_id}
    return (
        make_event(
            EventType.LEASE_RELEASED,
            spec.job_id,
            now,
            f"lease {lease.lease_id} (attempt {lease.attempt_number}) of task {spec.task_id} on "
            f"{lease.node_id} released by its worker" + (f": {reason}" if reason else ""),
            {**base, "attempt_number": lease.attempt_number, "reason": reason},
        ),
        make_event(
            EventType.TASK_REQUEUED,
            spec.job_id,
            now,
            f"task {spec.task_id} requeued after a release (no budget spent; {released} released)",
            {**base, "released": released},
        ),
    )


def lease_expired(spec: TaskSpec, lease: Lease, now: datetime, *, abandoned_because: str | None = None) -> Event:
    """LEASE_EXPIRED of a lease past its deadline, or (``abandoned_because``: the reason, maybe
    empty) of one its worker's restarted self reported dead before the deadline."""
    deadline = lease.deadline.isoformat()
    data = {
        "task_id": spec.task_id,
        "node_id": lease.node_id,
        "lease_id": lease.lease_id,
        "attempt_number": lease.attempt_number,
        "deadline": deadline,
    }
    if abandoned_because is None:
        message = (f"lease {lease.lease_id} (attempt {lease.attempt_number}) of task {spec.task_id} "
                   f"on {lease.node_id} expired at {deadline}")
    else:
        message = (f"lease {lease.lease_id} (attempt {lease.attempt_number}) of task {spec.task_id} on "
                   f"{lease.node_id} abandoned before its deadline ({deadline})"
                   + (f": {abandoned_because}" if abandoned_because else ""))
        data.update(abandoned=True, reason=abandoned_because)
    return make_event(EventType.LEASE_EXPIRED, spec.job_id, now, message, data)


def budget_outcome(spec: TaskSpec, lease: Lease, expiry: bool, exhausted: bool, used: int, budget: int,
                   now: datetime) -> Event:
    """TASK_EXHAUSTED or TASK_REQUEUED after a failure (``max_attempts``) or an expiry
    (``max_expiries``); an exhaustion with budget left was a failure without a retry."""
    name, cause = ("max_expiries", "expiries") if expiry else ("max_attempts", "failures")
    data: dict[str, object] = {"task_id": spec.task_id, "node_id": lease.node_id, "lease_id": lease.lease_id,
                               "budget": name}
    if exhausted:
        message = (f"all {budget} {cause} used ({name})" if used >= budget else
                   f"failed without a retry: a retry would fail the same way ({used} of {budget} {cause} "
                   f"used, {name})")
        return make_event(EventType.TASK_EXHAUSTED, spec.job_id, now, message, data)
    data["used"] = used
    data["limit"] = budget
    return make_event(
        EventType.TASK_REQUEUED,
        spec.job_id,
        now,
        f"task {spec.task_id} requeued after {'an expiry' if expiry else 'a failure'} "
        f"({used} of {budget} {cause} used, {name})",
        data,
    )


def task_created(spec: TaskSpec, now: datetime) -> Event:
    return make_event(
        EventType.TASK_CREATED,
        spec.job_id,
        now,
        f"task {spec.task_id} created (max_attempts={spec.max_attempts}, "
        f"max_expiries={spec.max_expiries}, lease_seconds={spec.lease_seconds:g})",
        {"task_id": spec.task_id},
    )


def renewal_refused(spec: TaskSpec, node_id: str | None, lease_id: str, why: str, now: datetime) -> Event:
    return make_event(
        EventType.LEASE_RENEWAL_REFUSED,
        spec.job_id,
        now,
        f"renewal of lease {lease_id} refused: {why}",
        {"task_id": spec.task_id, "node_id": node_id, "lease_id": lease_id, "reason": why},
    )


def commit_rejected(spec: TaskSpec, node_id: str | None, lease_id: str, why: str, another_won: bool,
                    now: datetime) -> Event:
    # "late/duplicate" marks the case alerting rules look for: another lease's commit won
    late = " as a late/duplicate commit" if another_won else ""
    return make_event(
        EventType.TASK_COMMIT_REJECTED,
        spec.job_id,
        now,
        f"commit of task {spec.task_id} from lease {lease_id} rejected{late}: {why}",
        {"task_id": spec.task_id, "node_id": node_id, "lease_id": lease_id, "reason": why},
    )
