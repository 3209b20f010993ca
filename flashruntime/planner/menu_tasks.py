"""Candidate menu for ``independent_tasks``: ``lease_tasks`` runs the tasks
on parallel slots through the lease coordinator; ``local_sequential`` runs them one by
one and is dominated whenever more than one slot exists.
"""

from __future__ import annotations

import math

from flashruntime.planner import constants as K
from flashruntime.planner import timing
from flashruntime.planner.candidate import Candidate, Knobs, Miss
from flashruntime.planner.catalog_gpus import GpuFacts
from flashruntime.planner.checks import apply_objective
from flashruntime.planner.libraries import LEASES, LOCAL_PROCESS
from flashruntime.protocol.plan_v1alpha1 import IndependentTasks, Objective, Resources


def task_slots(wl: IndependentTasks, res: Resources) -> int:
    """gpus if needs_gpu else hosts x max(1, cpu_cores // 4), capped at task_count."""
    if wl.needs_gpu:
        slots = res.gpus
    else:
        slots = res.hosts * max(1, res.cpu_cores // K.CORES_PER_CPU_TASK)
    return min(slots, wl.task_count)


def task_candidates(
    wl: IndependentTasks, res: Resources, obj: Objective, gpu: GpuFacts | None, warnings: list[str]
) -> list[Candidate]:
    slots = task_slots(wl, res)
    gpw = 1 if wl.needs_gpu else 0
    leased = Candidate(
        name="lease_tasks",
        family="lease_tasks",
        workers=max(1, slots),
        launcher="flashruntime-leases",
        workload_mode="independent_tasks",
        gpus_per_worker=gpw,
        colocated=res.hosts == 1,
        knobs=Knobs(),
        libraries=(LEASES,),
    )
    sequential = Candidate(
        name="local_sequential",
        family="local_process",
        workers=1,
        launcher="local_process",
        workload_mode="local",
        gpus_per_worker=gpw,
        knobs=Knobs(),
        libraries=(LOCAL_PROCESS,),
    )
    candidates = [leased, sequential]
    if wl.needs_gpu and res.gpus < 1:
        for c in candidates:
            c.reject(
                "infeasible",
                "tasks need a GPU (needs_gpu = true) but resources.gpus = 0",
                Miss(math.inf, "set resources.gpus >= 1"),
            )
    elif wl.needs_gpu and wl.vram_gb_per_task > 0:
        if gpu is None:
            warnings.append("GPU memory unknown (no gpu_type or vram_gb): vram_gb_per_task not checked")
        elif wl.vram_gb_per_task > gpu.vram_gb:
            for c in candidates:
                c.reject(
                    "infeasible",
                    f"a task needs {wl.vram_gb_per_task:g} GB > {gpu.vram_gb:g} GB VRAM of {gpu.label}",
                    Miss(wl.vram_gb_per_task / gpu.vram_gb, f"it needs GPUs with >= {wl.vram_gb_per_task:g} GB"),
                )
        else:
            for c in candidates:
                c.reasons.append(f"a task needs {wl.vram_gb_per_task:g} GB <= {gpu.vram_gb:g} GB VRAM")
    waves = math.ceil(wl.task_count / max(1, slots))
    _timed(leased, wl, res, waves, max(1, slots), f"{waves} waves of {slots} slots")
    _timed(sequential, wl, res, wl.task_count, 1, "one task at a time")
    if sequential.feasible and slots > 1:
        sequential.reject(
            "rejected_dominated",
            f"dominated by lease_tasks: {slots} parallel slots finish in {timing.duration_text(leased.time_min)} "
            f"instead of {timing.duration_text(sequential.time_min)}",
        )
    for c in candidates:
        if c.feasible:
            apply_objective(c, obj)
    return candidates


def _timed(c: Candidate, wl: IndependentTasks, res: Resources, waves: int, gpus: int, how: str) -> None:
    exact = waves * wl.est_minutes_per_task
    minutes = timing.shown_minutes(exact)
    c.set_time(
        minutes,
        f"time {timing.duration_text(minutes)} = {waves} x {wl.est_minutes_per_task:g} min per task ({how}, {wl.task_count} tasks)",
        exact,
    )
    if wl.needs_gpu and res.hourly_cost_usd_per_gpu is not None:
        c.set_cost(*timing.cost_usd(minutes, gpus, res.hourly_cost_usd_per_gpu, exact))
