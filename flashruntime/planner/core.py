"""The planning pipeline: digest the request, resolve model and GPU, run the
workload's candidate menu, take measured figures in, rank, mint. Without measurements it is
pure and deterministic; a request the planner cannot resolve, or whose figures no float can
carry, becomes a report with a hint, never an exception. ``profile=True`` runs the profiler
(the one step that does I/O); a ledger is read, never written.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from flashruntime.planner.candidate import MEASURED_TIME_NOTE, NO_TIME_NOTE, Candidate
from flashruntime.planner.catalog_gpus import GpuFacts, resolve_gpu
from flashruntime.planner.hints import no_valid_strategy_hint
from flashruntime.planner.limits import apply_finite, unmodelable_input
from flashruntime.planner.measured import apply_measurement, matches, unused_note
from flashruntime.planner.menu_classical import classical_candidates
from flashruntime.planner.menu_cpu import NO_CPU_TIME_NOTE, cpu_candidates
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

if TYPE_CHECKING:
    from flashruntime.profiling import CalibrationLedger, ProfileCache
    from flashruntime.protocol.profile_v1alpha1 import ProfileResult


def request_digest(request: PlanRequest) -> str:
    """First 16 hex chars of sha256(request JSON + planner version)."""
    return hashlib.sha256((request.model_dump_json() + PLANNER_VERSION).encode()).hexdigest()[:16]


def plan(
    request: PlanRequest | Mapping[str, Any],
    *,
    profile: bool | ProfileResult | None = None,
    command: str | list[str] | None = None,
    steps: int | None = None,
    budget_seconds: float = 300.0,
    cache: ProfileCache | None = None,
    ledger: CalibrationLedger | None = None,
    mtbf_s: float | None = None,
) -> PlanReport:
    """Plan ``request``: every candidate with its verdict, the selected plan (or a hint).

    Measured figures replace static ones on the candidate they were measured on:
    ``profile`` is a ``ProfileResult``, or True to measure ``command`` now with
    ``LocalProfiler`` within ``budget_seconds`` (through ``cache`` when given); ``ledger``
    supplies finished runs' medians (basis ``ledger``, trusted over a profile). ``steps``
    (optimizer steps of the full run) turns a measured step time into time and cost when the
    request does not fix a step count. A measured checkpoint cost and a failure rate
    (``mtbf_s``, else the ledger's observed one) give the Young/Daly checkpoint interval.
    A profile that fails leaves the figures static and says why in the report's notes.
    """
    if not isinstance(request, PlanRequest):
        request = PlanRequest.model_validate(request)  # a ValidationError propagates unwrapped
    digest = request_digest(request)
    warnings: list[str] = []
    measurements = _measurements(request, profile, command, budget_seconds, cache, warnings)
    try:
        candidates = _candidates(request, warnings)
        for candidate in candidates:
            apply_finite(candidate, request.workload.kind)
        measured = _take_measurements(request, candidates, measurements, ledger, digest, steps, warnings)
        _one_time_line(candidates, warnings)
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
        advice = _checkpoint_advice(measured.get(id(winner)), ledger, mtbf_s, warnings)
        selected = mint(winner, digest, PLANNER_VERSION, because, advice)
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
        if res.gpus == 0:
            return cpu_candidates(wl, res, warnings)
        return pytorch_candidates(wl, res, obj, _gpu(request), warnings)
    if isinstance(wl, ClassicalML):
        return classical_candidates(wl, res, obj, warnings)
    if isinstance(wl, IndependentTasks):
        gpu = _gpu(request) if wl.needs_gpu else None
        return task_candidates(wl, res, obj, gpu, warnings)
    raise UnplannableRequest(f"unsupported workload kind {getattr(wl, 'kind', type(wl).__name__)!r}")


def _gpu(request: PlanRequest) -> GpuFacts | None:
    return resolve_gpu(request.resources.gpu_type, request.resources.vram_gb)


def _measurements(request: PlanRequest, profile: Any, command: Any, budget_seconds: float,
                  cache: Any, warnings: list[str]) -> list[ProfileResult]:
    if profile is None or profile is False:
        return []
    if profile is not True:
        return [profile]
    from flashruntime.errors import InvalidProfileRequest, ProfileError
    from flashruntime.profiling import LocalProfiler, profile_key

    if command is None:
        raise InvalidProfileRequest(
            "profile=True measures a command: pass command='torchrun ... train.py' (or a ProfileResult as profile=)"
        )
    profiler = LocalProfiler(command)
    key = profile_key(request, None, profiler.command)
    cached = None if cache is None else cache.get(key)
    if cached is not None:
        warnings.append(f"profile of {profiler.command!r} taken from the profile cache")
        return [cached]
    try:
        result = profiler.profile(request, None, budget_seconds)
    except ProfileError as exc:
        warnings.append(f"profile failed, figures stay static: {exc}")
        return []
    if cache is not None:
        cache.put(key, result)
    return [result]


def _take_measurements(request: PlanRequest, candidates: list[Candidate], measurements: list[Any], ledger: Any,
                       digest: str, steps: int | None, warnings: list[str]) -> dict[int, Any]:
    """Apply the most trusted measurement of each candidate (ledger over profile); returns them by candidate."""
    applied: dict[int, Any] = {}
    for c in candidates:
        chosen = None
        if ledger is not None:
            from flashruntime.profiling.calibration import plan_key

            chosen = ledger.figures(plan_key(f"pl_{digest}", c.family, c.workers), strategy_family=c.family,
                                    workers=c.workers)
        if chosen is None:
            chosen = next((m for m in measurements if matches(c, m)), None)
        if chosen is not None:
            apply_measurement(c, chosen, request, request.objective, steps)
            applied[id(c)] = chosen
    for m in measurements:
        if not any(matches(c, m) for c in candidates):
            warnings.append(unused_note(m, candidates))
    return applied


def _one_time_line(candidates: list[Candidate], warnings: list[str]) -> None:
    """Once every figure is in, say one thing about time: when some candidate has a time, the
    others' time is unknown (not "no estimate") and a note that a missing field leaves no time
    says that only the measured figures have one; CPU plans without any time say so plainly."""
    if any(c.time_min is not None for c in candidates):
        for c in candidates:
            c.call_time_unknown()
        warnings[:] = [w[: -len(NO_TIME_NOTE)] + MEASURED_TIME_NOTE if w.endswith(NO_TIME_NOTE) else w
                       for w in warnings]
    elif any(c.on_cpu for c in candidates):
        warnings.append(NO_CPU_TIME_NOTE)


def _checkpoint_advice(measured: Any, ledger: Any, mtbf_s: float | None,
                       warnings: list[str]) -> tuple[int, str] | None:
    if measured is None or measured.checkpoint_save_s is None:
        return None
    source = "stated MTBF"
    if mtbf_s is None and ledger is not None:
        mtbf_s, source = ledger.observed_mtbf_s(), "failure rate observed in the ledger"
    if mtbf_s is None:
        warnings.append("checkpoint interval not advised: no failure rate (give mtbf_s, or record runs in a ledger)")
        return None
    from flashruntime.profiling.advice import checkpoint_advice

    advice = checkpoint_advice(measured.checkpoint_save_s, mtbf_s,
                               source=f"C {measured.basis}, {source}")
    return max(1, round(advice.interval_s)), "Young/Daly: " + advice.line()
