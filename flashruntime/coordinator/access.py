"""What each role may do on the coordinator: one table of routes and the scope rules.

``ROUTE_ACCESS`` names, for every route of the HTTP API, the roles it admits when
tokens are configured (an empty set: open to everyone) and, in words, the narrower
rule its handler applies to the objects it touches. The app refuses to start with a
route missing from it, the OpenAPI schema and the security docs are made from it, and
a test walks the live schema against it. In open mode (no tokens) nothing is checked.

The scope rules below are pure functions of an ``Identity`` and what the coordinator
knows (job owners, live leases), so they are tested without HTTP.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from flashruntime.coordinator.auth import Identity, Role, task_write_allowed, write_allowed

__all__ = [
    "ROUTE_ACCESS",
    "USERS_PREFIX",
    "LiveLease",
    "RouteAccess",
    "artifact_read_allowed",
    "artifact_write_allowed",
    "checkpoint_read_allowed",
    "owns_job",
    "submitter_prefix",
]

NODE, SUBMITTER, OPERATOR = Role.NODE, Role.SUBMITTER, Role.OPERATOR
USERS_PREFIX = "users/"


@dataclass(frozen=True)
class RouteAccess:
    """``roles``: who may call the route when tokens are configured (empty: anyone).
    ``scope``: what the handler narrows it to, for the docs."""

    roles: frozenset[Role]
    scope: str = ""

    @property
    def open(self) -> bool:
        return not self.roles


def _access(*roles: Role, scope: str = "") -> RouteAccess:
    return RouteAccess(frozenset(roles), scope)


_OWN_JOB = "a submitter: only jobs it submitted (any other id answers 404)"
_HOLDER = "the node holding the lease (an operator through X-FlashML-On-Behalf-Of)"
_TASK_LEASE = "a node: only a task it holds a live lease on"

ROUTE_ACCESS: Mapping[tuple[str, str], RouteAccess] = {
    ("GET", "/healthz"): _access(scope="liveness and profile; no data"),
    ("GET", "/livez"): _access(scope="the process answers"),
    ("GET", "/readyz"): _access(scope="the databases answer; 503 when they do not"),
    ("GET", "/"): _access(scope="the dashboard page itself holds no data; it asks for a token"),
    ("GET", "/openapi.json"): _access(NODE, SUBMITTER, OPERATOR, scope="any valid token"),
    ("GET", "/v1alpha1/whoami"): _access(NODE, SUBMITTER, OPERATOR, scope="the caller's own role and name"),
    ("POST", "/v1alpha1/jobs"): _access(
        SUBMITTER, OPERATOR, scope="a job that runs commands (argv) needs the code-execution permission "
                                   "(FLASHML_ARGV_SUBMITTERS), else 403"),
    ("GET", "/v1alpha1/jobs"): _access(SUBMITTER, OPERATOR, scope="a submitter: only jobs it submitted"),
    ("GET", "/v1alpha1/jobs/{job_id}"): _access(SUBMITTER, OPERATOR, scope=_OWN_JOB),
    ("GET", "/v1alpha1/jobs/{job_id}/events"): _access(SUBMITTER, OPERATOR, scope=_OWN_JOB),
    ("GET", "/v1alpha1/jobs/{job_id}/logs"): _access(SUBMITTER, OPERATOR, scope=_OWN_JOB),
    ("GET", "/v1alpha1/jobs/{job_id}/metrics"): _access(SUBMITTER, OPERATOR, scope=_OWN_JOB),
    ("POST", "/v1alpha1/jobs/{job_id}/cancel"): _access(SUBMITTER, OPERATOR, scope=_OWN_JOB),
    ("GET", "/v1alpha1/jobs/{job_id}/tasks"): _access(SUBMITTER, OPERATOR, scope=_OWN_JOB),
    ("GET", "/v1alpha1/jobs/{job_id}/artifacts"): _access(SUBMITTER, OPERATOR, scope=_OWN_JOB),
    ("POST", "/v1alpha1/nodes/register"): _access(
        NODE, scope="registers the token's own node (the body's node_id is replaced)"),
    ("POST", "/v1alpha1/nodes/{node_id}/heartbeat"): _access(NODE, scope="the path's node only"),
    ("GET", "/v1alpha1/nodes"): _access(OPERATOR),
    ("POST", "/v1alpha1/nodes/{node_id}/cordon"): _access(OPERATOR),
    ("DELETE", "/v1alpha1/nodes/{node_id}/cordon"): _access(OPERATOR),
    ("POST", "/v1alpha1/leases/claim"): _access(NODE, scope="claims for the token's own node"),
    ("POST", "/v1alpha1/attempts/{lease_id}/heartbeat"): _access(NODE, scope=_HOLDER),
    ("GET", "/v1alpha1/attempts/{lease_id}/watch"): _access(NODE, scope=_HOLDER),
    ("POST", "/v1alpha1/attempts/{lease_id}/complete"): _access(NODE, scope=_HOLDER),
    ("POST", "/v1alpha1/attempts/{lease_id}/fail"): _access(NODE, scope=_HOLDER),
    ("POST", "/v1alpha1/attempts/{lease_id}/release"): _access(NODE, scope=_HOLDER),
    ("PUT", "/v1alpha1/artifacts/{key}"): _access(
        NODE, SUBMITTER, OPERATOR,
        scope="a node: under jobs/<job>/<task>/ of its live leases; a submitter: under users/<name>/ and "
              "jobs/<job>/ of its own jobs; an operator: anywhere"),
    ("GET", "/v1alpha1/artifacts/{key}"): _access(
        NODE, SUBMITTER, OPERATOR,
        scope="a node: its live leases' inputs and jobs/<job>/<task>/; a submitter: users/<name>/ and its "
              "own jobs; an operator: anything"),
    ("POST", "/v1alpha1/jobs/{job_id}/tasks/{task_id}/checkpoints/parts"): _access(NODE, OPERATOR, scope=_TASK_LEASE),
    ("POST", "/v1alpha1/jobs/{job_id}/tasks/{task_id}/checkpoints/commit"): _access(
        NODE, OPERATOR, scope=_TASK_LEASE),
    ("GET", "/v1alpha1/jobs/{job_id}/tasks/{task_id}/checkpoints/latest"): _access(
        NODE, SUBMITTER, OPERATOR, scope=f"{_TASK_LEASE}; {_OWN_JOB}"),
    ("GET", "/v1alpha1/jobs/{job_id}/tasks/{task_id}/checkpoints/lost-work"): _access(
        NODE, SUBMITTER, OPERATOR, scope=f"{_TASK_LEASE}; {_OWN_JOB}"),
    ("GET", "/metrics"): _access(OPERATOR, scope="open to everyone with FLASHML_METRICS_PUBLIC=1"),
}


@dataclass(frozen=True)
class LiveLease:
    """What a node's live lease lets it touch: its task, and the artifacts named as its inputs."""

    job_id: str
    task_id: str
    input_keys: frozenset[str] = frozenset()


