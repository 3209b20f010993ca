"""The checks a job passes before the coordinator stores it, each on its own."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from flashruntime.coordinator.admission_checks import (
    require_code_permission,
    require_configured_backend,
    require_finite_parameters,
    require_ray_placement,
    require_readable_inputs,
    submitter_of,
)
from flashruntime.coordinator.auth import Identity
from flashruntime.errors import AuthFailure, CodeExecutionNotPermitted, ExpansionError, NoBackend
from flashruntime.protocol.v1alpha1 import JobSpec

OPEN = Identity(None, False)
ALICE = Identity(None, False, "alice", submitter=True)
ALICE_RUNS_CODE = Identity(None, False, "alice", submitter=True, may_run_code=True)
OPERATOR = Identity(None, True, "ops")


def _task(task_id: str, **payload: object) -> SimpleNamespace:
    return SimpleNamespace(task_id=task_id, payload=payload)


def _spec(parameters: dict) -> JobSpec:
    return JobSpec.model_validate({"apiVersion": "flashml.dev/v1alpha1", "kind": "Job",
                                   "metadata": {"name": "checks"},
                                   "spec": {"workload": {"type": "command", "parameters": parameters}}})


def test_a_backend_the_coordinator_does_not_run_is_refused_with_how_to_configure_it() -> None:
    require_configured_backend("leases", ("leases",))
    with pytest.raises(NoBackend, match="FLASHML_RAY_ADDRESS"):
        require_configured_backend("ray", ("leases",))


def test_only_a_submitter_without_the_permission_is_refused_commands() -> None:
    for allowed in (OPEN, ALICE_RUNS_CODE):
        require_code_permission(allowed)
    with pytest.raises(CodeExecutionNotPermitted, match="submitter 'alice' may not run code"):
        require_code_permission(ALICE)


def test_the_first_non_finite_parameter_is_named_by_its_path() -> None:
    require_finite_parameters(_spec({"lr": 0.1, "grid": [1, 2]}))
    with pytest.raises(ExpansionError, match=r"spec\.workload\.parameters\.grid\[1\]\.x is inf"):
        require_finite_parameters(_spec({"lr": 0.1, "grid": [{"x": 1.0}, {"x": float("inf")}]}))


def test_a_submitter_may_use_as_inputs_only_artifacts_it_can_read() -> None:
    mine = _task("t0", inputs={"data": "artifact://users/alice/train.csv", "url": "https://example.com/x"})
    own_job = _task("t1", inputs={"ckpt": "artifact://jobs/j1/t0/model.pt"})
    theirs = _task("t2", inputs={"data": "artifact://users/bob/secret.csv"})
    owned = {"j1"}.__contains__
    require_readable_inputs(ALICE, [mine, own_job], owned)
    with pytest.raises(AuthFailure, match="input 'data' of task 't2'") as refused:
        require_readable_inputs(ALICE, [mine, theirs], owned)
    assert refused.value.status_code == 403
    for unchecked in (OPEN, OPERATOR):
        require_readable_inputs(unchecked, [theirs], owned)


def test_a_task_asking_for_more_than_any_ray_node_has_is_refused_before_it_is_stored() -> None:
    task = _task("t0", gpus=4)
    require_ray_placement([task], None)  # the cluster unknown: nothing to measure against
    require_ray_placement([task], [{"CPU": 2.0}, {"CPU": 8.0, "GPU": 4.0}])
    with pytest.raises(ExpansionError, match="task 't0' cannot run on Ray: no node of the Ray cluster has"):
        require_ray_placement([task], [{"CPU": 2.0, "memory": 8e9}])
    with pytest.raises(ExpansionError, match="isolation tier 'sandboxed' needs a sandbox"):
        require_ray_placement([_task("t1", isolation={"tier": "sandboxed"})], None)


def test_the_job_record_and_every_task_payload_name_the_submitter() -> None:
    assert submitter_of(OPEN) == (None, {"role": "anonymous", "name": None, "may_run_code": True})
    record, stamp = submitter_of(ALICE_RUNS_CODE)
    assert (record.role, record.name) == ("submitter", "alice")
    assert stamp == {"role": "submitter", "name": "alice", "may_run_code": True}
