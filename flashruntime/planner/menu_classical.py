"""Candidate menu for ``classical_ml``: one in-memory ``local_process`` fit,
and, for estimators with ``partial_fit``, a ``sharded_partial_fit`` over leased workers.

Both are judged on host RAM: the working set is 3 x the data (decimal GB, dataset_mb/1000).
"""

from __future__ import annotations

import math

from flashruntime.planner import constants as K
from flashruntime.planner.candidate import Candidate, Knobs
from flashruntime.planner.checks import apply_host_ram, apply_objective
from flashruntime.planner.libraries import LEASES, LOCAL_PROCESS
from flashruntime.protocol.plan_v1alpha1 import ClassicalML, Objective, Resources

_NO_TIME = "classical ML has no runtime model; measure one fit"


def shard_workers(dataset_mb: float) -> int:
    """max(2, min(16, dataset_mb // 500 or 2)) workers."""
    by_size = int(dataset_mb // K.SHARD_MB_PER_WORKER) or K.SHARD_MIN_WORKERS
    return max(K.SHARD_MIN_WORKERS, min(K.SHARD_MAX_WORKERS, by_size))


def classical_candidates(wl: ClassicalML, res: Resources, obj: Objective, warnings: list[str]) -> list[Candidate]:
    library = (wl.library if wl.library != "sklearn" else "scikit-learn", "library", f"fits {wl.algorithm}")
    dataset_gb = wl.dataset_mb / 1000
    local = Candidate(
        name="local_process",
        family="local_process",
        workers=1,
        launcher="local_process",
        workload_mode="local",
        knobs=Knobs(),
        libraries=(LOCAL_PROCESS, library),
    )
    apply_host_ram(local, K.CLASSICAL_RAM_FACTOR * dataset_gb, res.cpu_ram_gb, "in-memory working set 3 x dataset")
    local.no_time(_NO_TIME)
    out = [local]
    if wl.supports_partial_fit:
        workers = shard_workers(wl.dataset_mb)
        per_host = math.ceil(workers / res.hosts)
        sharded = Candidate(
            name="sharded_partial_fit",
            family="sharded_partial_fit",
            workers=workers,
            launcher="flashruntime-leases",
            workload_mode="independent_tasks",
            colocated=res.hosts == 1,
            knobs=Knobs(),
            libraries=(LEASES, library),
        )
        shard_gb = K.CLASSICAL_RAM_FACTOR * dataset_gb / workers
        apply_host_ram(
            sharded,
            shard_gb * per_host,
            res.cpu_ram_gb,
            f"working set per host ({workers} shards of {wl.dataset_mb / workers:.0f} MB, {per_host} per host, "
            f"3 x shard each)",
        )
        sharded.no_time(_NO_TIME)
        out.append(sharded)
    elif local.status == "infeasible":
        warnings.append(
            f"{wl.algorithm}: the data does not fit in RAM and supports_partial_fit is false - an estimator "
            f"with partial_fit could be sharded"
        )
    for c in out:
        if c.feasible:
            apply_objective(c, obj)
    return out
