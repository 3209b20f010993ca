"""Wire protocol v1alpha1: the JobSpec tree, events, node messages, leases,
evidence, checkpoint and recovery models, and the service request bodies.

Pydantic models only. Changes are additive: new optional fields with defaults,
new enum members appended at the end.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, StrictBool, field_validator, model_validator

from flashruntime.protocol.base import StrEnum, UtcDatetime, WireModel, utcnow
from flashruntime.protocol.lease_rules import DEFAULT_LEASE_SECONDS

__all__ = [
    "API_VERSION",
    "LABEL_BACKEND",
    "LABEL_JOB_ID",
    "LABEL_PROFILE",
    "LABEL_RUNTIME_ID",
    "SCHEMA_VERSION",
    "ArtifactRecord",
    "ArtifactsSpec",
    "CheckpointManifest",
    "CheckpointPart",
    "CheckpointValidation",
    "ClaimRequest",
    "CommitRequest",
    "CompleteRequest",
    "CordonRequest",
    "Event",
    "EventType",
    "ExecutionEvidence",
    "ExecutionSpec",
    "FailRequest",
    "FailureClass",
    "GpuInfo",
    "ImageSpec",
    "IsolationSpec",
    "JobMetadata",
    "JobRecord",
    "JobSpec",
    "JobSpecInner",
    "JobState",
    "Lease",
    "NodeCapabilities",
    "NodeEnvironment",
    "NodeHeartbeat",
    "NodeRegistration",
    "NodeStatusView",
    "PlacementSpec",
    "RecoveryActionType",
    "RecoveryDecision",
    "RegisterPartRequest",
    "ReleaseRequest",
    "ResourcesSpec",
    "RetryPolicySpec",
    "SubmittedBy",
    "TaskAttempt",
    "TaskSpec",
    "TaskState",
    "WorkloadSpec",
    "utcnow",
]

API_VERSION = "flashml.dev/v1alpha1"
SCHEMA_VERSION = "v1alpha1"
LABEL_JOB_ID = "flashml.dev/job-id"
LABEL_RUNTIME_ID = "flashml.dev/runtime-id"
LABEL_BACKEND = "flashml.dev/backend"
LABEL_PROFILE = "flashml.dev/deployment-profile"

SchemaVersion = Literal["v1alpha1"]

_DNS1123_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


# --- JobSpec tree -------------------------------------------------------------


class ExecutionSpec(WireModel):
    # None: the coordinator's default backend, which it writes into the job it stores.
    backend: Literal["ray", "leases"] | None = None
    environment: Literal["auto", "local", "alibaba-ack"] = "auto"


class ImageSpec(WireModel):
    repository: str
    tag: str

    @field_validator("tag")
    @classmethod
    def _pinned_tag(cls, tag: str) -> str:
        if not tag:
            raise ValueError("image tag must not be empty; pin a version, e.g. tag='1.2'")
        if tag == "latest":
            raise ValueError(
                "image tag 'latest' is refused because it is not reproducible; pin a version, e.g. tag='1.2'"
            )
        return tag

    @property
    def reference(self) -> str:
        return f"{self.repository}:{self.tag}"


class WorkloadSpec(WireModel):
    type: str
    parameters: dict[str, Any] = Field(default_factory=dict)


class ResourcesSpec(WireModel):
    minimumWorkers: int = Field(default=2, ge=1)
    maximumWorkers: int = Field(default=3, ge=1)
    cpuPerTask: float = Field(default=1, gt=0)
    memoryPerTask: str = "512Mi"
    gpuPerTask: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _max_not_below_min(self) -> ResourcesSpec:
        if self.maximumWorkers < self.minimumWorkers:
            raise ValueError(
                f"maximumWorkers ({self.maximumWorkers}) must be >= minimumWorkers ({self.minimumWorkers})"
            )
        return self


class PlacementSpec(WireModel):
    pool: str = "any"
    architectures: list[Literal["amd64", "arm64"]] = Field(default_factory=lambda: ["amd64"])


class IsolationSpec(WireModel):
    tier: Literal["standard", "sandboxed"] = "standard"
    # Both widen what a task may do, so only a JSON true turns them on (not 1 or "yes").
    allowFallback: StrictBool = False
    # A sandboxed task reaches the network only when its job says so (the worker's sandbox
    # otherwise gives it a network namespace of its own, loopback only).
    network: StrictBool = False


class RetryPolicySpec(WireModel):
    maxTaskAttempts: int = Field(default=4, ge=1)
    retryWorkerLoss: bool = True


class ArtifactsSpec(WireModel):
    outputPrefix: str = "artifact://jobs/{job_id}/"

    @field_validator("outputPrefix")
    @classmethod
    def _artifact_scheme(cls, prefix: str) -> str:
        if not prefix.startswith("artifact://"):
            raise ValueError(f"outputPrefix {prefix!r} must start with 'artifact://', e.g. 'artifact://jobs/{{job_id}}/'")
        return prefix


class JobMetadata(WireModel):
    name: str
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _dns1123(cls, name: str) -> str:
        if not _DNS1123_LABEL.fullmatch(name):
            raise ValueError(
                f"job name {name!r} is not a DNS-1123 label: use 1-63 characters of a-z, 0-9 and '-', "
                "starting and ending with a letter or digit (e.g. 'sweep-a')"
            )
        return name


class JobSpecInner(WireModel):
    execution: ExecutionSpec = Field(default_factory=ExecutionSpec)
    # Only a container runner needs one; the bundled worker runs none.
    image: ImageSpec | None = None
    workload: WorkloadSpec
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    placement: PlacementSpec = Field(default_factory=PlacementSpec)
    isolation: IsolationSpec = Field(default_factory=IsolationSpec)
    retryPolicy: RetryPolicySpec = Field(default_factory=RetryPolicySpec)
    artifacts: ArtifactsSpec = Field(default_factory=ArtifactsSpec)


class JobSpec(WireModel):
    apiVersion: Literal["flashml.dev/v1alpha1"] = API_VERSION
    kind: Literal["Job"] = "Job"
    metadata: JobMetadata
    spec: JobSpecInner


# --- Job state and events -----------------------------------------------------


class JobState(StrEnum):
    PENDING = "PENDING"
    SUBMITTED = "SUBMITTED"
    RUNNING = "RUNNING"
    RECOVERING = "RECOVERING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


class EventType(StrEnum):
    # job / backend
    JOB_ACCEPTED = "JOB_ACCEPTED"
    BACKEND_SELECTED = "BACKEND_SELECTED"
    RAYJOB_CREATED = "RAYJOB_CREATED"
    RAY_CLUSTER_STARTING = "RAY_CLUSTER_STARTING"
    NODE_REGISTERED = "NODE_REGISTERED"
    NODE_READY = "NODE_READY"
    TASK_ATTEMPT_STARTED = "TASK_ATTEMPT_STARTED"
    TASK_ATTEMPT_COMPLETED = "TASK_ATTEMPT_COMPLETED"
    NODE_HEARTBEAT_LOST = "NODE_HEARTBEAT_LOST"
    RAY_WORKER_LOST = "RAY_WORKER_LOST"
    TASK_ATTEMPT_RETRIED = "TASK_ATTEMPT_RETRIED"
    RAY_WORKER_REPLACED = "RAY_WORKER_REPLACED"
    ITERATION_COMPLETED = "ITERATION_COMPLETED"
    ARTIFACT_UPLOAD_STARTED = "ARTIFACT_UPLOAD_STARTED"
    ARTIFACT_COMMITTED = "ARTIFACT_COMMITTED"
    JOB_SUCCEEDED = "JOB_SUCCEEDED"
    JOB_FAILED = "JOB_FAILED"
    # lease lifecycle
    TASK_CREATED = "TASK_CREATED"
    LEASE_CLAIMED = "LEASE_CLAIMED"
    LEASE_RENEWED = "LEASE_RENEWED"
    LEASE_EXPIRED = "LEASE_EXPIRED"
    TASK_REQUEUED = "TASK_REQUEUED"
    TASK_COMMIT_ACCEPTED = "TASK_COMMIT_ACCEPTED"
    TASK_COMMIT_REJECTED = "TASK_COMMIT_REJECTED"
    TASK_ATTEMPT_FAILED = "TASK_ATTEMPT_FAILED"
    TASK_EXHAUSTED = "TASK_EXHAUSTED"
    # checkpoint
    CHECKPOINT_PARTS_REGISTERED = "CHECKPOINT_PARTS_REGISTERED"
    CHECKPOINT_MANIFEST_COMMITTED = "CHECKPOINT_MANIFEST_COMMITTED"
    CHECKPOINT_RESTORE_VERIFIED = "CHECKPOINT_RESTORE_VERIFIED"
    CHECKPOINT_REJECTED = "CHECKPOINT_REJECTED"
    # recovery
    FAILURE_CLASSIFIED = "FAILURE_CLASSIFIED"
    RECOVERY_ACTION_SELECTED = "RECOVERY_ACTION_SELECTED"
    RECOVERY_FROZEN = "RECOVERY_FROZEN"
    # added in 0.5.0
    TASK_CANCELLED = "TASK_CANCELLED"
    LEASE_RENEWAL_REFUSED = "LEASE_RENEWAL_REFUSED"
    NODE_CORDONED = "NODE_CORDONED"
    LEASE_RELEASED = "LEASE_RELEASED"
    # training health
    STRAGGLER_DETECTED = "STRAGGLER_DETECTED"
    HANG_DETECTED = "HANG_DETECTED"
    # multi-node jobs
    GANG_JOINED = "GANG_JOINED"


class Event(WireModel):
    schema_version: SchemaVersion = SCHEMA_VERSION
    job_id: str
    type: EventType
    timestamp: UtcDatetime = Field(default_factory=utcnow)
    source: str
    message: str = ""
    data: dict[str, Any] = Field(default_factory=dict)


# --- Records ------------------------------------------------------------------


class ArtifactRecord(WireModel):
    schema_version: SchemaVersion = SCHEMA_VERSION
    uri: str
    backend: Literal["minio", "oss", "local"]
    bucket: str
    object_key: str
    etag: str | None = None
    sha256: str | None = None
    size_bytes: int | None = None
    created_at: UtcDatetime = Field(default_factory=utcnow)


class SubmittedBy(WireModel):
    """Who submitted a job: the credential's role and configured name. A coordinator in
    open mode (no tokens) records nobody (``JobRecord.submitted_by`` is None)."""

    role: Literal["submitter", "operator"]
    name: str


class JobRecord(WireModel):
    schema_version: SchemaVersion = SCHEMA_VERSION
    job_id: str
    spec: JobSpec
    state: JobState = JobState.PENDING
    backend: str = "kuberay"
    deployment_profile: str = "local"
    runtime_execution_id: str | None = None
    created_at: UtcDatetime = Field(default_factory=utcnow)
    finished_at: UtcDatetime | None = None
    error: str | None = None
    artifacts: list[ArtifactRecord] = Field(default_factory=list)
    submitted_by: SubmittedBy | None = None


# --- Node messages ------------------------------------------------------------


class NodeEnvironment(StrEnum):
    LOCAL = "local"
    CLOUD = "cloud"
    EDGE = "edge"


class GpuInfo(WireModel):
    index: int
    name: str = ""
    memory_total_mb: int | None = None
    driver_version: str = ""
    compute_capability: str = ""


class NodeCapabilities(WireModel):
    cpu_cores: float | None = None
    memory_bytes: int | None = None
    gpus: list[GpuInfo] = Field(default_factory=list)
    pools: list[str] = Field(default_factory=list)
    os: str = ""
    architecture: str = ""


class NodeRegistration(WireModel):
    schema_version: SchemaVersion = SCHEMA_VERSION
    node_id: str
    kubernetes_node: str
    hostname: str
    capabilities: NodeCapabilities
    environment: NodeEnvironment = NodeEnvironment.LOCAL
    # Strict: a capability is claimed by true, never by 1 or "yes" (a coerced claim is a mistake
    # or a probe, and placement trusts these flags).
    sandbox_capable: StrictBool = False
    argv_capable: StrictBool = False
    unsandboxed_argv_capable: StrictBool = False
    module_capable: StrictBool = True
    local_datasets: list[str] = Field(default_factory=list)
    pool: str = "local"
    runtime_profile: str = "kubernetes"
    labels: dict[str, Any] = Field(default_factory=dict)
    agent_version: str = ""


class NodeHeartbeat(WireModel):
    schema_version: SchemaVersion = SCHEMA_VERSION
    node_id: str
    timestamp: UtcDatetime = Field(default_factory=utcnow)
    status: Literal["online", "draining", "terminating"] = "online"
    # None = no statement (keep the registered pools); any list, even [], replaces them.
    pools: list[str] | None = None


class NodeStatusView(WireModel):
    schema_version: SchemaVersion = SCHEMA_VERSION
    registration: NodeRegistration
    online: bool
    last_heartbeat: UtcDatetime | None = None
    accepted_task_count: int = 0


# --- Tasks, leases, attempts --------------------------------------------------


class TaskState(StrEnum):
    PENDING = "PENDING"
    LEASED = "LEASED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


class TaskSpec(WireModel):
    schema_version: SchemaVersion = SCHEMA_VERSION
    task_id: str
    job_id: str
    payload: dict[str, Any] = Field(default_factory=dict)
    commit_key: str
    max_attempts: int = Field(default=3, ge=1)
    max_expiries: int = Field(default=9, ge=1)
    lease_seconds: float = Field(default=DEFAULT_LEASE_SECONDS, gt=0, allow_inf_nan=False)


class Lease(WireModel):
    schema_version: SchemaVersion = SCHEMA_VERSION
    lease_id: str
    task_id: str
    job_id: str
    node_id: str
    attempt_number: int
    deadline: UtcDatetime
    payload: dict[str, Any] = Field(default_factory=dict)
    lease_seconds: float = 0.0


class TaskAttempt(WireModel):
    schema_version: SchemaVersion = SCHEMA_VERSION
    attempt_id: str
    task_id: str
    job_id: str
    node_id: str
    attempt_number: int
    started: UtcDatetime
    finished: UtcDatetime | None = None
    outcome: Literal["running", "committed", "rejected", "failed", "expired"] = "running"
    output_sha256: str | None = None
    accepted: bool = False


# --- Evidence -----------------------------------------------------------------


class ExecutionEvidence(WireModel):
    """Evidence, never proof. None = not measured; 0 = measured and zero.

    Deliberately unconstrained: implausible values are recorded, never refused.
    """

    wall_seconds: float | None = None
    cpu_percent_mean: float | None = None
    gpu_util_percent_mean: float | None = None
    image_digest: str = ""
    exit_code: int | None = None
    # Where the attempt ran, when a Ray backend ran it.
    ray_node_id: str | None = None
    node_ip: str | None = None
    hostname: str | None = None
    worker_pid: int | None = None
    gpu_ids: list[str] | None = None


# --- Checkpoints --------------------------------------------------------------


class CheckpointPart(WireModel):
    key: str
    sha256: str
    size_bytes: int = Field(ge=0)


class CheckpointValidation(StrEnum):
    HASH_VERIFIED = "hash_verified"
    RESTORE_VERIFIED = "restore_verified"
    INVALID = "invalid"


class CheckpointManifest(WireModel):
    schema_version: SchemaVersion = SCHEMA_VERSION
    manifest_id: str
    job_id: str
    attempt_id: str
    step: int = Field(ge=0)
    framework: str = ""
    strategy_family: str = ""
    world_size: int = Field(default=1, ge=1)
    compatible_world_sizes: list[int] = Field(default_factory=list)
    storage_prefix: str
    parts: list[CheckpointPart]
    validation: CheckpointValidation
    created: UtcDatetime = Field(default_factory=utcnow)
    checkpoint_duration_s: float | None = None


# --- Recovery -----------------------------------------------------------------


class FailureClass(StrEnum):
    APPLICATION_ERROR = "application_error"
    DATA_ERROR = "data_error"
    WORKER_CRASH = "worker_crash"
    NODE_LOSS = "node_loss"
    ACCELERATOR_FAILURE = "accelerator_failure"
    COMMUNICATION_ERROR = "communication_error"
    NETWORK_DEGRADATION = "network_degradation"
    STORAGE_TIMEOUT = "storage_timeout"
    ARTIFACT_CORRUPTION = "artifact_corruption"
    PREEMPTION = "preemption"
    CORRELATED_INCIDENT = "correlated_incident"
    CONTROL_PLANE_FAILURE = "control_plane_failure"
    UNKNOWN = "unknown"
    HANG = "hang"  # no progress for the hang timeout: assigned by the hang watch, not by classify


class RecoveryActionType(StrEnum):
    FAIL_JOB = "fail_job"
    RETRY_TASK = "retry_task"
    RESTART_GROUP = "restart_group"
    REPLACE_NODE = "replace_node"
    PAUSE_JOB = "pause_job"
    FREEZE_AUTOMATION = "freeze_automation"


class RecoveryDecision(WireModel):
    schema_version: SchemaVersion = SCHEMA_VERSION
    policy_version: str
    failure_class: FailureClass
    action: RecoveryActionType
    scope: Literal["task", "node", "group", "job", "pool"]
    cordon_node: bool = False
    needs_checkpoint: bool = False
    reason: str
    evidence: dict[str, Any] = Field(default_factory=dict)
    decided_at: UtcDatetime = Field(default_factory=utcnow)


# --- Service request bodies ---------------------------------------------------


class ClaimRequest(WireModel):
    node_id: str
    job_id: str | None = None


class CompleteRequest(WireModel):
    output_sha256: str
    # Optional forever: older agents omit it.
    evidence: ExecutionEvidence | None = None


class FailRequest(WireModel):
    """A failed attempt. ``exit_code``: how its command exited, when it ran; the coordinator then
    judges the failure from it and the task's log by the recovery policy (a deterministic error
    is not retried), as a local run and the Ray backend do. ``hung``: the worker's hang watch
    stopped it (its ``reason`` says which ranks stopped advancing); it is judged ``hang``."""

    reason: str
    exit_code: int | None = Field(default=None, ge=-255, le=255)
    # The worker's hang watch stopped the attempt: no progress for its hang timeout.
    hung: StrictBool = False


class StragglerReport(WireModel):
    """A rank its worker's straggler watch found computing ``ratio`` times as long as the
    other ranks' median (``median_s`` against ``others_s`` per step), at ``step``."""

    rank: int = Field(ge=0, le=1_000_000)
    host: str | None = Field(default=None, max_length=255)
    step: int | None = Field(default=None, ge=0)
    ratio: float = Field(gt=0, allow_inf_nan=False)
    median_s: float = Field(ge=0, allow_inf_nan=False)
    others_s: float = Field(ge=0, allow_inf_nan=False)


