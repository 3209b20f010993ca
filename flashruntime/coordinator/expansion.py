"""Mode A task expansion: a submitted lease job becomes independent tasks.

A recipe registered for ``workload.type`` wins; otherwise the built-in expansions
(hyperparameter search, sharded K-means, federated averaging) apply. Every refusal
is an ``ExpansionError`` (the service answers 422 with its message). Importing this
module registers the ``command`` recipe. Standard library and pydantic only.
"""

from __future__ import annotations

import flashruntime.recipes.command  # noqa: F401  (registers CommandRecipe)
from flashruntime.coordinator.builtin_expansions import (
    ALLOWED_TASK_MODULES,
    BUILTIN_EXPANSIONS,
    FEDAVG_DRIVER_SUPPLIED_KEYS,
    FEDAVG_WORKER_PARAM_KEYS,
)
from flashruntime.errors import ExpansionError
from flashruntime.protocol.lease_rules import MAX_LEASE_SECONDS
from flashruntime.protocol.v1alpha1 import ClaimRequest, CompleteRequest, FailRequest, JobSpec, TaskSpec
from flashruntime.recipes import recipe_for

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
        return _queueable(kind, job_id, builtin(job_id, spec))
    try:
        tasks = recipe.expand(job_id, spec)
    except ExpansionError:
        raise
    except ValueError as exc:
        raise ExpansionError(str(exc)) from exc
    return _queueable(kind, job_id, tasks)


_SEPARATORS = frozenset("/\\\x00")  # what may not appear in a task id: it is one path segment


def _queueable(kind: str, job_id: str, tasks: object) -> list[TaskSpec]:
    """``tasks`` if they can all be queued for ``job_id``, else ``ExpansionError``: checked
    before the coordinator stores anything, so a refused job leaves no trace. A task id is
    one path segment because ``jobs/<job>/<task>/`` is its write scope, which
    must not contain another task's."""
    source = f"the expansion of workload.type {kind!r}"
    if not isinstance(tasks, (list, tuple)):
        raise ExpansionError(f"{source} returned {type(tasks).__name__}, not a list of TaskSpec; fix its expand()")
    seen: set[str] = set()
    duplicates: list[str] = []
    for task in tasks:
        if not isinstance(task, TaskSpec):
            raise ExpansionError(f"{source} returned a {type(task).__name__}, not a TaskSpec; fix its expand()")
        if task.job_id != job_id:
            raise ExpansionError(
                f"{source} returned task {task.task_id!r} for job {task.job_id!r}, not for the submitted job "
                f"{job_id!r}; build every task with the job_id passed to expand()"
            )
        task_id = task.task_id
        one_segment = isinstance(task_id, str) and task_id not in ("", ".", "..") and not _SEPARATORS & set(task_id)
        if not one_segment:
            raise ExpansionError(
                f"{source} returned task id {task_id!r}: a task id must be a non-empty name without '/', "
                "'\\' or NUL that is not '.' or '..' (it names the task's jobs/<job>/<task>/ directory)"
            )
        if task_id in seen and task_id not in duplicates:
            duplicates.append(task_id)
        seen.add(task_id)
    if duplicates:
        listed = ", ".join(repr(task_id) for task_id in duplicates)
        raise ExpansionError(
            f"{source} returned duplicate task ids ({listed}) among its {len(tasks)} tasks: task ids must be "
            "unique within a job (a repeated id collides with another task's jobs/<job>/<task>/ directory); give "
            "each task its own id (e.g. task-000, task-001, ...)"
        )
    return list(tasks)
