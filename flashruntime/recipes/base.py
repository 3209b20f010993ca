"""The workload-recipe contract and its registry.

A recipe turns one job's ``workload.parameters`` into deterministic ``TaskSpec``s
for the lease coordinator. Recipes register by ``kind`` (= ``workload.type``);
``flashruntime.coordinator.expansion.expand_tasks`` consults the registry before its
built-in expansions.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

from flashruntime.protocol.v1alpha1 import JobSpec, TaskSpec

__all__ = ["WorkloadRecipe", "recipe_for", "register_recipe"]


class WorkloadRecipe(ABC):
    """How one workload type expands into tasks.

    Contract for ``expand``: deterministic task ids, ``commit_key =
    <output_prefix>metrics.json``, ``max_attempts = retryPolicy.maxTaskAttempts``,
    and the job's ``lease_seconds`` honoured; refusals are ``ValueError`` (the
    service answers 422 with the message).
    """

    kind: ClassVar[str] = ""
    """The ``workload.type`` this recipe expands."""
    task_module: ClassVar[str] = ""
    """The task module its tasks run (``""`` when the tasks carry their own argv)."""

    def validate_params(self, params: Mapping[str, Any]) -> list[str]:
        """Every problem with ``params`` as one readable sentence each; ``[]`` = valid."""
        return []

    @abstractmethod
    def expand(self, job_id: str, spec: JobSpec) -> list[TaskSpec]:
        """The job's tasks, in queue order. Raises ``ValueError`` to refuse the job."""

    def task_count(self, params: Mapping[str, Any]) -> int | None:
        """How many tasks ``expand`` would build from ``params``, read without building them
        (the coordinator refuses a job over its task bound from this); None: unknown until built."""
        return None

    def iter_tasks(self, job_id: str, spec: JobSpec) -> Iterator[TaskSpec]:
        """The job's tasks one at a time, for a caller that may stop early (the coordinator's
        byte bound); a recipe that can build them lazily overrides this. Default: ``expand``'s."""
        return iter(self.expand(job_id, spec))

    @abstractmethod
    def validate_output(self, metrics: Mapping[str, Any]) -> None:
        """Raise ``ValueError`` when a task's ``metrics.json`` content is unacceptable."""

    def reduce(self, outputs: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
        """Combine the accepted outputs (task id -> metrics) into one result; ``None`` = nothing to combine."""
        return None

    def checkpointable(self) -> bool:
        """Whether this recipe's tasks write checkpoints a retry can resume from."""
        return False

    def plan_hints(self) -> dict[str, Any]:
        """Hints for the planner; ``{}`` = none."""
        return {}


_RECIPES: dict[str, WorkloadRecipe] = {}


def register_recipe(recipe: WorkloadRecipe) -> None:
    """Register ``recipe`` for its ``kind``, replacing any recipe of the same kind."""
    if isinstance(recipe, type):
        raise TypeError(
            f"register_recipe takes a recipe instance, got the class {recipe.__name__}; "
            f"call register_recipe({recipe.__name__}())"
        )
    if not isinstance(recipe, WorkloadRecipe):
        raise TypeError(
            f"register_recipe takes a WorkloadRecipe instance, got {type(recipe).__name__}; "
            "subclass flashruntime.recipes.WorkloadRecipe"
        )
    kind = recipe.kind
    if not isinstance(kind, str) or not kind:
        raise ValueError(
            f"{type(recipe).__name__}.kind is {kind!r}; set the class attribute kind to the "
            "workload.type it expands, e.g. kind = 'command'"
        )
    _RECIPES[kind] = recipe


def recipe_for(kind: str) -> WorkloadRecipe:
    """The recipe registered for ``kind``; ``LookupError`` naming the registered kinds otherwise."""
    recipe = _RECIPES.get(kind) if isinstance(kind, str) else None
    if recipe is None:
        registered = ", ".join(repr(name) for name in sorted(_RECIPES)) or "none"
        raise LookupError(
            f"no workload recipe registered for kind {kind!r} (registered: {registered}); "
            "register one with flashruntime.recipes.register_recipe()"
        )
    return recipe


MAX_EXPIRIES = 9  # lost workers a task survives, whatever the job's retry policy


def output_prefix(job_id: str, task_id: str) -> str:
    """Where a task's outputs live: ``jobs/<job>/<task>/`` (its write scope)."""
    return f"jobs/{job_id}/{task_id}/"


def lease_task(job_id: str, task_id: str, spec: JobSpec, payload: dict[str, Any], lease_seconds: float) -> TaskSpec:
    """A ``TaskSpec`` with the rules every expansion shares: commit key
    ``<output_prefix>metrics.json``, ``max_attempts`` from the job's retry policy and
    ``max_expiries`` = ``MAX_EXPIRIES``."""
    return TaskSpec(
        task_id=task_id,
        job_id=job_id,
        payload=payload,
        commit_key=f"{output_prefix(job_id, task_id)}metrics.json",
        max_attempts=spec.spec.retryPolicy.maxTaskAttempts,
        max_expiries=MAX_EXPIRIES,
        lease_seconds=lease_seconds,
    )
