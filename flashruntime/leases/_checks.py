"""Input checks and refusal texts of the lease state machine (kept apart from the
transitions so ``manager.py`` reads as the state machine alone)."""

from __future__ import annotations

import math
from datetime import datetime

from flashruntime.leases._record import TaskRecord
from flashruntime.protocol.lease_rules import LONGEST_LEASE_SECONDS, SHORTEST_LEASE_SECONDS
from flashruntime.protocol.v1alpha1 import TaskSpec, TaskState

_COMPLETED = TaskState.COMPLETED

_FAILED = TaskState.FAILED
_CANCELLED = TaskState.CANCELLED


def _is_str(value: object) -> bool:
    return isinstance(value, str)


def _check_id(name: str, value: object) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    if not value:
        raise ValueError(f"{name} must be a non-empty str")


def _check_spec(spec: TaskSpec) -> None:
    """Re-check what TaskSpec validates, for specs built with ``model_construct``."""
    lease_seconds = spec.lease_seconds
    if isinstance(lease_seconds, bool) or not isinstance(lease_seconds, (int, float)):
        raise ValueError(f"lease_seconds must be a number, got {lease_seconds!r}")
    if not math.isfinite(lease_seconds) or lease_seconds <= 0:
        raise ValueError(f"lease_seconds must be finite and > 0, got {lease_seconds!r}")
    if lease_seconds < SHORTEST_LEASE_SECONDS:
        raise ValueError(
            f"lease_seconds must be at least {SHORTEST_LEASE_SECONDS:g} (the clock's resolution), got "
            f"{lease_seconds!r}: a shorter lease would be dead when issued"
        )
    if lease_seconds > LONGEST_LEASE_SECONDS:
        raise ValueError(
            f"lease_seconds must be at most {LONGEST_LEASE_SECONDS} (10 years), got {lease_seconds!r}: a deadline "
            "must stay a date; hold a task longer by heartbeating"
        )
    for name in ("max_attempts", "max_expiries"):
        value = getattr(spec, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    for name in ("job_id", "task_id", "commit_key"):
        if not isinstance(getattr(spec, name), str):
            raise ValueError(f"{name} must be a str, got {getattr(spec, name)!r}")
    if not isinstance(spec.payload, dict):
        raise ValueError(f"payload must be a dict, got {type(spec.payload).__name__}")


def _why_not_live(record: TaskRecord, lease_id: str, now: datetime) -> str:
    state = record.state
    if state is _COMPLETED:
        return f"the task was already committed by lease {record.accepted_attempt_id}"
    if state is _CANCELLED:
        return "the task was cancelled"
    if state is _FAILED:
        return "the task failed (budget exhausted)"
    active = record.active_lease
    if active is None or active.lease_id != lease_id:
        return "the lease was released (failed or expired) and the task requeued"
    return f"it expired at {active.deadline.isoformat()} (now {now.isoformat()})"


def _node_of(record: TaskRecord, lease_id: str) -> str | None:
    lease = record.lease_history.get(lease_id)
    return lease.node_id if lease is not None else None
