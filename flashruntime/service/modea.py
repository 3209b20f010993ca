"""Mode A task expansion: a submitted lease job becomes independent tasks (SPEC §9.6).

A recipe registered for ``workload.type`` wins; otherwise the built-in expansions
(hyperparameter search, sharded K-means, federated averaging) apply. Every refusal
is an ``ExpansionError`` (the service answers 422 with its message). Importing this
module registers the ``command`` recipe. Standard library and pydantic only.
"""

from __future__ import annotations

import flashruntime.recipes.command  # noqa: F401  (registers CommandRecipe)
from flashruntime.errors import ExpansionError
from flashruntime.leases import MAX_LEASE_SECONDS
from flashruntime.protocol.v1alpha1 import ClaimRequest, CompleteRequest, FailRequest, JobSpec, TaskSpec
from flashruntime.recipes import recipe_for
from flashruntime.service._builtin_expansions import (
    ALLOWED_TASK_MODULES,
    BUILTIN_EXPANSIONS,
    FEDAVG_DRIVER_SUPPLIED_KEYS,
    FEDAVG_WORKER_PARAM_KEYS,
)

__all__ = [
    "expand_tasks",
    "ExpansionError",
    "ALLOWED_TASK_MODULES",
    "MAX_LEASE_SECONDS",
    "FEDAVG_WORKER_PARAM_KEYS",
    "FEDAVG_DRIVER_SUPPLIED_KEYS",
    "ClaimRequest",
    "CompleteRequest",
    "FailRequest",
]


def expand_tasks(job_id: str, spec: JobSpec) -> list[TaskSpec]:
    """The tasks of lease job ``job_id``, in queue order; ``ExpansionError`` when the job cannot run."""
    kind = spec.spec.workload.type
    try:
        recipe = recipe_for(kind)
    except LookupError as missing:
        builtin = BUILTIN_EXPANSIONS.get(kind)
        if builtin is None:
            builtins = ", ".join(repr(name) for name in sorted(BUILTIN_EXPANSIONS))
            raise ExpansionError(
                f"unknown workload.type {kind!r}: it is none of the built-in types ({builtins}), and {missing}"
            ) from None
        return builtin(job_id, spec)
    try:
        return recipe.expand(job_id, spec)
    except ExpansionError:
        raise
    except ValueError as exc:
        raise ExpansionError(str(exc)) from exc
