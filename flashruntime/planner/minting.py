"""Plan minting: the winning candidate becomes a ``StrategyPlan``, every
candidate a ``CandidateVerdict``; the working dataclasses become wire models here.

Candidates and the plan are built as plain dicts and validated once, as part of the
whole ``PlanReport``, which keeps ``plan`` well inside its latency budget.
"""

from __future__ import annotations

from typing import Any

from flashruntime.planner import constants as K
from flashruntime.planner.candidate import Candidate, Memory

CHECKPOINT_NOTE = (
    "save a sharded checkpoint with torch.distributed.checkpoint every 300 s and at exit; "
    "on restart every rank resumes from the newest complete step"
)


def _memory(mem: Memory | None, basis: str = "static") -> dict[str, Any] | None:
    if mem is None:
        return None
    return {
        "basis": basis,
        "weights_gb": mem.weights_gb,
        "gradients_gb": mem.gradients_gb,
        "optimizer_gb": mem.optimizer_gb,
        "activations_gb": mem.activations_gb,
        "transient_gb": mem.transient_gb,
        "overhead_gb": mem.overhead_gb,
        "total_gb": mem.total_gb,
        "cpu_offload_gb": mem.cpu_offload_gb,
    }


def _time(c: Candidate) -> dict[str, Any] | None:
    if c.time_min is None:
        return None
    return {"value": c.time_min, "unit": "min", "note": c.time_note, "basis": c.time_basis}


def _cost(c: Candidate) -> dict[str, Any] | None:
    if c.cost_usd is None:
        return None
    return {"value": c.cost_usd, "unit": "USD", "note": c.cost_note, "basis": c.cost_basis}


def verdict(c: Candidate) -> dict[str, Any]:
    """The ``CandidateVerdict`` fields of ``c`` (validated later with the whole report, which copies
    ``reasons``)."""
    return {
        "name": c.name,
        "strategy_family": c.family,
        "workers": c.workers,
        "status": c.status,
        "memory": None if c.memory is None else _memory(c.memory, c.memory_basis),
        "est_time_min": None if c.time_min is None else _time(c),
        "est_cost_usd": None if c.cost_usd is None else _cost(c),
        "scaling_efficiency": c.efficiency,
        "profiling_required": c.profiling_required,
        "reasons": c.reasons,
    }


def mint(c: Candidate, request_digest: str, planner_version: str, because: list[str],
         checkpoint_advice: tuple[int, str] | None = None) -> dict[str, Any]:
    """The ``StrategyPlan`` fields for the winning candidate ``c``; ``checkpoint_advice``
    (interval seconds, note) replaces the fixed interval when a measurement gave one."""
    checkpoint = None
    if c.workload_mode == "coordinated_training":
        checkpoint = {"backend": "pytorch_dcp", "interval_seconds": K.CHECKPOINT_INTERVAL_S, "note": CHECKPOINT_NOTE}
        if checkpoint_advice is not None:
            checkpoint["interval_seconds"], checkpoint["note"] = checkpoint_advice
    k = c.knobs
    return {
        "plan_id": f"pl_{request_digest}",
        "planner_version": planner_version,
        "workload_mode": c.workload_mode,
        "strategy_family": c.family,
        "launcher": c.launcher,
        "workers": c.workers,
        "gpus_per_worker": c.gpus_per_worker,
        "colocated": c.colocated,
        "precision": k.precision,
        "quantization": k.quantization,
        "peft": k.peft,
        "micro_batch_per_gpu": k.micro_batch_per_gpu,
        "grad_accum": k.grad_accum,
        "activation_checkpointing": k.activation_checkpointing,
        "offload": k.offload,
        "libraries": [{"name": n, "role": r, "purpose": p} for n, r, p in c.libraries],
        "checkpoint": checkpoint,
        "memory": _memory(c.memory, c.memory_basis),
        "est_time_min": _time(c),
        "est_cost_usd": _cost(c),
        "scaling_efficiency": c.efficiency,
        "profiling_required": c.profiling_required,
        "selected_because": because,
    }
