"""Response bodies of the coordinator's HTTP API (v1alpha1).

Pydantic models only: they give every route a typed answer in the OpenAPI schema, so
clients and fuzzers can check what they receive. Like every wire model they ignore
unknown fields, and new fields arrive optional.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from flashruntime.protocol.base import WireModel
from flashruntime.protocol.v1alpha1 import ExecutionEvidence, NodeCapabilities

__all__ = [
    "ArtifactListing",
    "Caller",
    "CompleteResult",
    "CordonResult",
    "ErrorBody",
    "FailResult",
    "Health",
    "JobLogs",
    "JobMetrics",
    "LeaseStanding",
    "LostWork",
    "MetricPoint",
    "NodeRow",
    "PartRegistered",
    "RegisterResult",
    "ReleaseResult",
    "StatusResult",
    "TaskLogEntry",
    "TaskMetrics",
    "TaskRow",
    "UncordonResult",
    "ValidationIssue",
]


class ValidationIssue(WireModel):
    """One problem of a refused request body: where (``loc``), what (``msg``), its kind."""

    loc: list[str | int] = Field(default_factory=list)
    msg: str
    type: str = ""


class ErrorBody(WireModel):
    """Every 4xx and 5xx answer: ``detail`` is a sentence, or a list of body problems (422)."""

    detail: str | list[ValidationIssue]


class Health(WireModel):
    status: Literal["ok", "unavailable"]
    profile: str = ""
    detail: str | None = None  # why the coordinator is not ready


class Caller(WireModel):
    """Who the coordinator takes the caller for: its role (None in open mode, where nothing is
    checked), its configured name, whether its jobs may run commands, and the artifact prefix
    it may upload under before it has a job (None: anywhere)."""

    role: Literal["node", "submitter", "operator"] | None = None
    name: str | None = None
    may_run_code: bool = False
    artifact_prefix: str | None = None


class TaskLogEntry(WireModel):
    """One task's log: the last lines its worker uploaded (``task.log`` under its output prefix)."""

    task_id: str
    state: str
    node_id: str | None = None  # the node of its active lease, else of its last one
    log: str = ""  # empty until a worker uploads it
    truncated: bool = False  # earlier output is left out (by the worker's bound, the answer's or ?tail)
    attempt: int | None = None  # an earlier, failed attempt's log; None: the task's latest


class JobLogs(WireModel):
    """``logs``: every task's log in one text, each under a ``--- <task_id> (<state>) ---`` line
    (an earlier attempt's under ``--- <task_id> attempt <n> (FAILED) ---``, before the latest);
    ``tasks``: the same, one entry per log."""

    logs: str
    tasks: list[TaskLogEntry] = Field(default_factory=list)


class MetricPoint(WireModel):
    """One step record of a task, its numbers only: ``values`` maps a figure to its value."""

    step: int
    ts: float | None = None  # when the task wrote it (Unix seconds), when it said
    values: dict[str, float] = Field(default_factory=dict)


class TaskMetrics(WireModel):
    """One task's curves: ``points`` thinned evenly to at most the number asked for (the last
    record always kept), of the figures in ``keys`` (loss first, then as the task first wrote
    them, at most a few); ``records``: how many step records were read; ``truncated``: earlier
    records are left out (by the worker's bound or the answer's)."""

    task_id: str
    state: str
    node_id: str | None = None
    keys: list[str] = Field(default_factory=list)
    points: list[MetricPoint] = Field(default_factory=list)
    records: int = 0
    truncated: bool = False


class JobMetrics(WireModel):
    """The step records of a job's tasks (``metrics.jsonl`` under each task's output prefix,
    uploaded by its worker while it runs), one entry per task, sorted by task id."""

    tasks: list[TaskMetrics] = Field(default_factory=list)


class LeaseStanding(WireModel):
    """Where a lease stands, as its worker watches it: ``live`` (still the task's: keep
    running), ``cancelled`` (its job or task was cancelled: stop now) or ``ended`` (committed,
    failed, released or expired); ``reason`` says why it is no longer live."""

    lease_id: str
    standing: Literal["live", "cancelled", "ended"]
    reason: str | None = None


class TaskRow(WireModel):
    """One task of a job, as ``GET /v1alpha1/jobs/{id}/tasks`` lists it."""

    task_id: str
    state: str
    attempts: int
    max_attempts: int
    node_id: str | None = None  # the active lease's node, else the last one's
    deadline: str | None = None  # the active lease's deadline (ISO 8601)
    failures: int = 0
    expiries: int = 0
    max_expiries: int = 0
    released: int = 0  # leases its workers gave back while shutting down: no budget spent
    evidence: ExecutionEvidence | dict[str, Any] | None = None  # the accepted attempt's


class ArtifactListing(WireModel):
    uri: str
    key: str
    size_bytes: int
    sha256: str | None = None  # of the file as stored now


class NodeRow(WireModel):
    """One registered node, as ``GET /v1alpha1/nodes`` lists it."""

    node_id: str
    hostname: str
    environment: str
    argv_capable: bool
    module_capable: bool
    capabilities: NodeCapabilities
    online: bool
    last_heartbeat_age_s: float
    accepted_tasks: int
    cordoned_until: str | None = None
    cordon_reason: str | None = None


class RegisterResult(WireModel):
    node_id: str
    status: Literal["registered"] = "registered"
    # Only when the node stated what its credential was not granted (FLASHML_NODE_POOLS etc.),
    # which is stored without it: the pools, whether the unsandboxed runner, and why.
    withheld_pools: list[str] | None = None
    withheld_unsandboxed_argv: bool | None = None
    detail: str | None = None


class StatusResult(WireModel):
    status: str


class CordonResult(WireModel):
    node_id: str
    cordoned_until: str | None = None
    reason: str = ""


class UncordonResult(WireModel):
    node_id: str
    uncordoned: bool


class CompleteResult(WireModel):
    accepted: bool
    detail: str | None = None


class FailResult(WireModel):
    status: Literal["requeued-or-exhausted"] = "requeued-or-exhausted"


class ReleaseResult(WireModel):
    """``requeued``: the task is pending again; ``exhausted``: an abandoned lease spent the
    task's last expiry, and the task failed."""

    status: Literal["requeued", "exhausted"]


class PartRegistered(WireModel):
    status: Literal["registered"] = "registered"
    key: str


class LostWork(WireModel):
    lost_steps: int | None = None
    latest_step: int | None = None
