"""The Ray backend's pure rules, without Ray: address forms, placement gates as Ray
resources, Ray's errors in the recovery taxonomy, which claimer sees which tasks, and a
failure that must not be retried."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from flashruntime.errors import BadRayAddress
from flashruntime.leases import InMemoryLeaseStore, LeaseManager
from flashruntime.protocol.v1alpha1 import EventType, FailureClass, TaskSpec, TaskState
from flashruntime.ray_backend.cluster import parse_ray_address
from flashruntime.ray_backend.failures import classify_ray_error, is_cancellation
from flashruntime.ray_backend.resources import CUSTOM_RESOURCE_SHARE, ray_options, unplaceable_reason

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


@pytest.mark.parametrize("address", ["local", "auto", "ray://ray-head:10001", "10.0.0.5:6379", " auto ",
                                     "ray://[::1]:10001", "head.cluster.local:6379"])
def test_the_address_forms_are_taken(address: str) -> None:
    assert parse_ray_address(address) == address.strip()


@pytest.mark.parametrize("address", ["", "nowhere", "http://head:10001", "ray://head", "head:0", "head:70000",
                                     "ray://", "loc al"])
def test_other_addresses_are_refused_naming_the_setting_and_the_forms(address: str) -> None:
    with pytest.raises(BadRayAddress, match=r"--ray-address must be local, auto, ray://host:port or host:port"):
        parse_ray_address(address, source="--ray-address")


def test_the_settings_read_the_ray_address_and_refuse_a_bad_one() -> None:
    from flashruntime.coordinator.settings import RuntimeSettings

    assert RuntimeSettings.from_env({"FLASHML_RAY_ADDRESS": "ray://head:10001"}).ray_address == "ray://head:10001"
    assert RuntimeSettings.from_env({"FLASHML_RAY_ADDRESS": ""}).ray_address is None
    with pytest.raises(ValueError, match="FLASHML_RAY_ADDRESS must be local, auto"):
        RuntimeSettings.from_env({"FLASHML_RAY_ADDRESS": "somewhere"})


@pytest.mark.parametrize(("payload", "options"), [
    ({}, {"num_cpus": 1}),
    ({"gpus": 0}, {"num_cpus": 1}),
    ({"gpus": 2}, {"num_cpus": 1, "num_gpus": 2}),
    ({"pool": "team-a"}, {"num_cpus": 1, "resources": {"pool:team-a": CUSTOM_RESOURCE_SHARE}}),
    ({"local_inputs": ["imagenet", "coco"]},
     {"num_cpus": 1, "resources": {"dataset:imagenet": CUSTOM_RESOURCE_SHARE, "dataset:coco": CUSTOM_RESOURCE_SHARE}}),
    ({"isolation": {"tier": "standard", "allowFallback": False}}, {"num_cpus": 1}),
    ({"isolation": {"tier": "sandboxed", "allowFallback": True}}, {"num_cpus": 1}),
    ({"exclude_nodes": []}, {"num_cpus": 1}),
])
def test_gates_become_ray_resources(payload: dict[str, Any], options: dict[str, Any]) -> None:
    assert ray_options(payload) == (options, None)


@pytest.mark.parametrize(("payload", "words"), [
    ({"isolation": {"tier": "sandboxed"}}, "needs a sandbox, which a Ray worker does not have"),
    ({"isolation": "sandboxed"}, "isolation must be an object"),
    ({"exclude_nodes": ["w1"]}, "exclude_nodes names agent nodes"),
    ({"gpus": -1}, "gpus must be a whole number"),
    ({"gpus": True}, "gpus must be a whole number"),
    ({"pool": ""}, "pool must be a non-empty name"),
    ({"local_inputs": "imagenet"}, "local_inputs must be a list"),
])
def test_what_ray_cannot_honour_is_refused_with_a_reason(payload: dict[str, Any], words: str) -> None:
    options, why = ray_options(payload)
    assert options is None and why is not None and words in why


def test_a_task_is_placeable_when_one_node_has_everything_it_asks() -> None:
    cpu_node = {"CPU": 8.0, "memory": 1e9, "node:10.0.0.1": 1.0}
    gpu_node = {"CPU": 4.0, "GPU": 2.0, "pool:team-a": 1000.0}
    assert unplaceable_reason({"num_cpus": 1}, [cpu_node]) is None
    assert unplaceable_reason({"num_cpus": 1, "num_gpus": 2, "resources": {"pool:team-a": 0.001}},
                              [cpu_node, gpu_node]) is None
    why = unplaceable_reason({"num_cpus": 1, "num_gpus": 1, "resources": {"pool:team-b": 0.001}},
                             [cpu_node, gpu_node])
    assert why is not None and "no node of the Ray cluster has CPU: 1, GPU: 1, pool:team-b: 0.001" in why
    assert "node:10.0.0.1" not in why and "CPU 8" in why  # what the nodes offer, without Ray's bookkeeping
    assert unplaceable_reason({"num_cpus": 1}, []) == "the Ray cluster has no live node"


def _error(name: str, *, bases: tuple[type, ...] = (Exception,), message: str = "", cause: Any = None) -> Exception:
    error = type(name, bases, {})(message)
    if cause is not None:
        error.cause = cause  # type: ignore[attr-defined]
    return error


@pytest.mark.parametrize(("name", "failure", "words"), [
    ("WorkerCrashedError", FailureClass.WORKER_CRASH, "the Ray worker process died"),
    ("NodeDiedError", FailureClass.NODE_LOSS, "the Ray node died"),
    ("OutOfMemoryError", FailureClass.WORKER_CRASH, "out of memory"),
    ("OwnerDiedError", FailureClass.WORKER_CRASH, "owned the attempt died"),
    ("LocalRayletDiedError", FailureClass.NODE_LOSS, "raylet died"),
])
def test_what_ray_reports_is_classified_into_the_taxonomy(name: str, failure: FailureClass, words: str) -> None:
    assert classify_ray_error(_error(name)) == (failure, classify_ray_error(_error(name))[1])
    assert words in classify_ray_error(_error(name))[1]


def test_a_subclass_and_a_wrapped_error_are_classified_by_what_they_are() -> None:
    crashed = _error("WorkerCrashedError")
    assert classify_ray_error(_error("Special", bases=(type(crashed),)))[0] is FailureClass.WORKER_CRASH
    wrapped = _error("RayTaskError", message="\x1b[36mray::task()\x1b[39m (pid=1)\nRuntimeError: boom",
                     cause=RuntimeError("boom"))
    assert classify_ray_error(wrapped) == (FailureClass.UNKNOWN, "Ray raised RuntimeError: boom")
    assert classify_ray_error(_error("RaySystemError", message="\x1b[31mgone\x1b[0m")) == (
        FailureClass.UNKNOWN, "Ray raised RaySystemError: gone")


def test_a_cancellation_is_told_apart_directly_or_wrapped() -> None:
    assert is_cancellation(_error("TaskCancelledError"))
    assert is_cancellation(_error("RayTaskError", cause=_error("TaskCancelledError")))
    assert not is_cancellation(_error("WorkerCrashedError"))


def _task(job: str, task: str, payload: dict[str, Any]) -> TaskSpec:
    return TaskSpec(task_id=task, job_id=job, payload=payload, commit_key=f"jobs/{job}/{task}/metrics.json",
                    max_attempts=3)


def test_agents_never_claim_a_ray_jobs_task_and_the_ray_dispatcher_claims_only_those() -> None:
    pytest.importorskip("fastapi")  # the placement lives in the coordinator package
    from flashruntime.coordinator.ray_dispatch import RAY_NODE_ID, BackendPlacement
    from flashruntime.scheduler import IsolationAwarePlacement

    manager = LeaseManager(InMemoryLeaseStore())
    manager.add_task(_task("rayjob", "t0", {"module": "flashml_workloads.sklearn_trial", "backend": "ray"}), now=NOW)
    agents = BackendPlacement("leases", IsolationAwarePlacement())
    ray = BackendPlacement("ray")
    assert manager.claim("w1", now=NOW, policy=agents, node={"node_id": "w1"}) is None
    manager.add_task(_task("leasejob", "t0", {"module": "flashml_workloads.sklearn_trial"}), now=NOW)
    assert manager.claim("w1", now=NOW, policy=agents, node={"node_id": "w1"}).job_id == "leasejob"
    lease = manager.claim(RAY_NODE_ID, now=NOW, policy=ray, node={"node_id": RAY_NODE_ID})
    assert lease is not None and lease.job_id == "rayjob"
    assert manager.claim(RAY_NODE_ID, now=NOW, policy=ray, node={"node_id": RAY_NODE_ID}) is None


def test_a_failure_without_a_retry_exhausts_the_task_at_once_and_says_why() -> None:
    events: list[Any] = []
    manager = LeaseManager(InMemoryLeaseStore(), on_event=events.append)
    manager.add_task(_task("j", "t", {}), now=NOW)
    lease = manager.claim("ray", now=NOW)
    manager.fail(lease.lease_id, "exit 1: ModuleNotFoundError: No module named 'x'", now=NOW + timedelta(seconds=1),
                 retry=False)
    record = manager.store.get("j", "t")
    assert record.state is TaskState.FAILED and record.failures_seen == 1 and record.attempts_used == 1
    exhausted = [event for event in events if event.type is EventType.TASK_EXHAUSTED]
    assert len(exhausted) == 1
    assert exhausted[0].message == ("failed without a retry: a retry would fail the same way (1 of 3 failures used, "
                                    "max_attempts)")
    assert not [event for event in events if event.type is EventType.TASK_REQUEUED]


def test_a_failure_with_a_retry_still_requeues() -> None:
    manager = LeaseManager(InMemoryLeaseStore())
    manager.add_task(_task("j", "t", {}), now=NOW)
    manager.fail(manager.claim("ray", now=NOW).lease_id, "exit 1", now=NOW)
    assert manager.store.get("j", "t").state is TaskState.PENDING


def test_flash_submit_to_an_unreachable_cluster_is_a_launch_error_before_anything_is_made(tmp_path: Any) -> None:
    pytest.importorskip("ray")
    import socket
    import sys

    import flashruntime as flash
    from flashruntime.errors import LaunchError
    from flashruntime.workloads.command import CommandWorkload, Source

    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    workload = CommandWorkload(command=[sys.executable, "-c", "pass"], source=Source(path=str(tmp_path)))
    with pytest.raises(LaunchError, match=rf"cannot connect to the Ray cluster at 127.0.0.1:{port}: nothing answers"):
        flash.submit(workload, output_dir=tmp_path / "run", executor="ray", ray_address=f"127.0.0.1:{port}",
                     quiet=True, watch=False)
    assert not (tmp_path / "run").exists()
