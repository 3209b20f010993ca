"""What one coordinator admits: the bounds of one job (how many tasks, how many bytes
their payloads come to) and the quotas of one submitter (unfinished jobs, queued tasks).

Pure policy: the figures are passed in, and each check returns the refusal to raise (or
None). The expansion counts a job's tasks from its spec before building any, and adds up
the payload bytes task by task as it builds them, so an oversized job is refused without
being materialised; the coordinator counts a submitter's work from its stores. Standard
library only: ``expansion`` imports it without the service extra.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from flashruntime.errors import JobTooLarge, SubmitterOverQuota, TooManyTasks

__all__ = [
    "DEFAULT_JOB_BOUNDS",
    "JOBS_IN_FLIGHT_ENV",
    "JOB_BYTES_ENV",
    "PENDING_TASKS_ENV",
    "QUOTA_RETRY_AFTER_S",
    "TASKS_PER_JOB_ENV",
    "JobBounds",
    "PayloadTally",
    "SubmitterQuota",
    "over_quota",
    "payload_bytes",
    "too_many_tasks",
]

TASKS_PER_JOB_ENV = "FLASHML_MAX_TASKS_PER_JOB"
JOB_BYTES_ENV = "FLASHML_MAX_JOB_MB"
JOBS_IN_FLIGHT_ENV = "FLASHML_MAX_JOBS_IN_FLIGHT"
PENDING_TASKS_ENV = "FLASHML_MAX_PENDING_TASKS"
# What a refused submitter is told to wait: a quota frees as its earlier tasks are claimed or
# end, which no figure here predicts; long enough that a retry loop does not hammer admission.
QUOTA_RETRY_AFTER_S = 30
_MIB = 1024 * 1024


@dataclass(frozen=True)
class JobBounds:
    """The most tasks one job may hold, and the most bytes their payloads may come to."""

    max_tasks: int = 10_000
    max_bytes: int = 64 * _MIB

    @classmethod
    def from_settings(cls, settings: Any) -> JobBounds:
        """From a ``RuntimeSettings`` (``max_tasks_per_job``, ``max_job_mb``)."""
        return cls(max_tasks=settings.max_tasks_per_job, max_bytes=settings.max_job_mb * _MIB)


DEFAULT_JOB_BOUNDS = JobBounds()


def too_many_tasks(count: int, bounds: JobBounds, source: str) -> TooManyTasks | None:
    """The refusal of a job of ``count`` tasks (``source`` says where the count comes from), or None."""
    if count <= bounds.max_tasks:
        return None
    return TooManyTasks(
        f"{source} makes {count} tasks, more than the {bounds.max_tasks} one job may hold on this coordinator "
        f"({TASKS_PER_JOB_ENV}); split the work over several jobs, or have the operator raise {TASKS_PER_JOB_ENV}"
    )


def payload_bytes(payload: Any) -> int:
    """The size of a task's payload as JSON, the form in which it is stored and served on every claim."""
    return len(json.dumps(payload, separators=(",", ":"), default=str))


class PayloadTally:
    """The running sum of a job's task payload bytes; ``add`` refuses the task that passes the bound."""

    def __init__(self, bounds: JobBounds) -> None:
        self.bounds = bounds
        self.total = 0
        self.tasks = 0

    def add(self, task_id: str, payload: Any) -> None:
        self.total += payload_bytes(payload)
        self.tasks += 1
        if self.total > self.bounds.max_bytes:
            limit_mib = self.bounds.max_bytes / _MIB
            raise JobTooLarge(
                f"the payloads of this job's first {self.tasks} tasks (up to {task_id!r}) already come to "
                f"{self.total} bytes, more than the {self.bounds.max_bytes} bytes ({limit_mib:g} MiB) one job may "
                f"hold on this coordinator ({JOB_BYTES_ENV}); pass large values as an input artifact "
                "(PUT /v1alpha1/artifacts/<key>, then name it in parameters.inputs) instead of repeating them in "
                "every task, or split the job"
            )


@dataclass(frozen=True)
class SubmitterQuota:
    """The most unfinished jobs and queued tasks one submitter may have at once."""

    max_jobs_in_flight: int = 100
    max_pending_tasks: int = 100_000

    @classmethod
    def from_settings(cls, settings: Any) -> SubmitterQuota:
        """From a ``RuntimeSettings`` (``max_jobs_in_flight``, ``max_pending_tasks``)."""
        return cls(max_jobs_in_flight=settings.max_jobs_in_flight, max_pending_tasks=settings.max_pending_tasks)


def over_quota(who: str, jobs_in_flight: int, pending_tasks: int, new_tasks: int,
               quota: SubmitterQuota) -> SubmitterOverQuota | None:
    """The refusal of one more job of ``new_tasks`` tasks from ``who``, who already has
    ``jobs_in_flight`` unfinished jobs with ``pending_tasks`` queued tasks; or None."""
    wait = f"retry once some of them have ended (Retry-After: {QUOTA_RETRY_AFTER_S} s)"
    if jobs_in_flight >= quota.max_jobs_in_flight:
        return SubmitterOverQuota(
            f"{who} has {jobs_in_flight} unfinished jobs, the most this coordinator admits per submitter "
            f"({JOBS_IN_FLIGHT_ENV}={quota.max_jobs_in_flight}); {wait}, or cancel one", QUOTA_RETRY_AFTER_S)
    if pending_tasks + new_tasks > quota.max_pending_tasks:
        return SubmitterOverQuota(
            f"{who} has {pending_tasks} queued tasks, and this job's {new_tasks} would make "
            f"{pending_tasks + new_tasks}, more than this coordinator queues per submitter "
            f"({PENDING_TASKS_ENV}={quota.max_pending_tasks}); {wait}", QUOTA_RETRY_AFTER_S)
    return None
