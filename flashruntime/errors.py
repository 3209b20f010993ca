"""The exception family of flashruntime.

Every exception this project defines derives from ``FlashRuntimeError``. Each
class is defined here once and re-exported (the same object) from the module
users import it from; classes that callers already catch as a built-in keep
that built-in as a second base::

    FlashRuntimeError(Exception)
    ├── LeaseError                       refused lease operation
    ├── CheckpointError                  commit refused, unknown manifest
    ├── LaunchError                      launch failed before anything started
    ├── InvalidSubmission(ValueError)    flash.submit's arguments cannot describe a run
    ├── CompileError                     a plan cannot be compiled
    ├── WeightShapeMismatch(ValueError)  blobs describe different parameter sets
    ├── NonFiniteWeights(ValueError)     NaN/Inf/non-numeric weight
    ├── QuorumNotMet(RuntimeError)       FedAvg round below quorum
    ├── CoordinatorUnavailable(RuntimeError)  coordinator unreachable after retries
    ├── CoordinatorHTTPError(RuntimeError)    the coordinator answered an HTTP error status
    │   └── ArtifactNotFound(LookupError)     artifact GET returned 404
    ├── ExpansionError(ValueError)       job cannot be expanded into tasks
    │   ├── TooManyTasks                 a job of more tasks than the coordinator admits (422)
    │   └── JobTooLarge                  a job's tasks together over the coordinator's byte bound (413)
    ├── SubmitterOverQuota               a submitter over its jobs-in-flight or pending-tasks quota (429)
    ├── AuthConfigError(ValueError)      invalid token configuration
    ├── CodeExecutionNotPermitted(PermissionError)  a job would run commands its submitter may not run
    ├── StoreError(RuntimeError)         a store's database failed (locked, full, damaged, unreachable)
    ├── StorageFull(OSError)             the coordinator's disk is full or below its free-space floor (503)
    ├── BadDatabaseURL(ValueError)       a database URL of a form the coordinator does not open
    ├── BadRayAddress(ValueError)        a Ray cluster address of a form Ray does not take
    ├── SigningError(ValueError)         a signing key, trusted key or signed job that cannot be used
    ├── SchemaVersionError(RuntimeError) a database a newer (or unknown) flashruntime wrote
    ├── UnplannableRequest(ValueError)   a plan request lacks a figure the planner needs
    ├── ModuleUnavailable(ImportError)   an import path whose code this release does not have yet
    ├── ProfileError(RuntimeError)       a profile of the user's command hung, crashed or measured nothing
    │   └── InvalidProfileRequest(ValueError)  profiler or cache arguments that cannot describe a profile
    ├── BadArtifactKey(ValueError)       an artifact key that is not a safe relative path
    ├── ArtifactTooLarge(ValueError)     an artifact over the coordinator's limit
    ├── ArtifactConflict(ValueError)     an artifact key that clashes with stored ones
    ├── EmptyArtifact(ValueError)        an artifact upload without a byte of content (400)
    ├── NoBackend(RuntimeError)          a job for a backend the coordinator does not run
    ├── BodyProblem(ValueError)          a JSON request body the coordinator will not store
    ├── AuthFailure                      a request the coordinator's access rules refuse
    │   └── RateLimited                  too many requests from one credential
    ├── TaskRefused                      a lease the worker agent will not run
    ├── TaskInterrupted                  a lease's preparation stopped by a shutdown or a lost lease
    ├── WorkDirInUse                     a worker's work directory is held by another running worker
    ├── WorkerConfigError(ValueError)    worker options that cannot start a safe worker
    └── CommandError                     a ``flashruntime`` command that cannot succeed (its exit code)

The coordinator, the agent and the CLI raise the last twelve inside their own flows and
answer them (an HTTP status, a failed lease, an exit code); they are defined here so that
one ``except FlashRuntimeError`` catches everything this project raises. One member lives
elsewhere: ``flashruntime.coordinator.body_limit.BodyTooLarge`` (413) must also be
FastAPI's ``HTTPException``, and this module imports the standard library only.

Standard library only: agents and task modules import it without extras.
"""

from __future__ import annotations

