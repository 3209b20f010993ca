"""The exception family of flashruntime.

Every exception this project defines derives from ``FlashRuntimeError``, through exactly
one group that says what the caller can do about it. Each class is defined here once and
re-exported (the same object) from the module users import it from; classes that callers
already catch as a built-in keep that built-in as a second base. A refusal of a request
carries the HTTP status the coordinator answers it with (in brackets; ``Retry-After`` with
a ``+``)::

    FlashRuntimeError(Exception)
    ├── ConfigurationError               settings, keys or installed code that cannot work: fix them
    │   ├── AuthConfigError(ValueError)      invalid token configuration
    │   ├── BadDatabaseURL(ValueError)       a database URL of a form the coordinator does not open
    │   ├── BadRayAddress(ValueError)        a Ray cluster address of a form Ray does not take
    │   ├── SigningError(ValueError)         a signing key, trusted key or signed job that cannot be used
    │   ├── WorkerConfigError(ValueError)    worker options that cannot start a safe worker
    │   ├── ModuleUnavailable(ImportError)   an import path whose code this release does not have yet
    │   └── NoBackend(RuntimeError)          a job for a backend the coordinator does not run [503]
    ├── InputError                       arguments or a request that cannot describe what was asked: fix them
    │   ├── InvalidSubmission(ValueError)    flash.submit's arguments cannot describe a run
    │   ├── CompileError                     a plan cannot be compiled
    │   ├── UnplannableRequest(ValueError)   a plan request lacks a figure the planner needs
    │   ├── WeightShapeMismatch(ValueError)  blobs describe different parameter sets
    │   ├── NonFiniteWeights(ValueError)     NaN/Inf/non-numeric weight
    │   ├── ExpansionError(ValueError)       a job that cannot be expanded into tasks [422]
    │   │   ├── TooManyTasks                 more tasks than the coordinator admits [422]
    │   │   └── JobTooLarge                  tasks together over the coordinator's byte bound [413]
    │   ├── BodyProblem(ValueError)          a JSON request body the coordinator will not store [422]
    │   ├── BodyTooLarge                     a request body over its route's limit [413]
    │   └── InvalidRequest(ValueError)       a request value the coordinator cannot act on [422]
    ├── ArtifactError                    an artifact key or upload the coordinator refuses: change it
    │   ├── BadArtifactKey(ValueError)       a key that is not a safe relative path [400]
    │   ├── ArtifactTooLarge(ValueError)     an artifact over the coordinator's limit [413]
    │   ├── ArtifactConflict(ValueError)     a key that clashes with stored ones [409]
    │   └── EmptyArtifact(ValueError)        an upload without a byte of content [400]
    ├── NotFound(LookupError)            no such job, task, lease, node, artifact or checkpoint [404]
    ├── AccessDenied                     the caller may not do this: its token, a permission, a quota [403]
    │   ├── AuthFailure                      a request the access rules refuse [400, 401, 403 or 429]
    │   │   └── RateLimited                  too many requests from one credential [429+]
    │   ├── CodeExecutionNotPermitted(PermissionError)  commands its submitter may not run [403]
    │   └── SubmitterOverQuota               over its jobs-in-flight or pending-tasks quota [429+]
    ├── CoordinatorError                 a client's call to the coordinator failed: retry, or read its answer
    │   ├── CoordinatorUnavailable(RuntimeError)  unreachable after retries
    │   └── CoordinatorHTTPError(RuntimeError)    the coordinator answered an HTTP error status
    │       └── ArtifactNotFound(LookupError)     an artifact GET returned 404
    ├── PersistenceError                 stored state could not be kept or read: retry, or an operator acts
    │   ├── StoreError(RuntimeError)         a store's database failed (locked, full, damaged, gone) [503+]
    │   ├── StorageFull(OSError)             the disk is full or below its free-space floor [503+]
    │   └── SchemaVersionError(RuntimeError) a database a newer (or unknown) flashruntime wrote
    └── RunError                         a run, an attempt or a command could not go on
        ├── LaunchError                      a launch failed before anything started
        ├── LeaseError                       a lease operation refused: the lease is gone [410]
        ├── CheckpointError                  a commit refused, an unknown manifest [409]
        ├── QuorumNotMet(RuntimeError)       a FedAvg round below quorum
        ├── ProfileError(RuntimeError)       a profile of the user's command hung, crashed or measured nothing
        │   └── InvalidProfileRequest(ValueError)  profiler or cache arguments that cannot describe a profile
        ├── TaskRefused                      a lease the worker agent will not run
        ├── TaskInterrupted                  a lease's preparation stopped by a shutdown or a lost lease
        ├── WorkDirInUse                     a worker's work directory is held by another running worker
        └── CommandError                     a ``flashruntime`` command that cannot succeed (its exit code)

``except InputError`` catches every "fix what you sent", ``except AccessDenied`` every
refusal of who is asking, and so on; the classes under a group are its kinds. A group
may be raised itself where no kind says more (``NotFound``, ``AccessDenied``).

The coordinator answers an error of the family raised while it serves a request once, in
its app: ``http_status``, ``{"detail": http_detail()}`` and ``http_headers()``
(``Retry-After`` from ``retry_after_s``; ``WWW-Authenticate`` with a 401). An error without
an ``http_status`` is no refusal: reaching the app, it is the server's fault (500). Where a
message names what only an operator should read (a file, the database's own words),
``public_detail`` is what the caller is told and the message goes to the coordinator's log.

Standard library only: agents and task modules import it without extras.
"""

