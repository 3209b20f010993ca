"""``TaskRecord``: one task's durable state, what every lease store keeps (re-exported by
``leases.store`` beside the contract that speaks of it)."""

from __future__ import annotations

from flashruntime.protocol.v1alpha1 import Lease, TaskSpec, TaskState

__all__ = ["TaskRecord"]


class TaskRecord:
    """One task's durable state: its spec, lifecycle state, counters and leases.

    ``attempts_used`` counts claims (and numbers attempts); the two budgets are
    ``failures_seen`` against ``spec.max_attempts`` and ``expiries_seen`` against
    ``spec.max_expiries``. ``releases_seen`` counts leases given back by a worker that was
    shutting down, which spend neither. ``lease_history`` keeps every lease as first
    issued; ``active_lease`` is the current one, with its latest deadline.
    """

    __slots__ = (
        "spec",
        "state",
        "attempts_used",
        "failures_seen",
        "expiries_seen",
        "releases_seen",
        "active_lease",
        "accepted_attempt_id",
        "accepted_output_sha256",
        "lease_history",
        "seq",
    )

    def __init__(self, spec: TaskSpec) -> None:
        self.spec = spec
        self.state: TaskState = TaskState.PENDING
        self.attempts_used = 0
        self.failures_seen = 0
        self.expiries_seen = 0
        self.releases_seen = 0
        self.active_lease: Lease | None = None
        self.accepted_attempt_id: str | None = None
        self.accepted_output_sha256: str | None = None
        self.lease_history: dict[str, Lease] = {}
        self.seq: int | None = None

    def __repr__(self) -> str:
        lease = self.active_lease.lease_id if self.active_lease is not None else None
        return (
            f"TaskRecord(job_id={self.spec.job_id!r}, task_id={self.spec.task_id!r}, state={self.state.value}, "
            f"seq={self.seq}, attempts_used={self.attempts_used}, failures_seen={self.failures_seen}, "
            f"expiries_seen={self.expiries_seen}, releases_seen={self.releases_seen}, active_lease={lease!r}, "
            f"accepted_attempt_id={self.accepted_attempt_id!r})"
        )