__all__ = [
    "ArtifactConflict",
    "ArtifactNotFound",
    "ArtifactTooLarge",
    "AuthConfigError",
    "AuthFailure",
    "BadArtifactKey",
    "BadDatabaseURL",
    "BadRayAddress",
    "BodyProblem",
    "CheckpointError",
    "CodeExecutionNotPermitted",
    "CommandError",
    "CompileError",
    "CoordinatorHTTPError",
    "CoordinatorUnavailable",
    "EmptyArtifact",
    "ExpansionError",
    "FlashRuntimeError",
    "InvalidProfileRequest",
    "InvalidSubmission",
    "JobTooLarge",
    "LaunchError",
    "LeaseError",
    "ModuleUnavailable",
    "NoBackend",
    "NonFiniteWeights",
    "ProfileError",
    "QuorumNotMet",
    "RateLimited",
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
    """Root of every exception flashruntime defines."""


class LeaseError(FlashRuntimeError):
    """A lease operation was refused: unknown lease id, dead lease, unknown task."""


class CheckpointError(FlashRuntimeError):
    """A checkpoint commit was refused, or a manifest id is unknown."""


class LaunchError(FlashRuntimeError):
    """A launch failed before anything started (empty argv, missing workdir, spawn error)."""


class InvalidSubmission(FlashRuntimeError, ValueError):
    """``flash.submit`` was given arguments that cannot describe a run (the message says which
    and how to fix it); nothing was started."""


class CompileError(FlashRuntimeError):
    """A plan cannot be compiled into a launch specification."""


class WeightShapeMismatch(FlashRuntimeError, ValueError):
    """Weight blobs describe different parameter sets or shapes."""


class NonFiniteWeights(FlashRuntimeError, ValueError):
    """A weight is NaN, infinite or not a number."""


class QuorumNotMet(FlashRuntimeError, RuntimeError):
    """A federated round failed, was cancelled or timed out below quorum."""


class CoordinatorUnavailable(FlashRuntimeError, RuntimeError):
    """The coordinator stayed unreachable after every retry."""


class CoordinatorHTTPError(FlashRuntimeError, RuntimeError):
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


class ExpansionError(FlashRuntimeError, ValueError):
    """A job cannot be expanded into tasks (the service answers 422)."""


class TooManyTasks(ExpansionError):
    """A job would expand into more tasks than the coordinator admits (the service answers 422)."""


class JobTooLarge(ExpansionError):
    """A job's tasks together are more bytes than the coordinator admits (the service answers 413)."""


class SubmitterOverQuota(FlashRuntimeError):
    """A submitter has as many jobs in flight, or tasks pending, as the coordinator admits:
    429 with ``Retry-After``; the job is admitted once enough of its earlier work has ended."""

    def __init__(self, detail: str, retry_after_s: int) -> None:
        super().__init__(detail)
        self.detail = detail
        self.retry_after_s = retry_after_s


class AuthConfigError(FlashRuntimeError, ValueError):
    """The token configuration is invalid."""


class CodeExecutionNotPermitted(FlashRuntimeError, PermissionError):
    """A job would run commands on the fleet, and its submitter's token lacks the
    code-execution permission (``FLASHML_ARGV_SUBMITTERS``)."""


class StoreError(FlashRuntimeError, RuntimeError):
    """A store's database failed: SQLite's or PostgreSQL's error is the cause, the message names
    the file or the server and database, and says what to do."""


class StorageFull(FlashRuntimeError, OSError):
    """The coordinator's disk is full, or below its free-space floor: a write it refused
    before storing anything (503 with ``Retry-After``). ``errno`` is ``ENOSPC``."""


class BadDatabaseURL(FlashRuntimeError, ValueError):
    """A database URL that is neither ``sqlite:///absolute/path`` nor
    ``postgresql://user:password@host:port/database``; the message never shows the password."""


class BadRayAddress(FlashRuntimeError, ValueError):
    """A Ray cluster address (``FLASHML_RAY_ADDRESS``, ``--ray-address``, ``ray_address=``) of
    none of the forms ``local``, ``auto``, ``ray://host:port``, ``host:port``; the message
    names the setting and the forms."""


class SigningError(FlashRuntimeError, ValueError):
    """A signing key or trusted public key that cannot be read or used, a job that cannot be
    signed, or signing without the ``signing`` extra (``cryptography``)."""


class SchemaVersionError(FlashRuntimeError, RuntimeError):
    """A store of the coordinator's database records a schema version this flashruntime does
    not read (a newer one, or one it does not know); the message names the store, the
    database and both versions. Nothing was changed."""


class UnplannableRequest(FlashRuntimeError, ValueError):
    """The request lacks a figure the planner needs; the message says which and how to supply it."""


class ModuleUnavailable(FlashRuntimeError, ImportError):
    """An import path that code written for an earlier release imports, whose code arrives
    with a later one; the message says with what, which extra it will need, and what to use
    today. ``name`` is the module's path, as for any ``ImportError``."""


class ProfileError(FlashRuntimeError, RuntimeError):
    """A profile of the user's command did not measure: it ran past its budget, crashed, or
    ended before its steps; the message names the command, what happened and the fix. A plan
    asked to profile keeps its static figures when this is raised."""


class InvalidProfileRequest(ProfileError, ValueError):
    """Profiler, cache or checkpoint-advice arguments that cannot describe a measurement
    (a budget that is not a positive number of seconds, zero measured steps, ...)."""


class BadArtifactKey(FlashRuntimeError, ValueError):
    """A key that is not a safe relative path (the coordinator answers 400)."""


class ArtifactTooLarge(FlashRuntimeError, ValueError):
    """A body over the coordinator's artifact limit (413)."""


class ArtifactConflict(FlashRuntimeError, ValueError):
    """A key whose path clashes with existing artifacts: it would be both a file and a
    directory of other keys (409)."""


class EmptyArtifact(FlashRuntimeError, ValueError):
    """An artifact upload whose body is empty: an artifact holds at least one byte (400);
    nothing is stored and what the key held stays."""


class NoBackend(FlashRuntimeError, RuntimeError):
    """The job asks for a backend this coordinator does not run (503)."""


class BodyProblem(FlashRuntimeError, ValueError):
    """A JSON body that parsed but cannot be accepted; ``loc`` is the path to the value,
    ``kind`` a short name of the problem (the 422's ``type``)."""

    def __init__(self, loc: list[str | int], message: str, kind: str) -> None:
        super().__init__(message)
        self.loc = loc
        self.kind = kind

    def as_issue(self) -> dict[str, object]:
        return {"loc": ["body", *self.loc], "msg": str(self), "type": self.kind}


class AuthFailure(FlashRuntimeError):
    """A request refused by the coordinator's access rules; it answers ``status_code``
    (400, 401, 403 or 429) with ``detail``."""

    def __init__(self, status_code: int, detail: str) -> None:
        super().__init__(detail)
        self.status_code = status_code
        self.detail = detail

    @property
    def headers(self) -> dict[str, str]:
        """Response headers: a 401 names the expected scheme (RFC 6750)."""
        return {"WWW-Authenticate": "Bearer"} if self.status_code == 401 else {}


class RateLimited(AuthFailure):
    """Too many requests from one credential (or, with ``reason``, too many failed
    authentications from one address): 429 with ``Retry-After``."""

    def __init__(self, wait_s: float, reason: str = "too many requests from this credential") -> None:
        self.retry_after_s = max(1, int(wait_s + 0.999))
        super().__init__(429, f"{reason}; retry in {self.retry_after_s} s")

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)}


class TaskRefused(FlashRuntimeError):
    """The worker agent will not run a lease; the message is the reason it sends with ``fail``."""


class TaskInterrupted(FlashRuntimeError):
    """A lease's preparation stopped because the agent is shutting down or the lease was lost."""


class WorkDirInUse(FlashRuntimeError):
    """Another worker holds the work directory's lock: two workers in one directory would
    each stop what the other runs, so the second one refuses to start. ``pid`` is the
    holder's process id when it could be read."""

    def __init__(self, message: str, pid: int | None = None) -> None:
        super().__init__(message)
        self.pid = pid


class WorkerConfigError(FlashRuntimeError, ValueError):
    """Worker options that cannot start a safe worker (a token file others can read, a task
    user on a worker that is not root, a sandbox this machine cannot build)."""


class CommandError(FlashRuntimeError):
    """A ``flashruntime`` command cannot succeed; ``code`` is its exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code