from __future__ import annotations

import math

__all__ = [
    "AccessDenied",
    "ArtifactConflict",
    "ArtifactError",
    "ArtifactNotFound",
    "ArtifactTooLarge",
    "AuthConfigError",
    "AuthFailure",
    "BadArtifactKey",
    "BadDatabaseURL",
    "BadRayAddress",
    "BodyProblem",
    "BodyTooLarge",
    "CheckpointError",
    "CodeExecutionNotPermitted",
    "CommandError",
    "CompileError",
    "ConfigurationError",
    "CoordinatorError",
    "CoordinatorHTTPError",
    "CoordinatorUnavailable",
    "EmptyArtifact",
    "ExpansionError",
    "FlashRuntimeError",
    "InputError",
    "InvalidProfileRequest",
    "InvalidRequest",
    "InvalidSubmission",
    "JobTooLarge",
    "LaunchError",
    "LeaseError",
    "ModuleUnavailable",
    "NoBackend",
    "NonFiniteWeights",
    "NotFound",
    "PersistenceError",
    "ProfileError",
    "QuorumNotMet",
    "RateLimited",
    "RunError",
    "SchemaVersionError",
    "SigningError",
    "StorageFull",
    "StoreError",
    "SubmitterOverQuota",
    "TaskInterrupted",
    "TaskRefused",
    "TooManyTasks",
    "UnplannableRequest",
    "WeightShapeMismatch",
    "WorkDirInUse",
    "WorkerConfigError",
]


class FlashRuntimeError(Exception):
    """Root of every exception flashruntime defines.

    ``http_status`` is the status the coordinator answers a request it refuses with this
    error (None: not a refusal); ``retry_after_s`` the ``Retry-After`` it asks for, if any;
    ``public_detail``, when set, what the answer says in place of the message."""

    http_status: int | None = None
    retry_after_s: float | None = None
    public_detail: str | None = None

    def http_detail(self) -> object:
        """The answer's ``detail``: the message, unless the class tells the caller less."""
        return self.public_detail if self.public_detail is not None else str(self)

    def http_headers(self) -> dict[str, str]:
        """The answer's headers: ``Retry-After`` (whole seconds) when the error asks for a wait."""
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": str(max(0, math.ceil(self.retry_after_s)))}


