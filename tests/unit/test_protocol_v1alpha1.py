"""Every model of defaults, validators, round trips, unknown fields."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from pydantic import BaseModel, ValidationError

from flashruntime.protocol import v1alpha1 as p

JOBSPEC_EXAMPLE = """
{"apiVersion": "flashml.dev/v1alpha1", "kind": "Job", "metadata": {"name": "sweep-a"},
 "spec": {"execution": {"backend": "leases"}, "image": {"repository": "ghcr.io/acme/train", "tag": "1.2"},
          "workload": {"type": "command", "parameters": {"command": ["python", "t.py", "--lr", "{lr}"],
                       "task_params": [{"lr": 0.1}, {"lr": 0.01}]}},
          "isolation": {"tier": "sandboxed"}, "placement": {"pool": "team-7"}}}
"""
T0 = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)


def minimal_instances() -> dict[str, BaseModel]:
    image = p.ImageSpec(repository="ghcr.io/acme/train", tag="1.2")
    spec = p.JobSpec.model_validate_json(JOBSPEC_EXAMPLE)
    part = p.CheckpointPart(key="model.pt", sha256="ab" * 32, size_bytes=10)
    registration = p.NodeRegistration(
        node_id="n1", kubernetes_node="k1", hostname="h1",
        capabilities=p.NodeCapabilities(gpus=[{"index": 0, "name": "L4"}], pools=["team-7"]),
    )
    return {
        "ExecutionSpec": p.ExecutionSpec(),
        "ImageSpec": image,
        "WorkloadSpec": p.WorkloadSpec(type="command"),
        "ResourcesSpec": p.ResourcesSpec(),
        "PlacementSpec": p.PlacementSpec(),
        "IsolationSpec": p.IsolationSpec(),
        "RetryPolicySpec": p.RetryPolicySpec(),
        "ArtifactsSpec": p.ArtifactsSpec(),
        "JobMetadata": p.JobMetadata(name="a"),
        "JobSpecInner": spec.spec,
        "JobSpec": spec,
        "Event": p.Event(job_id="j", type=p.EventType.LEASE_CLAIMED, source="flashruntime.leases", timestamp=T0),
        "ArtifactRecord": p.ArtifactRecord(uri="artifact://x", backend="local", bucket="b", object_key="k", created_at=T0),
        "JobRecord": p.JobRecord(job_id="j", spec=spec, created_at=T0),
        "SubmittedBy": p.SubmittedBy(role="submitter", name="alice"),
        "GpuInfo": p.GpuInfo(index=0),
        "NodeCapabilities": registration.capabilities,
        "NodeRegistration": registration,
        "NodeHeartbeat": p.NodeHeartbeat(node_id="n1", timestamp=T0),
        "NodeStatusView": p.NodeStatusView(registration=registration, online=True, last_heartbeat=T0),
        "TaskSpec": p.TaskSpec(task_id="t", job_id="j", commit_key="k"),
        "Lease": p.Lease(lease_id="ls-1", task_id="t", job_id="j", node_id="n", attempt_number=1, deadline=T0),
        "TaskAttempt": p.TaskAttempt(attempt_id="a", task_id="t", job_id="j", node_id="n", attempt_number=1, started=T0),
        "ExecutionEvidence": p.ExecutionEvidence(wall_seconds=0.0, exit_code=0),
        "CheckpointPart": part,
        "CheckpointManifest": p.CheckpointManifest(
            manifest_id="ck-1", job_id="j", attempt_id="a", step=3, storage_prefix="/x", parts=[part],
            validation=p.CheckpointValidation.HASH_VERIFIED, created=T0,
        ),
        "RecoveryDecision": p.RecoveryDecision(
            policy_version="0.1.0", failure_class="node_loss", action="retry_task", scope="task",
            reason="r", decided_at=T0,
        ),
        "ClaimRequest": p.ClaimRequest(node_id="n"),
        "CompleteRequest": p.CompleteRequest(output_sha256="ab" * 32),
        "FailRequest": p.FailRequest(reason="boom"),
        "ReleaseRequest": p.ReleaseRequest(reason="agent shutdown"),
        "RegisterPartRequest": p.RegisterPartRequest(attempt_id="a", step=0, part=part),
        "CommitRequest": p.CommitRequest(attempt_id="a", step=1, expected_parts=[part], storage_prefix="/x"),
        "CordonRequest": p.CordonRequest(seconds=30),
    }


def test_every_model_is_covered() -> None:
    models = {
        name for name in p.__all__
        if isinstance(getattr(p, name), type) and issubclass(getattr(p, name), BaseModel)
    }
    assert models == set(minimal_instances())


@pytest.mark.parametrize("name", sorted(minimal_instances()))
def test_json_round_trip(name: str) -> None:
    instance = minimal_instances()[name]
    again = type(instance).model_validate_json(instance.model_dump_json())
    assert again == instance


@pytest.mark.parametrize("name", sorted(minimal_instances()))
def test_unknown_fields_are_ignored(name: str) -> None:
    instance = minimal_instances()[name]
    data = json.loads(instance.model_dump_json())
    data["field_from_a_newer_peer"] = {"anything": [1, 2]}
    again = type(instance).model_validate(data)
    assert again == instance
    assert "field_from_a_newer_peer" not in again.model_dump()


def test_constants() -> None:
    assert p.API_VERSION == "flashml.dev/v1alpha1"
    assert p.SCHEMA_VERSION == "v1alpha1"
    assert p.LABEL_JOB_ID == "flashml.dev/job-id"
    assert p.LABEL_RUNTIME_ID == "flashml.dev/runtime-id"
    assert p.LABEL_BACKEND == "flashml.dev/backend"
    assert p.LABEL_PROFILE == "flashml.dev/deployment-profile"


def test_utcnow_is_aware_utc() -> None:
    now = p.utcnow()
    assert now.tzinfo is not None and now.utcoffset() == timedelta(0)


def test_jobspec_example_parses_with_defaults() -> None:
    spec = p.JobSpec.model_validate_json(JOBSPEC_EXAMPLE)
    assert spec.apiVersion == p.API_VERSION and spec.kind == "Job"
    assert spec.spec.execution.backend == "leases" and spec.spec.execution.environment == "auto"
    assert spec.spec.image.reference == "ghcr.io/acme/train:1.2"
    assert spec.spec.workload.parameters["task_params"] == [{"lr": 0.1}, {"lr": 0.01}]
    assert spec.spec.isolation.tier == "sandboxed" and spec.spec.isolation.allowFallback is False
    assert spec.spec.placement.pool == "team-7" and spec.spec.placement.architectures == ["amd64"]
    assert spec.spec.resources == p.ResourcesSpec(minimumWorkers=2, maximumWorkers=3, cpuPerTask=1, gpuPerTask=0)
    assert spec.spec.resources.memoryPerTask == "512Mi"
    assert spec.spec.retryPolicy.maxTaskAttempts == 4 and spec.spec.retryPolicy.retryWorkerLoss is True
    assert spec.spec.artifacts.outputPrefix == "artifact://jobs/{job_id}/"


def test_jobspec_rejects_wrong_api_version_and_kind() -> None:
    data = json.loads(JOBSPEC_EXAMPLE)
    with pytest.raises(ValidationError):
        p.JobSpec.model_validate({**data, "apiVersion": "flashml.dev/v2"})
    with pytest.raises(ValidationError):
        p.JobSpec.model_validate({**data, "kind": "Pod"})


def test_mutable_defaults_are_fresh_per_instance() -> None:
    a, b = p.WorkloadSpec(type="x"), p.WorkloadSpec(type="x")
    a.parameters["k"] = 1
    assert b.parameters == {}
    c, d = p.PlacementSpec(), p.PlacementSpec()
    c.architectures.append("arm64")
    assert d.architectures == ["amd64"]


@pytest.mark.parametrize("tag", ["1.2", "v3", "sha-abc", "latest-2"])
def test_image_tag_accepts_pinned(tag: str) -> None:
    assert p.ImageSpec(repository="r", tag=tag).reference == f"r:{tag}"


@pytest.mark.parametrize("tag, message", [("latest", "not reproducible"), ("", "must not be empty")])
def test_image_tag_refuses_latest_and_empty(tag: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        p.ImageSpec(repository="r", tag=tag)


def test_image_reference_is_read_only() -> None:
    image = p.ImageSpec(repository="r", tag="1")
    with pytest.raises(AttributeError):
        image.reference = "x:y"  # type: ignore[misc]


@pytest.mark.parametrize("name", ["a", "sweep-a", "0", "a" * 63, "a-b-c", "9lives"])
def test_dns1123_accepts(name: str) -> None:
    assert p.JobMetadata(name=name).name == name


@pytest.mark.parametrize("name", ["", "A", "sweep_a", "-a", "a-", "a" * 64, "a.b", "é", "a b"])
def test_dns1123_rejects(name: str) -> None:
    with pytest.raises(ValidationError, match="DNS-1123"):
        p.JobMetadata(name=name)


def test_resources_bounds() -> None:
    assert p.ResourcesSpec(minimumWorkers=3, maximumWorkers=3).maximumWorkers == 3
    with pytest.raises(ValidationError, match=r"maximumWorkers \(1\) must be >= minimumWorkers \(2\)"):
        p.ResourcesSpec(maximumWorkers=1)
    for bad in ({"minimumWorkers": 0}, {"maximumWorkers": 0}, {"cpuPerTask": 0}, {"gpuPerTask": -1}):
        with pytest.raises(ValidationError):
            p.ResourcesSpec(**bad)


def test_artifacts_prefix_must_be_artifact_scheme() -> None:
    assert p.ArtifactsSpec(outputPrefix="artifact://x/").outputPrefix == "artifact://x/"
    with pytest.raises(ValidationError, match="must start with 'artifact://'"):
        p.ArtifactsSpec(outputPrefix="s3://bucket/")


def test_literals_are_enforced() -> None:
    with pytest.raises(ValidationError):
        p.ExecutionSpec(backend="slurm")
    with pytest.raises(ValidationError):
        p.IsolationSpec(tier="vm")
    with pytest.raises(ValidationError):
        p.PlacementSpec(architectures=["riscv"])
    with pytest.raises(ValidationError):
        p.NodeHeartbeat(node_id="n", status="sleeping")


def test_retry_policy_bound() -> None:
    with pytest.raises(ValidationError):
        p.RetryPolicySpec(maxTaskAttempts=0)


def test_job_state_values_and_terminal() -> None:
    assert [s.value for s in p.JobState] == [
        "PENDING", "SUBMITTED", "RUNNING", "RECOVERING", "SUCCEEDED", "FAILED", "CANCELLED"
    ]
    assert {s for s in p.JobState if s.terminal} == {p.JobState.SUCCEEDED, p.JobState.FAILED, p.JobState.CANCELLED}


def test_event_type_members_in_order() -> None:
    assert [e.name for e in p.EventType] == [
        "JOB_ACCEPTED", "BACKEND_SELECTED", "RAYJOB_CREATED", "RAY_CLUSTER_STARTING", "NODE_REGISTERED",
        "NODE_READY", "TASK_ATTEMPT_STARTED", "TASK_ATTEMPT_COMPLETED", "NODE_HEARTBEAT_LOST", "RAY_WORKER_LOST",
        "TASK_ATTEMPT_RETRIED", "RAY_WORKER_REPLACED", "ITERATION_COMPLETED", "ARTIFACT_UPLOAD_STARTED",
        "ARTIFACT_COMMITTED", "JOB_SUCCEEDED", "JOB_FAILED",
        "TASK_CREATED", "LEASE_CLAIMED", "LEASE_RENEWED", "LEASE_EXPIRED", "TASK_REQUEUED",
        "TASK_COMMIT_ACCEPTED", "TASK_COMMIT_REJECTED", "TASK_ATTEMPT_FAILED", "TASK_EXHAUSTED",
        "CHECKPOINT_PARTS_REGISTERED", "CHECKPOINT_MANIFEST_COMMITTED", "CHECKPOINT_RESTORE_VERIFIED",
        "CHECKPOINT_REJECTED",
        "FAILURE_CLASSIFIED", "RECOVERY_ACTION_SELECTED", "RECOVERY_FROZEN",
        "TASK_CANCELLED", "LEASE_RENEWAL_REFUSED", "NODE_CORDONED", "LEASE_RELEASED",
        "STRAGGLER_DETECTED", "HANG_DETECTED", "GANG_JOINED",
    ]
    assert all(e.value == e.name for e in p.EventType)


def test_other_enums_in_order() -> None:
    assert [e.value for e in p.TaskState] == ["PENDING", "LEASED", "COMPLETED", "FAILED", "CANCELLED"]
    assert [e.value for e in p.NodeEnvironment] == ["local", "cloud", "edge"]
    assert [e.value for e in p.CheckpointValidation] == ["hash_verified", "restore_verified", "invalid"]
    assert [e.value for e in p.FailureClass] == [
        "application_error", "data_error", "worker_crash", "node_loss", "accelerator_failure",
        "communication_error", "network_degradation", "storage_timeout", "artifact_corruption", "preemption",
        "correlated_incident", "control_plane_failure", "unknown", "hang",
    ]
    assert all(e.name == e.value.upper() for e in p.FailureClass)
    assert [e.value for e in p.RecoveryActionType] == [
        "fail_job", "retry_task", "restart_group", "replace_node", "pause_job", "freeze_automation"
    ]
    assert all(e.name == e.value.upper() for e in p.RecoveryActionType)


@pytest.mark.parametrize("member", [p.FailureClass.NODE_LOSS, p.RecoveryActionType.RETRY_TASK, p.JobState.FAILED,
                                    p.NodeEnvironment.EDGE, p.CheckpointValidation.INVALID, p.TaskState.LEASED])
def test_str_enums_render_their_value(member: object) -> None:
    assert isinstance(member, str)
    assert str(member) == member.value  # type: ignore[attr-defined]
    assert f"{member}" == member.value  # type: ignore[attr-defined]
    assert "{}|{:>3}".format(member, member).startswith(member.value)  # type: ignore[attr-defined]


def test_event_defaults_and_enum_coercion() -> None:
    event = p.Event(job_id="", type="NODE_CORDONED", source="flashruntime.leases")
    assert event.type is p.EventType.NODE_CORDONED
    assert event.schema_version == "v1alpha1" and event.message == "" and event.data == {}
    assert event.timestamp.tzinfo is not None
    with pytest.raises(ValidationError):
        p.Event(job_id="j", type="NOT_A_TYPE", source="x")


def test_naive_datetimes_are_read_as_utc_and_serialised_with_offset() -> None:
    lease = p.Lease(lease_id="l", task_id="t", job_id="j", node_id="n", attempt_number=1,
                    deadline=datetime(2026, 1, 1, 12, 0))
    assert lease.deadline == T0 and lease.deadline.tzinfo is not None
    other_zone = datetime(2026, 1, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    assert p.Lease(**{**lease.model_dump(), "deadline": other_zone}).deadline.utcoffset() == timedelta(0)
    text = json.loads(lease.model_dump_json())["deadline"]
    assert text.endswith("Z") or text.endswith("+00:00")
    assert p.Lease.model_validate_json(lease.model_dump_json()).deadline == T0


def test_task_spec_defaults() -> None:
    spec = p.TaskSpec(task_id="t", job_id="j", commit_key="k")
    assert (spec.max_attempts, spec.max_expiries, spec.lease_seconds, spec.payload) == (3, 9, 60.0, {})


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), 0, -1, "nan"])
def test_task_spec_refuses_bad_lease_seconds(value: object) -> None:
    with pytest.raises(ValidationError):
        p.TaskSpec(task_id="t", job_id="j", commit_key="k", lease_seconds=value)


def test_task_spec_budget_bounds() -> None:
    for field in ("max_attempts", "max_expiries"):
        with pytest.raises(ValidationError):
            p.TaskSpec(task_id="t", job_id="j", commit_key="k", **{field: 0})
    assert p.TaskSpec(task_id="t", job_id="j", commit_key="k", lease_seconds="2.5").lease_seconds == 2.5


def test_lease_and_attempt_defaults() -> None:
    lease = minimal_instances()["Lease"]
    assert lease.lease_seconds == 0.0 and lease.payload == {}
    attempt = minimal_instances()["TaskAttempt"]
    assert attempt.outcome == "running" and attempt.accepted is False and attempt.finished is None
    with pytest.raises(ValidationError):
        p.TaskAttempt(**{**attempt.model_dump(), "outcome": "won"})


def test_execution_evidence_keeps_none_distinct_from_zero() -> None:
    unmeasured = p.ExecutionEvidence()
    zero = p.ExecutionEvidence(wall_seconds=0.0, cpu_percent_mean=0.0, gpu_util_percent_mean=0.0, exit_code=0)
    assert unmeasured != zero
    for field in ("wall_seconds", "cpu_percent_mean", "gpu_util_percent_mean", "exit_code"):
        assert getattr(unmeasured, field) is None
        assert getattr(zero, field) == 0 and getattr(zero, field) is not None
    round_trip = p.ExecutionEvidence.model_validate_json(zero.model_dump_json())
    assert round_trip.wall_seconds == 0.0 and round_trip.exit_code == 0
    assert p.ExecutionEvidence.model_validate_json(unmeasured.model_dump_json()).wall_seconds is None
    assert unmeasured.image_digest == ""


def test_execution_evidence_is_unconstrained() -> None:
    odd = p.ExecutionEvidence(wall_seconds=-5, cpu_percent_mean=1e9, gpu_util_percent_mean=-1, exit_code=-9,
                              image_digest="not-a-digest")
    assert odd.wall_seconds == -5 and odd.cpu_percent_mean == 1e9 and odd.exit_code == -9


def test_node_heartbeat_pools_none_vs_empty_preserved() -> None:
    silent = p.NodeHeartbeat(node_id="n")
    emptied = p.NodeHeartbeat(node_id="n", pools=[])
    assert silent.pools is None and emptied.pools == []
    assert p.NodeHeartbeat.model_validate_json(silent.model_dump_json()).pools is None
    assert p.NodeHeartbeat.model_validate_json(emptied.model_dump_json()).pools == []
    assert silent.status == "online"


def test_node_registration_defaults_and_coercion() -> None:
    reg = minimal_instances()["NodeRegistration"]
    assert isinstance(reg.capabilities.gpus[0], p.GpuInfo) and reg.capabilities.gpus[0].name == "L4"
    assert reg.environment is p.NodeEnvironment.LOCAL
    assert (reg.sandbox_capable, reg.argv_capable, reg.unsandboxed_argv_capable, reg.module_capable) == (
        False, False, False, True
    )
    assert (reg.pool, reg.runtime_profile, reg.local_datasets, reg.labels, reg.agent_version) == (
        "local", "kubernetes", [], {}, ""
    )
    assert p.NodeCapabilities().pools == [] and p.NodeCapabilities().cpu_cores is None


def test_checkpoint_models() -> None:
    with pytest.raises(ValidationError):
        p.CheckpointPart(key="k", sha256="x", size_bytes=-1)
    manifest = minimal_instances()["CheckpointManifest"]
    assert manifest.world_size == 1 and manifest.compatible_world_sizes == [] and manifest.framework == ""
    assert manifest.checkpoint_duration_s is None
    with pytest.raises(ValidationError):
        p.CheckpointManifest(**{**manifest.model_dump(), "step": -1})
    with pytest.raises(ValidationError):
        p.CheckpointManifest(**{**manifest.model_dump(), "world_size": 0})
    with pytest.raises(ValidationError):
        p.CheckpointManifest(**{**manifest.model_dump(), "validation": "trusted"})


def test_recovery_decision_model() -> None:
    decision = minimal_instances()["RecoveryDecision"]
    assert decision.failure_class is p.FailureClass.NODE_LOSS and decision.action is p.RecoveryActionType.RETRY_TASK
    assert decision.cordon_node is False and decision.needs_checkpoint is False and decision.evidence == {}
    with pytest.raises(ValidationError):
        p.RecoveryDecision(**{**decision.model_dump(), "scope": "cluster"})


def test_request_models() -> None:
    assert p.ClaimRequest(node_id="n").job_id is None
    assert p.CompleteRequest(output_sha256="x").evidence is None
    with_evidence = p.CompleteRequest.model_validate({"output_sha256": "x", "evidence": {"wall_seconds": 0}})
    assert with_evidence.evidence is not None and with_evidence.evidence.wall_seconds == 0.0
    with pytest.raises(ValidationError):
        p.RegisterPartRequest(attempt_id="a", step=-1, part={"key": "k", "sha256": "s", "size_bytes": 1})
    commit = minimal_instances()["CommitRequest"]
    assert (commit.world_size, commit.framework, commit.strategy_family) == (1, "", "")
    with pytest.raises(ValidationError):
        p.CommitRequest(**{**commit.model_dump(), "step": -2})


def test_cordon_request() -> None:
    assert p.CordonRequest().seconds is None and p.CordonRequest().until is None  # indefinite
    assert p.CordonRequest(until=datetime(2026, 1, 1)).until == datetime(2026, 1, 1, tzinfo=timezone.utc)
    with pytest.raises(ValidationError, match="not both"):
        p.CordonRequest(seconds=5, until=T0)
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValidationError):
            p.CordonRequest(seconds=bad)


def test_schema_version_is_pinned() -> None:
    with pytest.raises(ValidationError):
        p.TaskSpec(task_id="t", job_id="j", commit_key="k", schema_version="v2")
