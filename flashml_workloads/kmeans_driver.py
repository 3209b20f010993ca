"""K-means driver: Lloyd's algorithm with the assignment step fanned out over a coordinator.

``shard_and_upload`` splits the rows into CSV shard artifacts; each iteration of ``run_kmeans``
submits one ``sharded_kmeans`` lease job (one ``kmeans_shard`` task per shard), waits for it to
succeed, downloads every shard's partial (``metrics.json``) and reduces them with
``reduce_partials`` into the next centroids. Both take the coordinator's URL or a ``Coordinator``
object. Standard library only (through ``flashruntime.client``).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from flashml_workloads._fedavg_http import Coordinator, HttpCoordinator, artifact_json
from flashml_workloads.kmeans_shard import check_centroids
from flashruntime.client import is_transient

__all__ = [
    "DEFAULT_IMAGE",
    "Coordinator",
    "init_centroids",
    "reduce_partials",
    "run_kmeans",
    "shard_and_upload",
]

DEFAULT_IMAGE = "local/tier1:dev"
_MAX_SHARDS = 999  # shard keys and task ids carry three digits
_T = TypeVar("_T")


def _checked_rows(rows: Any, where: str) -> list[list[float]]:
    """Rows → a non-empty list of equally long, non-empty lists of finite floats."""
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence) or not rows:
        raise ValueError(f"{where}: rows must be a non-empty list of rows of numbers, got {type(rows).__name__}")
    checked: list[list[float]] = []
    for i, row in enumerate(rows):
        if isinstance(row, (str, bytes)) or not isinstance(row, Sequence) or not row:
            raise ValueError(f"{where}: rows[{i}] is {row!r}; each row must be a non-empty list of numbers")
        if checked and len(row) != len(checked[0]):
            raise ValueError(
                f"{where}: rows[{i}] has {len(row)} values but rows[0] has {len(checked[0])}; "
                "every row needs the same dimension"
            )
        values = []
        for d, value in enumerate(row):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{where}: rows[{i}][{d}] is {value!r}; values must be finite numbers")
            values.append(float(value))
        checked.append(values)
    return checked


def _positive_int(value: Any, name: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}: {name} must be an int >= 1, got {value!r}")
    return value


def _positive_seconds(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise ValueError(f"run_kmeans: {name} must be a number of seconds > 0, got {value!r}")
    return float(value)


def init_centroids(rows: Sequence[Sequence[float]], k: int, seed: int = 0) -> list[list[float]]:
    """``k`` distinct rows drawn by ``random.Random(seed)`` (in draw order), as float lists."""
    checked = _checked_rows(rows, "init_centroids")
    _positive_int(k, "k", "init_centroids")
    if k > len(checked):
        raise ValueError(f"init_centroids: k={k} is more than the {len(checked)} rows; choose k <= {len(checked)}")
    return [list(checked[i]) for i in random.Random(seed).sample(range(len(checked)), k)]


def _partial_field(partial: Any, key: str, index: int) -> Any:
    if not isinstance(partial, Mapping) or key not in partial:
        raise ValueError(f"reduce_partials: partials[{index}] has no {key!r}; give the kmeans_shard metrics objects")
    return partial[key]


def reduce_partials(
    partials: Sequence[Mapping[str, Any]],
    prev: Sequence[Sequence[float]] | None = None,
    *,
    prev_centroids: Sequence[Sequence[float]] | None = None,
) -> tuple[list[list[float]], float]:
    """Shard partials → ``(centroids, inertia)``.

    Centroid j = Σ sums[j] / Σ counts[j] over the partials; a cluster no shard assigned a row to
    keeps ``prev[j]``. ``inertia`` is Σ of the partials' inertia, i.e. that of ``prev``. Pure.
    The previous centroids come as ``prev`` or as the keyword ``prev_centroids=``; give one of them.
    """
    if (prev is None) == (prev_centroids is None):
        raise TypeError(
            "reduce_partials: give the previous centroids once, as prev (the second argument) or as "
            f"prev_centroids=; got {'both' if prev is not None else 'neither'}"
        )
    name = "prev" if prev is not None else "prev_centroids"
    previous = check_centroids(prev if prev is not None else prev_centroids, f"reduce_partials: {name}")
    k, dim = len(previous), len(previous[0])
    if isinstance(partials, (str, bytes, Mapping)) or not isinstance(partials, Sequence) or not partials:
        raise ValueError("reduce_partials: partials must be a non-empty list of kmeans_shard metrics objects")
    sums: list[list[list[float]]] = [[[] for _ in range(dim)] for _ in range(k)]
    counts = [0] * k
    inertias = []
    for p, partial in enumerate(partials):
        raw_sums = _partial_field(partial, "sums", p)
        raw_counts = _partial_field(partial, "counts", p)
        if not isinstance(raw_sums, list) or len(raw_sums) != k:
            raise ValueError(f"reduce_partials: partials[{p}].sums must hold {k} rows (one per centroid)")
        if not isinstance(raw_counts, list) or len(raw_counts) != k:
            raise ValueError(f"reduce_partials: partials[{p}].counts must hold {k} counts (one per centroid)")
        for j in range(k):
            count = raw_counts[j]
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise ValueError(f"reduce_partials: partials[{p}].counts[{j}] is {count!r}; counts are ints >= 0")
            counts[j] += count
            row = raw_sums[j]
            if not isinstance(row, list) or len(row) != dim:
                raise ValueError(
                    f"reduce_partials: partials[{p}].sums[{j}] must hold {dim} values, the centroids' dimension"
                )
            for d, value in enumerate(row):
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                    raise ValueError(f"reduce_partials: partials[{p}].sums[{j}][{d}] is {value!r}; not a finite number")
                sums[j][d].append(float(value))
        inertia = _partial_field(partial, "inertia", p)
        if isinstance(inertia, bool) or not isinstance(inertia, (int, float)) or not (
            math.isfinite(inertia) and inertia >= 0
        ):
            raise ValueError(f"reduce_partials: partials[{p}].inertia is {inertia!r}; it must be a finite number >= 0")
        n = partial.get("n")
        if n is not None and n != sum(raw_counts):
            raise ValueError(
                f"reduce_partials: partials[{p}] has n={n!r} but its counts sum to {sum(raw_counts)}; "
                "the partial is inconsistent"
            )
        inertias.append(float(inertia))
    centroids = [
        [math.fsum(sums[j][d]) / counts[j] for d in range(dim)] if counts[j] else list(previous[j])
        for j in range(k)
    ]
    return centroids, math.fsum(inertias)


def _coordinator(
    target: str | Any, headers: Mapping[str, str] | None, where: str, needs: tuple[str, ...]
) -> Any:
    """An ``HttpCoordinator`` for the URL ``target`` (sending ``headers``), or ``target`` itself when it
    is a coordinator object with the methods ``needs`` names."""
    if isinstance(target, str):
        return HttpCoordinator(target, headers)
    if headers:
        raise ValueError(f"{where}: headers go with a coordinator URL; a Coordinator object sends its own")
    missing = [name for name in needs if not callable(getattr(target, name, None))]
    if missing:
        raise TypeError(
            f"{where}: {type(target).__name__} has no {', '.join(missing)}; give the coordinator's URL "
            f"(http://host:8100) or a Coordinator object with {', '.join(needs)}"
        )
    return target


def _shard_csv(rows: Sequence[Sequence[float]]) -> bytes:
    return "".join(",".join(f"{value:.6f}" for value in row) + "\n" for row in rows).encode("utf-8")


def shard_and_upload(
    base_url: str | Coordinator,
    rows: Sequence[Sequence[float]],
    n_shards: int,
    prefix: str,
    *,
    headers: Mapping[str, str] | None = None,
) -> list[str]:
    """Row i → shard ``i mod n_shards``; each shard PUT as a CSV (6 dp) under ``<prefix>/shard-<s:03d>.csv``.

    → the ``artifact://`` URIs in shard order. ``n_shards`` may not exceed the rows (no empty shard).
    ``base_url`` is the coordinator's URL, or a coordinator object with
    ``put_bytes(key, data, content_type)`` (as ``HttpCoordinator`` has).
    """
    checked = _checked_rows(rows, "shard_and_upload")
    _positive_int(n_shards, "n_shards", "shard_and_upload")
    if n_shards > min(len(checked), _MAX_SHARDS):
        raise ValueError(
            f"shard_and_upload: n_shards={n_shards} must be at most the number of rows ({len(checked)}) and at "
            f"most {_MAX_SHARDS}; every shard needs a row"
        )
    if not isinstance(prefix, str) or not prefix.strip("/"):
        raise ValueError(f"shard_and_upload: prefix must be a non-empty artifact key prefix, got {prefix!r}")
    coord = _coordinator(base_url, headers, "shard_and_upload", ("put_bytes",))
    base = prefix.rstrip("/")
    uris = []
    for s in range(n_shards):
        key = f"{base}/shard-{s:03d}.csv"
        record = coord.put_bytes(key, _shard_csv(checked[s::n_shards]), "text/csv")
        uris.append(str(record.get("uri") or f"artifact://{key}"))
    return uris


def _iteration_body(
    iteration: int, shard_uris: list[str], centroids: list[list[float]], lease_seconds: float, image: str,
    backend: str = "leases",
) -> dict[str, Any]:
    repository, sep, tag = image.rpartition(":")
    if not sep or not repository or not tag or "/" in tag:
        raise ValueError(f"run_kmeans: image must be 'repository:tag' with a pinned tag, got {image!r}")
    return {
        "apiVersion": "flashml.dev/v1alpha1",
        "kind": "Job",
        "metadata": {"name": f"kmeans-it{iteration:02d}"},
        "spec": {
            "execution": {"backend": backend},
            "image": {"repository": repository, "tag": tag},
            "workload": {
                "type": "sharded_kmeans",
                "parameters": {
                    "shards": list(shard_uris),
                    "centroids": centroids,
                    "iteration": iteration,
                    "lease_seconds": lease_seconds,
                },
            },
        },
    }


class _Iteration:
    """One submitted iteration: its job, its deadline, and reads retried on transient errors until then."""

    def __init__(
        self, coord: Coordinator, it: int, job_id: str, timeout_s: float, poll_seconds: float,
        clock: Callable[[], float], sleep: Callable[[float], None],
    ) -> None:
        self.coord, self.it, self.job_id = coord, it, job_id
        self.timeout_s, self.poll_seconds, self.clock, self.sleep = timeout_s, poll_seconds, clock, sleep
        self.deadline = clock() + timeout_s
        self.what = f"iteration {it} (job {job_id}, kmeans-it{it:02d})"

    def read(self, label: str, fn: Callable[[], _T]) -> _T:
        while True:
            try:
                return fn()
            except Exception as exc:
                remaining = self.deadline - self.clock()
                if not is_transient(exc) or remaining <= 0:
                    raise RuntimeError(f"{self.what}: {label} failed: {exc}") from exc
            self.sleep(min(self.poll_seconds, remaining))

    def wait_succeeded(self) -> None:
        while True:
            state = str(self.read("reading the job state", lambda: self.coord.job_state(self.job_id)))
            if state == "SUCCEEDED":
                return
            if state in ("FAILED", "CANCELLED"):
                raise RuntimeError(
                    f"{self.what} ended {state}; see GET /v1alpha1/jobs/{self.job_id}/events and /tasks for the "
                    "failed shards"
                )
            remaining = self.deadline - self.clock()
            if remaining <= 0:
                raise RuntimeError(
                    f"{self.what} is still {state} after {self.timeout_s:g} s; raise timeout_per_iteration_s "
                    "or start more workers"
                )
            self.sleep(min(self.poll_seconds, remaining))

    def partials(self, n_shards: int) -> list[dict[str, Any]]:
        """Every shard's ``metrics.json``, in shard order; a missing one raises ``RuntimeError``.

        With a ``tasks`` route, a task that is not COMPLETED has no partial; without one, a missing
        partial fails its fetch (``ArtifactNotFound``, the cause of the ``RuntimeError``)."""
        tasks_fn = getattr(self.coord, "tasks", None)
        states = None
        if callable(tasks_fn):
            listed = self.read("listing tasks", lambda: tasks_fn(self.job_id))
            states = {row.get("task_id"): row.get("state") for row in listed if isinstance(row, dict)}
        partials = []
        for s in range(n_shards):
            task_id = f"it{self.it:02d}-shard-{s:03d}"
            if states is not None and states.get(task_id) != "COMPLETED":
                raise RuntimeError(
                    f"{self.what}: task {task_id} is {states.get(task_id) or 'missing'}, so shard {s} has no partial"
                )
            key = f"jobs/{self.job_id}/{task_id}/metrics.json"
            raw = self.read(f"fetching {key}", lambda key=key: self.coord.get_artifact(key))
            try:
                partial = artifact_json(raw, key)
            except (ValueError, TypeError) as exc:
                raise RuntimeError(f"{self.what}: {exc}") from None
            if not isinstance(partial, dict) or partial.get("task_id") != task_id:
                raise RuntimeError(f"{self.what}: {key} is not the kmeans_shard partial of task {task_id}")
            partials.append(partial)
        return partials


def run_kmeans(
    base_url: str | Coordinator,
    shard_uris: Sequence[str],
    centroids: Sequence[Sequence[float]],
    iterations: int = 5,
    lease_seconds: float = 30.0,
    poll_seconds: float = 0.5,
    timeout_per_iteration_s: float = 300.0,
    *,
    image: str = DEFAULT_IMAGE,
    headers: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    backend: str = "leases",
) -> dict[str, Any]:
    """``iterations`` Lloyd iterations over the shards → ``{"centroids", "inertia_history", "job_ids"}``.

    Iteration ``it`` submits the ``sharded_kmeans`` job ``kmeans-it<it:02d>``, polls it every
    ``poll_seconds`` until SUCCEEDED, fetches every shard's ``metrics.json`` and reduces them.
    ``inertia_history[it]`` is the inertia of the centroids iteration ``it`` started from. A job
    that ends FAILED or CANCELLED, or is not SUCCEEDED within ``timeout_per_iteration_s``, raises
    ``RuntimeError`` naming it. Reads that hit a connection error or HTTP 5xx are retried until the
    iteration's deadline; the submission is not (a repeated POST would create a second job).
    ``clock``/``sleep`` are injectable. Each iteration is one job of the coordinator's ``backend``:
    ``"leases"`` (its agents), or ``"ray"`` on a coordinator with a Ray backend.

    ``base_url`` is the coordinator's URL (``headers`` go with every call), or a ``Coordinator``
    object with ``submit``, ``job_state`` and ``get_artifact`` (and, optionally, ``tasks``), whose
    ``get_artifact`` may return bytes, text or the parsed JSON.
    """
    if isinstance(shard_uris, (str, bytes)) or not isinstance(shard_uris, Sequence) or not shard_uris:
        raise ValueError("run_kmeans: shard_uris must be a non-empty list of artifact:// URIs (see shard_and_upload)")
    bad = [uri for uri in shard_uris if not (isinstance(uri, str) and uri.startswith("artifact://"))]
    if bad:
        raise ValueError(f"run_kmeans: shard_uris {bad!r} are not artifact:// URIs")
    if len(shard_uris) > _MAX_SHARDS:
        raise ValueError(f"run_kmeans: {len(shard_uris)} shards is more than {_MAX_SHARDS}")
    current = check_centroids(centroids, "run_kmeans: centroids")
    _positive_int(iterations, "iterations", "run_kmeans")
    lease_seconds = _positive_seconds(lease_seconds, "lease_seconds")
    poll_seconds = _positive_seconds(poll_seconds, "poll_seconds")
    timeout_per_iteration_s = _positive_seconds(timeout_per_iteration_s, "timeout_per_iteration_s")
    uris = list(shard_uris)
    coord = _coordinator(base_url, headers, "run_kmeans", ("submit", "job_state", "get_artifact"))
    inertia_history: list[float] = []
    job_ids: list[str] = []
    for it in range(iterations):
        job_id = str(coord.submit(_iteration_body(it, uris, current, lease_seconds, image, backend))["job_id"])
        job_ids.append(job_id)
        iteration = _Iteration(coord, it, job_id, timeout_per_iteration_s, poll_seconds, clock, sleep)
        iteration.wait_succeeded()
        try:
            current, inertia = reduce_partials(iteration.partials(len(uris)), current)
        except ValueError as exc:
            raise RuntimeError(f"{iteration.what}: the shard partials do not reduce: {exc}") from None
        inertia_history.append(inertia)
    return {"centroids": current, "inertia_history": inertia_history, "job_ids": job_ids}
