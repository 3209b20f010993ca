"""The checks a job passes before it is stored, each a plain function of what it needs.

``Coordinator.submit`` runs them in order: the backend and the permission to run commands
first (their refusals describe the request as sent), then the bounds (``admission``), the
parameters, and, once the job has expanded into tasks, the inputs each task would read and
the placement Ray can honour. Each raises the refusal itself; nothing here reads or writes a
store, so a refused job leaves no trace.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from flashruntime.coordinator.access import artifact_read_allowed
from flashruntime.coordinator.auth import ARGV_SUBMITTERS_ENV, Identity, Role
from flashruntime.errors import AuthFailure, CodeExecutionNotPermitted, ExpansionError, NoBackend
from flashruntime.protocol.v1alpha1 import JobSpec, SubmittedBy
from flashruntime.ray_backend.resources import ray_options, unplaceable_reason

__all__ = [
    "SUBMITTED_BY_KEY",
    "require_code_permission",
    "require_configured_backend",
    "require_finite_parameters",
    "require_ray_placement",
    "require_readable_inputs",
    "submitter_of",
]

# The task payload key that tells a worker who submitted the job and whether that
# submitter may have commands run: {"role", "name", "may_run_code"}.
SUBMITTED_BY_KEY = "submitted_by"
_OPEN_MODE_SUBMITTER = {"role": "anonymous", "name": None, "may_run_code": True}


def require_configured_backend(backend: str, configured: Sequence[str]) -> None:
    """``NoBackend`` when this coordinator runs no ``backend``."""
    if backend not in configured:
        raise NoBackend(
            f"backend {backend!r} is not configured on this coordinator: set FLASHML_RAY_ADDRESS (or serve "
            "--ray-address) to a Ray cluster's address to run jobs on Ray, or submit with "
            f"spec.execution.backend = 'leases' (the default here) to run them on the agent fleet"
        )


def require_code_permission(identity: Identity) -> None:
    """``CodeExecutionNotPermitted`` when ``identity`` may not have commands run (open mode: anyone may)."""
    if identity.role is None or identity.may_run_code:
        return
    who = f"{identity.role.value} {identity.name!r}" if identity.name else "this token"
    raise CodeExecutionNotPermitted(
        f"this job runs commands on the fleet, and {who} may not run code: running commands is a separate "
        f"permission; ask the coordinator's operator to add the name to {ARGV_SUBMITTERS_ENV}"
    )


def require_finite_parameters(spec: JobSpec) -> None:
    """``ExpansionError`` naming the first NaN or infinity in the workload's parameters."""
    where = _non_finite(spec.spec.workload.parameters, "spec.workload.parameters")
    if where is not None:
        raise ExpansionError(
            f"{where[0]} is {where[1]}: workload parameters must be finite numbers (JSON has no NaN or "
            "Infinity, and the job record would keep it as null); give a finite number, or a string such as "
            "'nan' if your task reads one"
        )


def require_readable_inputs(identity: Identity, tasks: Sequence[Any], job_owned: Callable[[str], bool]) -> None:
    """``AuthFailure`` (403) for the first task input naming an artifact ``identity`` may not read:
    a node reads its tasks' inputs, so a job must not fetch what its submitter cannot.
    ``job_owned``: whether a job id is ``identity``'s own."""
    if identity.role is None or identity.role is Role.OPERATOR:
        return  # open mode checks nothing; an operator reads everything
    for task in tasks:
        inputs = task.payload.get("inputs")
        for name, uri in (inputs.items() if isinstance(inputs, dict) else ()):
            if not (isinstance(uri, str) and uri.startswith("artifact://")):
                continue
            key = uri[len("artifact://"):]
            if not artifact_read_allowed(identity, key, live=[], job_owned=job_owned):
                raise AuthFailure(
                    403, f"input {name!r} of task {task.task_id!r} is {uri}, which this token may not read: a "
                         f"job may use as inputs only artifacts its submitter can read (users/{identity.name}/... "
                         "or jobs/<job>/... of its own jobs)")


def require_ray_placement(tasks: Sequence[Any], nodes: Sequence[Mapping[str, Any]] | None) -> None:
    """``ExpansionError`` (422) for the first task Ray cannot honour: a gate with no Ray
    equivalent, or resources no node of the cluster has (``nodes``: the cluster's, when known)."""
    for task in tasks:
        options, why = ray_options(task.payload)
        if why is None and nodes is not None:
            why = unplaceable_reason(options or {}, nodes)
        if why is not None:
            raise ExpansionError(f"task {task.task_id!r} cannot run on Ray: {why}")


def submitter_of(identity: Identity) -> tuple[SubmittedBy | None, dict[str, Any]]:
    """(the job record's ``submitted_by``, the payload stamp) for a submitting identity."""
    if identity.role is Role.SUBMITTER or identity.role is Role.OPERATOR:
        name = identity.name or identity.role.value
        return (SubmittedBy(role=identity.role.value, name=name),
                {"role": identity.role.value, "name": name, "may_run_code": identity.may_run_code})
    return None, dict(_OPEN_MODE_SUBMITTER)


def _non_finite(value: Any, path: str) -> tuple[str, float] | None:
    """(where, value) of the first NaN or infinity in a JSON-like ``value``, or None.
    Iterative: a deeply nested body must not exhaust the stack here."""
    stack: list[tuple[str, Any]] = [(path, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return where, item
        elif isinstance(item, dict):
            stack.extend(reversed([(f"{where}.{key}", inner) for key, inner in item.items()]))
        elif isinstance(item, (list, tuple)):
            stack.extend(reversed([(f"{where}[{i}]", inner) for i, inner in enumerate(item)]))
    return None