class AttemptHeartbeat(WireModel):
    """The optional body of a lease heartbeat: what the worker saw of the attempt since the
    last one. Optional forever: a heartbeat without a body renews the lease as before."""

    stragglers: list[StragglerReport] = Field(default_factory=list, max_length=16)


class ReleaseRequest(WireModel):
    """A lease given back for a cause that is not the task's. ``abandoned`` false: its worker
    is shutting down (a drain), and the task is requeued without spending a budget; true: the
    worker that held it died, as its restarted self reports, which counts as an expiry."""

    reason: str = ""
    abandoned: bool = False


class RegisterPartRequest(WireModel):
    attempt_id: str
    step: int = Field(ge=0)
    part: CheckpointPart


class CommitRequest(WireModel):
    attempt_id: str
    step: int = Field(ge=0)
    expected_parts: list[CheckpointPart]
    storage_prefix: str
    world_size: int = 1
    framework: str = ""
    strategy_family: str = ""


class CordonRequest(WireModel):
    """Cordon a node for ``seconds`` or until ``until``; neither = until uncordoned."""

    seconds: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    until: UtcDatetime | None = None
    reason: str = ""

    @model_validator(mode="after")
    def _one_duration(self) -> CordonRequest:
        if self.seconds is not None and self.until is not None:
            raise ValueError("give either 'seconds' or 'until', not both (neither cordons until uncordon)")
        return self