# The groups: what the caller can do. Every other class derives from exactly one of them.


class ConfigurationError(FlashRuntimeError):
    """Settings, keys or installed code that cannot work as they are: the message names the
    setting (an environment variable, an option, an extra to install) and what it takes."""


class InputError(FlashRuntimeError):
    """Arguments or a request that cannot describe what was asked: the message says which
    value and what to send instead; nothing was started or stored."""


class ArtifactError(FlashRuntimeError):
    """An artifact key or upload the coordinator refuses: change the key or the content;
    what the key held stays."""


class NotFound(FlashRuntimeError, LookupError):
    """No such job, task, lease, node, artifact or checkpoint, or none the caller may see:
    another submitter's job is answered exactly like an unknown one (404)."""

    http_status = 404


class AccessDenied(FlashRuntimeError):
    """The caller may not do this: its token, a permission it lacks, or a quota it is over;
    the message says which and what would be allowed (403 unless a kind says otherwise)."""

    http_status = 403


class CoordinatorError(FlashRuntimeError):
    """A client's call to the coordinator failed: it stayed unreachable, or it answered an
    error, whose status and ``detail`` the error carries."""


class PersistenceError(FlashRuntimeError):
    """Stored state could not be kept or read: a database that failed, a full disk, a schema
    this release does not read. Retry later, or an operator acts on what the message names."""


class RunError(FlashRuntimeError):
    """A run, one of its attempts or a command could not go on: the message says what
    happened and to which lease, task or command."""


# ConfigurationError


class AuthConfigError(ConfigurationError, ValueError):
    """The token configuration is invalid."""


class BadDatabaseURL(ConfigurationError, ValueError):
    """A database URL that is neither ``sqlite:///absolute/path`` nor
    ``postgresql://user:password@host:port/database``; the message never shows the password."""


class BadRayAddress(ConfigurationError, ValueError):
    """A Ray cluster address (``FLASHML_RAY_ADDRESS``, ``--ray-address``, ``ray_address=``) of
    none of the forms ``local``, ``auto``, ``ray://host:port``, ``host:port``; the message
    names the setting and the forms."""


class SigningError(ConfigurationError, ValueError):
    """A signing key or trusted public key that cannot be read or used, a job that cannot be
    signed, or signing without the ``signing`` extra (``cryptography``)."""


class WorkerConfigError(ConfigurationError, ValueError):
    """Worker options that cannot start a safe worker (a token file others can read, a task
    user on a worker that is not root, a sandbox this machine cannot build)."""


class ModuleUnavailable(ConfigurationError, ImportError):
    """An import path that code written for an earlier release imports, whose code arrives
    with a later one; the message says with what, which extra it will need, and what to use
    today. ``name`` is the module's path, as for any ``ImportError``."""


class NoBackend(ConfigurationError, RuntimeError):
    """The job asks for a backend this coordinator does not run (503)."""

    http_status = 503


# InputError


class InvalidSubmission(InputError, ValueError):
    """``flash.submit`` was given arguments that cannot describe a run (the message says which
    and how to fix it); nothing was started."""


class CompileError(InputError):
    """A plan cannot be compiled into a launch specification."""


class UnplannableRequest(InputError, ValueError):
    """The request lacks a figure the planner needs; the message says which and how to supply it."""


class WeightShapeMismatch(InputError, ValueError):
    """Weight blobs describe different parameter sets or shapes."""


class NonFiniteWeights(InputError, ValueError):
    """A weight is NaN, infinite or not a number."""


class ExpansionError(InputError, ValueError):
    """A job cannot be expanded into tasks (the service answers 422)."""

    http_status = 422


class TooManyTasks(ExpansionError):
    """A job would expand into more tasks than the coordinator admits (the service answers 422)."""


class JobTooLarge(ExpansionError):
    """A job's tasks together are more bytes than the coordinator admits (the service answers 413)."""

    http_status = 413


