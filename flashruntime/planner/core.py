"""The planning pipeline: digest the request, resolve model and GPU, run the
workload's candidate menu, rank, mint. Pure and deterministic; a request the planner
cannot resolve, or whose figures no float can carry, becomes a report with a hint, never an
exception.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from flashruntime.planner.candidate import Candidate
from flashruntime.planner.catalog_gpus import GpuFacts, resolve_gpu
from flashruntime.planner.hints import no_valid_strategy_hint
from flashruntime.planner.limits import apply_finite, unmodelable_input
from flashruntime.planner.menu_classical import classical_candidates
from flashruntime.planner.menu_finetune import finetune_candidates
from flashruntime.planner.menu_pytorch import pytorch_candidates
from flashruntime.planner.menu_tasks import task_candidates
from flashruntime.planner.minting import mint, verdict
from flashruntime.planner.ranking import objective_line, rank, runner_up_line
from flashruntime.planner.unplannable import UnplannableRequest
from flashruntime.planner.version import PLANNER_VERSION
from flashruntime.protocol.plan_v1alpha1 import (
    ClassicalML,
    IndependentTasks,
    PlanReport,
    PlanRequest,
    PyTorchTraining,
    TransformerFineTune,
)


def request_digest(request: PlanRequest) -> str:
    """First 16 hex chars of sha256(request JSON + planner version)."""
    return hashlib.sha256((request.model_dump_json() + PLANNER_VERSION).encode()).hexdigest()[:16]


def plan(request: PlanRequest | Mapping[str, Any]) -> PlanReport:
    """Plan ``request``: every candidate with its verdict, the selected plan (or a hint)."""
    if not isinstance(request, PlanRequest):
        request = PlanRequest.model_validate(request)  # a ValidationError propagates unwrapped
    digest = request_digest(request)
    warnings: list[str] = []
    try:
        candidates = _candidates(request, warnings)
        for candidate in candidates:
            apply_finite(candidate, request.workload.kind)
    except UnplannableRequest as exc:
        return PlanReport(
            planner_version=PLANNER_VERSION,
            request_digest=digest,
            warnings=warnings,
            no_valid_strategy_hint=str(exc),
        )
    mode = request.objective.mode
    ranked = rank(candidates, mode)
    selected = None
    hint = None
    if ranked:
        winner = ranked[0]
        winner.status = "selected"
        because = [*winner.reasons, objective_line(mode, ranked), runner_up_line(ranked)]
        selected = mint(winner, digest, PLANNER_VERSION, because)
    else:
        hint = no_valid_strategy_hint(candidates)
    return PlanReport.model_validate(
        {
            "planner_version": PLANNER_VERSION,
            "request_digest": digest,
            "selected": selected,
            "candidates": [verdict(c) for c in candidates],
            "warnings": warnings,
            "no_valid_strategy_hint": hint,
        }
    )


def _candidates(request: PlanRequest, warnings: list[str]) -> list[Candidate]:
    out_of_range = unmodelable_input(request)
    if out_of_range is not None:
        raise UnplannableRequest(out_of_range)
    wl, res, obj = request.workload, request.resources, request.objective
    if isinstance(wl, TransformerFineTune):
        return finetune_candidates(wl, res, obj, _gpu(request), warnings)
    if isinstance(wl, PyTorchTraining):
        return pytorch_candidates(wl, res, obj, _gpu(request), warnings)
    if isinstance(wl, ClassicalML):
        return classical_candidates(wl, res, obj, warnings)
    if isinstance(wl, IndependentTasks):
        gpu = _gpu(request) if wl.needs_gpu else None
        return task_candidates(wl, res, obj, gpu, warnings)
    raise UnplannableRequest(f"unsupported workload kind {getattr(wl, 'kind', type(wl).__name__)!r}")


def _gpu(request: PlanRequest) -> GpuFacts | None:
    return resolve_gpu(request.resources.gpu_type, request.resources.vram_gb)
