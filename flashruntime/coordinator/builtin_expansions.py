"""The coordinator's built-in expansions: hyperparameter search, one
sharded K-means iteration, one federated-averaging round.

Each maps a job's ``workload.parameters`` to module tasks for allowlisted task
modules, refusing bad parameters with an ``ExpansionError`` that says what to fix. The
parameters are checked at once; the tasks are built lazily, one at a time as the caller
iterates, so the expansion's bounds stop an oversized job before all of it exists.
``BUILTIN_TASK_COUNTS`` reads each type's task count from its parameters alone.
Public names are re-exported by ``flashruntime.coordinator.expansion``.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from flashruntime.errors import ExpansionError
from flashruntime.protocol.lease_rules import (
    DEFAULT_LEASE_SECONDS,
    FEDAVG_LEASE_SECONDS,
    MAX_LEASE_SECONDS,
    MIN_LEASE_SECONDS,
    bounded_lease_seconds,
)
from flashruntime.protocol.task_modules import (
    ALLOWED_TASK_MODULES,
    FEDAVG_DRIVER_SUPPLIED_KEYS,
    FEDAVG_WORKER_PARAM_KEYS,
)
from flashruntime.protocol.v1alpha1 import JobSpec, TaskSpec
from flashruntime.recipes.base import lease_task, output_prefix

__all__ = [
    "ALLOWED_TASK_MODULES",
    "BUILTIN_EXPANSIONS",
    "BUILTIN_TASK_COUNTS",
    "FEDAVG_DRIVER_SUPPLIED_KEYS",
    "FEDAVG_WORKER_PARAM_KEYS",
]

_PACKAGE = "flashml_workloads"

_MAX_SHARDS = 999
_ARTIFACT_SCHEME = "artifact://"


def _is_artifact_uri(value: object) -> bool:
    return isinstance(value, str) and value.startswith(_ARTIFACT_SCHEME) and value != _ARTIFACT_SCHEME


def _non_negative_int(params: Mapping[str, Any], key: str, kind: str) -> int:
    value = params.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ExpansionError(f"{kind}: parameters.{key} is {value!r}; it must be an integer >= 0 (default 0)")
    return value


def _lease_seconds(params: Mapping[str, Any], default: float, kind: str) -> float:
    try:
        return bounded_lease_seconds(params.get("lease_seconds"), default)
    except ValueError as exc:
        raise ExpansionError(
            f"{kind}: parameters.{exc}; give a number of seconds >= {MIN_LEASE_SECONDS:g} (values above {MAX_LEASE_SECONDS} are "
            f"capped; default {default:g})"
        ) from None


def _qualified_module(raw: object) -> str:
    allowed = ", ".join(sorted(name.rpartition(".")[2] for name in ALLOWED_TASK_MODULES))
    if not isinstance(raw, str) or not raw:
        raise ExpansionError(f"hyperparameter_search: parameters.module is {raw!r}; name a task module ({allowed})")
    qualified = raw if "." in raw else f"{_PACKAGE}.{raw}"
    if qualified not in ALLOWED_TASK_MODULES:
        raise ExpansionError(
            f"hyperparameter_search: task module {raw!r} is not allowlisted; use one of {allowed} "
            f"(bare, or qualified as {_PACKAGE}.<name>)"
        )
    return qualified


def _checked_inputs(raw: object, kind: str) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ExpansionError(
            f"{kind}: parameters.inputs must be a mapping of input name to artifact:// URI, got {type(raw).__name__}"
        )
    problems = []
    for name, uri in raw.items():
        if not isinstance(name, str) or not name or "/" in name or "\\" in name or name in (".", ".."):
            problems.append(f"input name {name!r} must be a plain file name (no '/', '\\\\', '.' or '..')")
        if not _is_artifact_uri(uri):
            problems.append(f"parameters.inputs[{name!r}] is {uri!r}; inputs must be artifact:// URIs")
    if problems:
        raise ExpansionError(f"{kind}: " + "; ".join(problems))
    return dict(raw)


def _trials(params: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    trials, grid = params.get("trials"), params.get("grid")
    if (trials is None) == (grid is None):
        raise ExpansionError(
            "hyperparameter_search: give exactly one of parameters.trials (a list of dicts, one per trial) or "
            "parameters.grid (a dict of lists, expanded as a cartesian product)"
            + ("; both were given" if trials is not None else "")
        )
    if trials is not None:
        if not isinstance(trials, list) or not trials:
            raise ExpansionError(
                f"hyperparameter_search: parameters.trials is {trials!r}; give a non-empty list of dicts"
            )
        bad = [i for i, trial in enumerate(trials) if not isinstance(trial, dict)]
        if bad:
            raise ExpansionError(
                f"hyperparameter_search: parameters.trials entries {bad} are not dicts; each trial is a dict"
            )
        return (copy.deepcopy(trial) for trial in trials)
    if not isinstance(grid, dict) or not grid:
        raise ExpansionError(
            f"hyperparameter_search: parameters.grid is {grid!r}; give a non-empty dict of parameter name to list of "
            "values, e.g. {'C': [0.1, 1.0]}"
        )
    keys = list(grid)
    if not all(isinstance(key, str) for key in keys):
        raise ExpansionError(f"hyperparameter_search: parameters.grid keys must be strings, got {keys!r}")
    keys.sort()
    empty = [key for key in keys if not isinstance(grid[key], list) or not grid[key]]
    if empty:
        raise ExpansionError(f"hyperparameter_search: parameters.grid values for {empty} must be non-empty lists")
    combos = itertools.product(*(grid[key] for key in keys))
    return (dict(zip(keys, copy.deepcopy(combo), strict=True)) for combo in combos)


def _module_task(
    job_id: str, spec: JobSpec, task_id: str, module: str, params: dict[str, Any], inputs: dict[str, str],
    lease_seconds: float, extra: Mapping[str, Any] | None = None,
) -> TaskSpec:
    inner = spec.spec
    payload: dict[str, Any] = {
        "module": module,
        "params": params,
        "inputs": dict(inputs),
        "output_prefix": output_prefix(job_id, task_id),
        "task_id": task_id,
        "isolation": {"tier": str(inner.isolation.tier), "allowFallback": inner.isolation.allowFallback},
    }
    if inner.image is not None:  # for container agents; the bundled worker ignores it
        payload["image"] = inner.image.reference
    if inner.placement.pool != "any":
        payload["pool"] = inner.placement.pool
    if extra:
        payload.update(copy.deepcopy(dict(extra)))
    return lease_task(job_id, task_id, spec, payload, lease_seconds)


def expand_hyperparameter_search(job_id: str, spec: JobSpec) -> Iterator[TaskSpec]:
    params = spec.spec.workload.parameters
    trials = _trials(params)
    module = _qualified_module("sklearn_trial" if params.get("module") is None else params["module"])
    inputs = _checked_inputs(params.get("inputs"), "hyperparameter_search")
    lease_seconds = _lease_seconds(params, DEFAULT_LEASE_SECONDS, "hyperparameter_search")
    extra = {"checkpoint": params["checkpoint"]} if params.get("checkpoint") is not None else None
    return (
        _module_task(job_id, spec, f"trial-{i:03d}", module, trial, inputs, lease_seconds, extra)
        for i, trial in enumerate(trials)
    )


def expand_sharded_kmeans(job_id: str, spec: JobSpec) -> Iterator[TaskSpec]:
    params = spec.spec.workload.parameters
    shards = params.get("shards")
    if not isinstance(shards, list) or not shards:
        raise ExpansionError(
            f"sharded_kmeans: parameters.shards is {shards!r}; give a non-empty list of artifact:// URIs, one per shard"
        )
    bad = [i for i, uri in enumerate(shards) if not _is_artifact_uri(uri)]
    if bad:
        raise ExpansionError(f"sharded_kmeans: parameters.shards entries {bad} are not artifact:// URIs")
    centroids = params.get("centroids")
    if not isinstance(centroids, list) or not centroids:
        raise ExpansionError(
            f"sharded_kmeans: parameters.centroids is {centroids!r}; it is required: give a non-empty list of "
            "centroid rows (e.g. from kmeans_driver.init_centroids)"
        )
    iteration = _non_negative_int(params, "iteration", "sharded_kmeans")
    lease_seconds = _lease_seconds(params, DEFAULT_LEASE_SECONDS, "sharded_kmeans")
    return (
        _module_task(
            job_id, spec, f"it{iteration:02d}-shard-{i:03d}", f"{_PACKAGE}.kmeans_shard",
            {"centroids": copy.deepcopy(centroids)}, {"shard": uri}, lease_seconds,
        )
        for i, uri in enumerate(shards)
    )


def expand_federated_averaging(job_id: str, spec: JobSpec) -> Iterator[TaskSpec]:
    params = spec.spec.workload.parameters
    num_shards = params.get("num_shards")
    if isinstance(num_shards, bool) or not isinstance(num_shards, int) or not 1 <= num_shards <= _MAX_SHARDS:
        raise ExpansionError(
            f"federated_averaging: parameters.num_shards is {num_shards!r}; "
            f"it must be an integer from 1 to {_MAX_SHARDS}"
        )
    missing = [key for key in FEDAVG_WORKER_PARAM_KEYS if key not in params]
    if missing:
        raise ExpansionError(
            f"federated_averaging: missing worker parameters {missing}; every one of "
            f"{list(FEDAVG_WORKER_PARAM_KEYS)} is required"
        )
    weights = params.get("weights")
    if weights is not None and not _is_artifact_uri(weights):
        raise ExpansionError(
            f"federated_averaging: parameters.weights is {weights!r}; give the global weights as an artifact:// URI "
            "or leave it out for round 0"
        )
    fl_round = _non_negative_int(params, "round", "federated_averaging")
    lease_seconds = _lease_seconds(params, FEDAVG_LEASE_SECONDS, "federated_averaging")
    inputs = {"weights": weights} if weights is not None else {}
    worker = {key: params[key] for key in FEDAVG_WORKER_PARAM_KEYS}
    return (
        _module_task(
            job_id, spec, f"shard-{i:03d}", f"{_PACKAGE}.fedavg_worker",
            {**copy.deepcopy(worker), "round": fl_round, "shard": i, "num_shards": num_shards}, inputs, lease_seconds,
        )
        for i in range(num_shards)
    )


def _hyperparameter_search_count(params: Mapping[str, Any]) -> int | None:
    """``len(trials)``, or the product of the grid's list lengths (a few short lists can ask
    for billions of tasks); None for a shape the expansion refuses anyway."""
    trials, grid = params.get("trials"), params.get("grid")
    if isinstance(trials, list) and grid is None:
        return len(trials)
    if trials is None and isinstance(grid, dict) and grid and all(isinstance(v, list) for v in grid.values()):
        return math.prod(len(values) for values in grid.values())
    return None


def _sharded_kmeans_count(params: Mapping[str, Any]) -> int | None:
    shards = params.get("shards")
    return len(shards) if isinstance(shards, list) else None


def _federated_averaging_count(params: Mapping[str, Any]) -> int | None:
    num_shards = params.get("num_shards")
    return num_shards if isinstance(num_shards, int) and not isinstance(num_shards, bool) else None


BUILTIN_TASK_COUNTS: dict[str, Callable[[Mapping[str, Any]], int | None]] = {
    "federated_averaging": _federated_averaging_count,
    "hyperparameter_search": _hyperparameter_search_count,
    "sharded_kmeans": _sharded_kmeans_count,
}

BUILTIN_EXPANSIONS: dict[str, Callable[[str, JobSpec], Iterator[TaskSpec]]] = {
    "federated_averaging": expand_federated_averaging,
    "hyperparameter_search": expand_hyperparameter_search,
    "sharded_kmeans": expand_sharded_kmeans,
}