class BodyProblem(InputError, ValueError):
    """A JSON body that parsed but cannot be accepted; ``loc`` is the path to the value,
    ``kind`` a short name of the problem (the 422's ``type``). The answer's ``detail`` is
    the list of problems a refused body gets, this one its only entry."""

    http_status = 422

    def __init__(self, loc: list[str | int], message: str, kind: str) -> None:
        super().__init__(message)
        self.loc = loc
        self.kind = kind

    def as_issue(self) -> dict[str, object]:
        return {"loc": ["body", *self.loc], "msg": str(self), "type": self.kind}

    def http_detail(self) -> object:
        return [self.as_issue()]


class BodyTooLarge(InputError):
    """A request body over its route's limit (413); ``detail`` names the limit and its setting."""

    http_status = 413

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class InvalidRequest(InputError, ValueError):
    """A request whose values the coordinator cannot act on, beyond what its body's schema
    says (a cordon ending in the past, a node id it cannot keep, a checkpoint part outside
    its task's place): 422, the message names the value and the rule."""

    http_status = 422


# ArtifactError


class BadArtifactKey(ArtifactError, ValueError):
    """A key that is not a safe relative path (the coordinator answers 400)."""

    http_status = 400


class ArtifactTooLarge(ArtifactError, ValueError):
    """A body over the coordinator's artifact limit (413)."""

    http_status = 413


class ArtifactConflict(ArtifactError, ValueError):
    """A key whose path clashes with existing artifacts: it would be both a file and a
    directory of other keys (409)."""

    http_status = 409


class EmptyArtifact(ArtifactError, ValueError):
    """An artifact upload whose body is empty: an artifact holds at least one byte (400);
    nothing is stored and what the key held stays."""

    http_status = 400


# AccessDenied


class AuthFailure(AccessDenied):
    """A request refused by the coordinator's access rules; it answers ``status_code``
    (400, 401, 403 or 429) with ``detail``."""

    def __init__(self, status_code: int, detail: str) -> None:
        super().__init__(detail)
        self.status_code = status_code
        self.http_status = status_code
        self.detail = detail

    def http_headers(self) -> dict[str, str]:
        """Response headers: a 401 names the expected scheme (RFC 6750)."""
        headers = super().http_headers()
        if self.status_code == 401:
            headers["WWW-Authenticate"] = "Bearer"
        return headers

    @property
    def headers(self) -> dict[str, str]:
        """The answer's headers (``http_headers()``)."""
        return self.http_headers()


class RateLimited(AuthFailure):
    """Too many requests from one credential (or, with ``reason``, too many failed
    authentications from one address): 429 with ``Retry-After``."""

    def __init__(self, wait_s: float, reason: str = "too many requests from this credential") -> None:
        self.retry_after_s = max(1, int(wait_s + 0.999))
        super().__init__(429, f"{reason}; retry in {self.retry_after_s} s")


class CodeExecutionNotPermitted(AccessDenied, PermissionError):
    """A job would run commands on the fleet, and its submitter's token lacks the
    code-execution permission (``FLASHML_ARGV_SUBMITTERS``): 403."""

    http_status = 403


class SubmitterOverQuota(AccessDenied):
    """A submitter has as many jobs in flight, or tasks pending, as the coordinator admits:
    429 with ``Retry-After``; the job is admitted once enough of its earlier work has ended."""

    http_status = 429

    def __init__(self, detail: str, retry_after_s: int) -> None:
        super().__init__(detail)
        self.detail = detail
        self.retry_after_s = retry_after_s


# CoordinatorError


class CoordinatorUnavailable(CoordinatorError, RuntimeError):
    """The coordinator stayed unreachable after every retry."""


