"""The exception family of flashruntime.

Every exception this project defines derives from ``FlashRuntimeError``. Each
class is defined here once and re-exported (the same object) from the module
users import it from; classes that callers already catch as a built-in keep
that built-in as a second base::

    FlashRuntimeError(Exception)
    ├── LeaseError                       refused lease operation
    ├── CheckpointError                  commit refused, unknown manifest
    ├── LaunchError                      launch failed before anything started
    ├── CompileError                     a plan cannot be compiled
    ├── WeightShapeMismatch(ValueError)  blobs describe different parameter sets
    ├── NonFiniteWeights(ValueError)     NaN/Inf/non-numeric weight
    ├── QuorumNotMet(RuntimeError)       FedAvg round below quorum
    ├── CoordinatorUnavailable(RuntimeError)  coordinator unreachable after retries
    ├── CoordinatorHTTPError(RuntimeError)    the coordinator answered an HTTP error status
    │   └── ArtifactNotFound(LookupError)     artifact GET returned 404
    ├── ExpansionError(ValueError)       job cannot be expanded into tasks
    ├── AuthConfigError(ValueError)      invalid token configuration
    └── CodeExecutionNotPermitted(PermissionError)  a job would run commands its submitter may not run

Standard library only: agents and task modules import it without extras.
"""

from __future__ import annotations

__all__ = [
    "ArtifactNotFound",
    "AuthConfigError",
    "CheckpointError",
    "CodeExecutionNotPermitted",
    "CompileError",
    "CoordinatorHTTPError",
    "CoordinatorUnavailable",
    "ExpansionError",
    "FlashRuntimeError",
    "LaunchError",
    "LeaseError",
    "NonFiniteWeights",
    "QuorumNotMet",
    "WeightShapeMismatch",
]


class FlashRuntimeError(Exception):
    """Root of every exception flashruntime defines."""


class LeaseError(FlashRuntimeError):
    """A lease operation was refused: unknown lease id, dead lease, unknown task."""


class CheckpointError(FlashRuntimeError):
    """A checkpoint commit was refused, or a manifest id is unknown."""


class LaunchError(FlashRuntimeError):
    """A launch failed before anything started (empty argv, missing workdir, spawn error)."""


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


class AuthConfigError(FlashRuntimeError, ValueError):
    """The token configuration is invalid."""


class CodeExecutionNotPermitted(FlashRuntimeError, PermissionError):
    """A job would run commands on the fleet, and its submitter's token lacks the
    code-execution permission (``FLASHML_ARGV_SUBMITTERS``)."""
