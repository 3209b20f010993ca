"""Mode A task expansion: a submitted lease job becomes independent tasks.

A recipe registered for ``workload.type`` wins; otherwise the built-in expansions
(hyperparameter search, sharded K-means, federated averaging) apply. A job is held to
its ``JobBounds`` while it expands: its task count, read from the spec, before any task
is built; its payload bytes task by task as they are built. Every refusal is an
``ExpansionError`` (the service answers 422, 413 for ``JobTooLarge``). Importing this
module registers the ``command`` recipe. Standard library and pydantic only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import flashruntime.recipes.command  # noqa: F401  (registers CommandRecipe)
from flashruntime.coordinator.admission import DEFAULT_JOB_BOUNDS, JobBounds, PayloadTally, too_many_tasks
from flashruntime.coordinator.builtin_expansions import (
    ALLOWED_TASK_MODULES,
    BUILTIN_EXPANSIONS,
    BUILTIN_TASK_COUNTS,
    FEDAVG_DRIVER_SUPPLIED_KEYS,
    FEDAVG_WORKER_PARAM_KEYS,
)
from flashruntime.errors import ExpansionError
from flashruntime.protocol.lease_rules import MAX_LEASE_SECONDS
from flashruntime.protocol.v1alpha1 import ClaimRequest, CompleteRequest, FailRequest, JobSpec, TaskSpec
from flashruntime.recipes import recipe_for

__all__ = [
    "ALLOWED_TASK_MODULES",
    "FEDAVG_DRIVER_SUPPLIED_KEYS",
    "FEDAVG_WORKER_PARAM_KEYS",
    "MAX_LEASE_SECONDS",
    "ClaimRequest",
    "CompleteRequest",
    "ExpansionError",
    "FailRequest",
    "declared_task_count",
    "expand_tasks",
    "require_task_bound",
]


def expand_tasks(job_id: str, spec: JobSpec, bounds: JobBounds = DEFAULT_JOB_BOUNDS) -> list[TaskSpec]:
    """The tasks of lease job ``job_id``, in queue order; ``ExpansionError`` when the job cannot
    run, ``TooManyTasks`` / ``JobTooLarge`` when it is over ``bounds``."""
    kind = spec.spec.workload.type
    require_task_bound(spec, bounds)
    try:
        recipe = recipe_for(kind)
    except LookupError as missing:
        builtin = BUILTIN_EXPANSIONS.get(kind)
        if builtin is None:
            builtins = ", ".join(repr(name) for name in sorted(BUILTIN_EXPANSIONS))
            raise ExpansionError(
                f"unknown workload.type {kind!r}: it is none of the built-in types ({builtins}), and {missing}"
            ) from None
        return _queueable(kind, job_id, builtin(job_id, spec), bounds)
    try:
        return _queueable(kind, job_id, recipe.iter_tasks(job_id, spec), bounds)
    except ExpansionError:
        raise
    except ValueError as exc:  # a recipe's refusal, raised while its tasks are built
        raise ExpansionError(str(exc)) from exc


def require_task_bound(spec: JobSpec, bounds: JobBounds = DEFAULT_JOB_BOUNDS) -> None:
    """``TooManyTasks`` when ``spec`` asks for more tasks than ``bounds`` admit, read from its
    parameters alone (a job whose type cannot say is counted as it expands)."""
    declared = declared_task_count(spec)
    if declared is not None:
        refusal = too_many_tasks(declared, bounds, _count_source(spec.spec.workload.type,
                                                                 spec.spec.workload.parameters))
        if refusal is not None:
            raise refusal


def declared_task_count(spec: JobSpec) -> int | None:
    """How many tasks ``spec`` asks for, read from its parameters without building any;
    None when its workload type cannot say (its expansion then counts as it builds)."""
    kind = spec.spec.workload.type
    params = spec.spec.workload.parameters
    try:
        recipe = recipe_for(kind)
    except LookupError:
        counter = BUILTIN_TASK_COUNTS.get(kind)
        return counter(params) if counter is not None else None
    return recipe.task_count(params)


def _count_source(kind: str, params: Any) -> str:
    """Where a job's task count is read from, for the message that refuses it."""
    if kind == "hyperparameter_search":
        grid = params.get("grid") if isinstance(params, dict) else None
        return "parameters.grid (the product of its lists' lengths)" if grid is not None else "parameters.trials"
    return {
        "command": "parameters.task_params",
        "sharded_kmeans": "parameters.shards",
        "federated_averaging": "parameters.num_shards",
    }.get(kind, f"the expansion of workload.type {kind!r}")


_SEPARATORS = frozenset("/\\\x00")  # what may not appear in a task id: it is one path segment


def _queueable(kind: str, job_id: str, tasks: object, bounds: JobBounds) -> list[TaskSpec]:
    """``tasks`` if they can all be queued for ``job_id``, else ``ExpansionError``: checked
    before the coordinator stores anything, so a refused job leaves no trace. ``tasks`` may
    be an iterator: it is consumed one task at a time, and the first task past ``bounds``
    (in number or in payload bytes) stops it. A task id is one path segment because
    ``jobs/<job>/<task>/`` is its write scope, which must not contain another task's."""
    source = f"the expansion of workload.type {kind!r}"
    if isinstance(tasks, (str, bytes, dict)) or not isinstance(tasks, Iterable):
        raise ExpansionError(f"{source} returned {type(tasks).__name__}, not a list of TaskSpec; fix its expand()")
    tally = PayloadTally(bounds)
    queued: list[TaskSpec] = []
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
        refusal = too_many_tasks(len(queued) + 1, bounds, source)
        if refusal is not None:
            raise refusal
        tally.add(task_id, task.payload)
        if task_id in seen and task_id not in duplicates:
            duplicates.append(task_id)
        seen.add(task_id)
        queued.append(task)
    if duplicates:
        listed = ", ".join(repr(task_id) for task_id in duplicates)
        raise ExpansionError(
            f"{source} returned duplicate task ids ({listed}) among its {len(queued)} tasks: task ids must be "
            "unique within a job (a repeated id collides with another task's jobs/<job>/<task>/ directory); give "
            "each task its own id (e.g. task-000, task-001, ...)"
        )
    return queued