class CoordinatorHTTPError(CoordinatorError, RuntimeError):
    """The coordinator answered ``method path`` with HTTP ``status``; ``detail`` is what it
    said (its ``{"detail": ...}``), ``retry_after_s`` its ``Retry-After`` (a 429), if any."""

    def __init__(self, method: str, path: str, status: int, detail: str, *,
                 retry_after_s: float | None = None) -> None:
        super().__init__(f"{method} {path} -> {status}: {detail}")
        self.method = method
        self.path = path
        self.status = status
        self.detail = detail
        self.retry_after_s = retry_after_s


class ArtifactNotFound(CoordinatorHTTPError, LookupError):
    """An artifact GET returned 404. Raised with just a message by code that finds no
    artifact without asking a coordinator (status 404, no method or path)."""

    def __init__(self, method: str, path: str = "", status: int = 404, detail: str = "", *,
                 retry_after_s: float | None = None) -> None:
        if not path and not detail:  # ArtifactNotFound("message"), as before
            FlashRuntimeError.__init__(self, method)
            self.method, self.path, self.status, self.detail, self.retry_after_s = "", "", 404, method, None
            return
        super().__init__(method, path, status, detail, retry_after_s=retry_after_s)


# PersistenceError


class StoreError(PersistenceError, RuntimeError):
    """A store's database failed: SQLite's or PostgreSQL's error is the cause, the message names
    the file or the server and database, and says what to do. The coordinator answers 503 with
    ``Retry-After`` and keeps the message for its log (one that says the disk is full is
    answered as ``StorageFull``)."""

    http_status = 503
    retry_after_s = 1
    public_detail = "the coordinator's database did not answer; retry shortly"


class StorageFull(PersistenceError, OSError):
    """The coordinator's disk is full, or below its free-space floor: a write it refused
    before storing anything (503 with ``Retry-After``). ``errno`` is ``ENOSPC``."""

    http_status = 503
    retry_after_s = 5  # long enough for an operator or a cleanup to act
    public_detail = ("the coordinator's disk is full: nothing was stored; retry later (an operator frees space on "
                     "its data directory)")


class SchemaVersionError(PersistenceError, RuntimeError):
    """A store of the coordinator's database records a schema version this flashruntime does
    not read (a newer one, or one it does not know); the message names the store, the
    database and both versions. Nothing was changed."""


# RunError


class LaunchError(RunError):
    """A launch failed before anything started (empty argv, missing workdir, spawn error)."""


class LeaseError(RunError):
    """A lease operation was refused: unknown lease id, dead lease, unknown task. A worker
    acting on it is answered 410: the lease is gone, its attempt ends."""

    http_status = 410


class CheckpointError(RunError):
    """A checkpoint commit was refused, or a manifest id is unknown (a commit: 409)."""

    http_status = 409


class QuorumNotMet(RunError, RuntimeError):
    """A federated round failed, was cancelled or timed out below quorum."""


class ProfileError(RunError, RuntimeError):
    """A profile of the user's command did not measure: it ran past its budget, crashed, or
    ended before its steps; the message names the command, what happened and the fix. A plan
    asked to profile keeps its static figures when this is raised."""


class InvalidProfileRequest(ProfileError, ValueError):
    """Profiler, cache or checkpoint-advice arguments that cannot describe a measurement
    (a budget that is not a positive number of seconds, zero measured steps, ...)."""


class TaskRefused(RunError):
    """The worker agent will not run a lease; the message is the reason it sends with ``fail``."""


class TaskInterrupted(RunError):
    """A lease's preparation stopped because the agent is shutting down or the lease was lost."""


class WorkDirInUse(RunError):
    """Another worker holds the work directory's lock: two workers in one directory would
    each stop what the other runs, so the second one refuses to start. ``pid`` is the
    holder's process id when it could be read."""

    def __init__(self, message: str, pid: int | None = None) -> None:
        super().__init__(message)
        self.pid = pid


class CommandError(RunError):
    """A ``flashruntime`` command cannot succeed; ``code`` is its exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code