def owns_job(identity: Identity, submitted_by: Any) -> bool:
    """Whether ``identity`` may see a job recorded as submitted by ``submitted_by`` (a
    ``SubmittedBy`` or None): a header-less operator and open mode always; a submitter
    only its own jobs; nodes never."""
    role = identity.role
    if role is None or role is Role.OPERATOR:
        return True
    if role is not Role.SUBMITTER or submitted_by is None:
        return False
    return getattr(submitted_by, "role", None) == "submitter" and getattr(submitted_by, "name", None) == identity.name


def submitter_prefix(name: str) -> str:
    """A submitter's own artifact namespace, for inputs it uploads before any job exists."""
    return f"{USERS_PREFIX}{name}/"


def _job_of(key: str) -> str | None:
    parts = key.split("/")
    return parts[1] if len(parts) >= 3 and parts[0] == "jobs" and parts[1] and parts[2] else None


def _submitter_may_touch(identity: Identity, key: str, job_owned: Callable[[str], bool]) -> bool:
    if identity.name and key.startswith(submitter_prefix(identity.name)) and len(key) > len(
            submitter_prefix(identity.name)):
        return True
    job = _job_of(key)
    return job is not None and job_owned(job)


def artifact_write_allowed(identity: Identity, key: str, *, live: Iterable[LiveLease],
                           job_owned: Callable[[str], bool]) -> bool:
    """Whether ``identity`` may write artifact ``key`` (a checked key).

    A header-less operator: anywhere. A node (or an operator acting as one): strictly
    under ``jobs/<job>/<task>/`` of one of its live leases. A submitter: under
    ``users/<name>/`` and under ``jobs/<job>/`` of a job it submitted. Open mode
    (``Identity(None, False)``) is decided by the caller: this refuses it (fail closed)."""
    if identity.role is Role.SUBMITTER:
        return _submitter_may_touch(identity, key, job_owned)
    return write_allowed(identity, key, [(lease.job_id, lease.task_id) for lease in live])


def artifact_read_allowed(identity: Identity, key: str, *, live: Iterable[LiveLease],
                          job_owned: Callable[[str], bool]) -> bool:
    """Whether ``identity`` may read artifact ``key``.

    A header-less operator: anything. A node: the artifacts named as inputs of its live
    leases, and what lies under their ``jobs/<job>/<task>/``. A submitter: what it may
    write (its ``users/<name>/`` and its own jobs). Open mode is the caller's to decide."""
    role = identity.role
    if role is Role.OPERATOR:
        return True
    if role is Role.SUBMITTER:
        return _submitter_may_touch(identity, key, job_owned)
    if role is Role.NODE:
        leases = list(live)
        return any(key in lease.input_keys for lease in leases) or write_allowed(
            identity, key, [(lease.job_id, lease.task_id) for lease in leases])
    return False


def checkpoint_read_allowed(identity: Identity, job_id: str, task_id: str, *, live: Iterable[LiveLease],
                            job_owned: Callable[[str], bool]) -> bool:
    """Reads of a task's checkpoints: the node holding a live lease on it, the job's
    submitter, an operator."""
    role = identity.role
    if role is Role.OPERATOR:
        return True
    if role is Role.SUBMITTER:
        return job_owned(job_id)
    if role is Role.NODE:
        return task_write_allowed(identity, job_id, task_id, [(lease.job_id, lease.task_id) for lease in live])
    return False
