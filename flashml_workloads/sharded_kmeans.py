"""K-means on Ray: Lloyd's algorithm with the assignment step as one Ray task per shard.

The same algorithm as ``flashml_workloads.kmeans_driver`` (which fans each iteration out over a
coordinator's agents), with the same parameters and results: ``shard_rows`` splits the rows
(row i to shard ``i mod n_shards``) into Ray's object store, once; each iteration of
``run_kmeans`` runs ``kmeans_shard.partial_of`` on every shard against the current centroids
and reduces the partials with ``reduce_partials``. On the same rows (at the 6 decimals a shard
CSV keeps), seed and iterations, both reach the same centroids.

Ray never retries a shard task itself (``max_retries=0``): a shard whose Ray worker or node was
lost is run again, up to ``max_task_attempts`` times, while an error in the shard's own
computation (a row that overflows, say) would recur and ends the run at once with
``RuntimeError`` naming the shard. Needs the ray extra (``pip install 'flashruntime[ray]'``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from flashml_workloads.kmeans_driver import init_centroids, reduce_partials
from flashml_workloads.kmeans_shard import check_centroids, partial_of
from flashruntime.protocol.v1alpha1 import FailureClass
from flashruntime.ray_backend.cluster import RAY_ADDRESS_ENV, connect
from flashruntime.ray_backend.failures import classify_ray_error

__all__ = ["init_centroids", "reduce_partials", "run_kmeans", "shard_rows"]

_MAX_SHARDS = 999
_RETRIED = (FailureClass.WORKER_CRASH, FailureClass.NODE_LOSS, FailureClass.UNKNOWN)


def _checked(rows: Any, where: str) -> list[list[float]]:
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence) or not rows:
        raise ValueError(f"{where}: rows must be a non-empty list of equal-length lists of numbers")
    return check_centroids(rows, f"{where}: rows")


def _address(ray_address: str | None) -> str:
    import os

    return ray_address or os.environ.get(RAY_ADDRESS_ENV) or "local"


def shard_rows(rows: Sequence[Sequence[float]], n_shards: int, *, ray_address: str | None = None) -> list[Any]:
    """Row i → shard ``i mod n_shards``, each shard put into Ray's object store once → their
    references in shard order (what ``run_kmeans`` takes). ``n_shards`` may not exceed the rows."""
    checked = _checked(rows, "shard_rows")
    if isinstance(n_shards, bool) or not isinstance(n_shards, int) or not 1 <= n_shards <= min(len(checked),
                                                                                             _MAX_SHARDS):
        raise ValueError(f"shard_rows: n_shards must be a whole number from 1 to the number of rows "
                         f"({len(checked)}, at most {_MAX_SHARDS}); got {n_shards!r}")
    ray = connect(_address(ray_address))
    return [ray.put(checked[s::n_shards]) for s in range(n_shards)]


def _shard_partial(rows: list[list[float]], centroids: list[list[float]], shard: int) -> dict[str, Any]:
    return partial_of(list(enumerate(rows, start=1)), centroids, f"shard-{shard:03d}", f"shard {shard:03d} row")


def run_kmeans(
    shards: Sequence[Any],
    centroids: Sequence[Sequence[float]],
    iterations: int = 5,
    *,
    ray_address: str | None = None,
    timeout_per_iteration_s: float = 300.0,
    max_task_attempts: int = 3,
) -> dict[str, Any]:
    """``iterations`` Lloyd iterations over ``shards`` (from ``shard_rows``) →
    ``{"centroids", "inertia_history", "attempts"}``: ``inertia_history[it]`` is the inertia of
    the centroids iteration ``it`` started from, ``attempts[it]`` the Ray tasks it ran (one per
    shard, more when a lost one was run again). An iteration not done within
    ``timeout_per_iteration_s``, a shard that fails in its own code, or one lost more than
    ``max_task_attempts`` times raises ``RuntimeError`` naming it."""
    if isinstance(shards, (str, bytes)) or not isinstance(shards, Sequence) or not shards:
        raise ValueError("run_kmeans: shards must be the non-empty list shard_rows returned")
    current = check_centroids(centroids, "run_kmeans: centroids")
    for value, name in ((iterations, "iterations"), (max_task_attempts, "max_task_attempts")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"run_kmeans: {name} must be a whole number >= 1, got {value!r}")
    if isinstance(timeout_per_iteration_s, bool) or not isinstance(timeout_per_iteration_s, (int, float)) \
            or not timeout_per_iteration_s > 0:
        raise ValueError(f"run_kmeans: timeout_per_iteration_s must be a number of seconds > 0, "
                         f"got {timeout_per_iteration_s!r}")
    ray = connect(_address(ray_address))
    task = ray.remote(_shard_partial).options(num_cpus=1, max_retries=0)
    inertia_history: list[float] = []
    attempts: list[int] = []
    for it in range(iterations):
        partials, ran = _iteration(ray, task, shards, current, it, timeout_per_iteration_s, max_task_attempts)
        try:
            current, inertia = reduce_partials(partials, current)
        except ValueError as exc:
            raise RuntimeError(f"k-means iteration {it}: the shard partials do not reduce: {exc}") from None
        inertia_history.append(inertia)
        attempts.append(ran)
    return {"centroids": current, "inertia_history": inertia_history, "attempts": attempts}


def _iteration(ray: Any, task: Any, shards: Sequence[Any], centroids: list[list[float]], it: int,
               timeout_s: float, max_task_attempts: int) -> tuple[list[dict[str, Any]], int]:
    deadline = time.monotonic() + timeout_s
    running = {task.remote(shard, centroids, s): s for s, shard in enumerate(shards)}
    tries = {s: 1 for s in range(len(shards))}
    partials: dict[int, dict[str, Any]] = {}
    while running:
        left = deadline - time.monotonic()
        if left <= 0:
            for ref in running:
                ray.cancel(ref, force=True)
            raise RuntimeError(f"k-means iteration {it}: shards {sorted(running.values())} not done within "
                               f"{timeout_s:g} s (timeout_per_iteration_s)")
        ready, _ = ray.wait(list(running), num_returns=1, timeout=min(left, 1.0))
        for ref in ready:
            s = running.pop(ref)
            try:
                partials[s] = ray.get(ref)
            except Exception as exc:
                failure, words = classify_ray_error(exc)
                if failure not in _RETRIED or getattr(exc, "cause", None) is not None:
                    raise RuntimeError(f"k-means iteration {it}: shard {s:03d} failed: {words}") from None
                if tries[s] >= max_task_attempts:
                    raise RuntimeError(f"k-means iteration {it}: shard {s:03d} was lost {tries[s]} times "
                                       f"({failure}: {words}); max_task_attempts={max_task_attempts}") from None
                tries[s] += 1
                running[task.remote(shards[s], centroids, s)] = s
    return [partials[s] for s in range(len(shards))], sum(tries.values())
