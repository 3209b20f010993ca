"""Measured figures in a plan: a profile (basis ``profiled``) or finished runs' medians
(basis ``ledger``) replace the static figures of the candidate they were measured on, and
each replaced figure says how far the static estimate was from the measurement. Pure.
"""

from __future__ import annotations

from flashruntime.planner import constants as K
from flashruntime.planner import timing
from flashruntime.planner.candidate import Candidate, Miss
from flashruntime.planner.checks import apply_objective
from flashruntime.protocol.plan_v1alpha1 import Objective, PlanRequest, TransformerFineTune
from flashruntime.protocol.profile_v1alpha1 import ProfileResult

__all__ = ["apply_measurement", "matches", "run_steps"]


def matches(c: Candidate, measured: ProfileResult) -> bool:
    """Whether ``measured`` is of candidate ``c`` (same strategy family and worker count)."""
    return measured.strategy_family == c.family and measured.workers == c.workers


def run_steps(request: PlanRequest, workers: int, steps: int | None) -> int | None:
    """Optimizer steps of the full run: ``steps`` when given, else a fine-tune's training tokens
    over the tokens of one step (sequence x micro-batch x grad accum x workers)."""
    if steps is not None:
        return steps
    wl = request.workload
    if isinstance(wl, TransformerFineTune) and wl.train_tokens_m is not None:
        per_step = wl.seq_len * wl.micro_batch_per_gpu * wl.grad_accum * workers
        return max(1, round(wl.train_tokens_m * 1e6 / per_step))
    return None


def _off(measured: float, static: float) -> str:
    if static <= 0:
        return "no static figure to compare"
    return f"static estimate {static:.3g}, measured {(measured - static) / static:+.0%} off"


def apply_measurement(c: Candidate, measured: ProfileResult, request: PlanRequest, objective: Objective,
                      steps: int | None) -> None:
    """Replace ``c``'s memory, time and cost by what ``measured`` gives, re-apply the memory
    limit and the objective's deadline and budget, and add the comparison to its reasons."""
    basis = measured.basis
    source = f" (runs {', '.join(measured.sources)})" if measured.sources else ""
    if measured.peak_vram_gb is not None and c.memory is not None and c.vram_gb is not None:
        static = c.memory.total_gb
        c.memory.total_gb = measured.peak_vram_gb
        c.memory_basis = basis
        c.profiling_required = False  # measured, not estimated: the band's warning is answered
        c.reasons.append(f"memory {measured.peak_vram_gb:.1f} GB/GPU {basis}{source}; {_off(measured.peak_vram_gb, static)}")
        usable = K.BAND_INFEASIBLE_ABOVE * c.vram_gb
        if measured.peak_vram_gb > usable:
            c.reject("infeasible", f"{basis} memory {measured.peak_vram_gb:.1f} GB > {usable:.1f} GB usable",
                     Miss(measured.peak_vram_gb / usable, f"it needs GPUs with >= {measured.peak_vram_gb / 0.95:.1f} GB"))
    total = run_steps(request, c.workers, steps)
    if total is None:
        c.reasons.append(f"step time {measured.step_time_s:.3g} s {basis}{source}; no step count, so no measured "
                         "time (give steps= or --steps)")
        return
    exact = total * measured.step_time_s / 60
    static_min = c.exact_time
    minutes = round(exact, 2)
    text = f"time {minutes:.0f} min = {total} steps x {measured.step_time_s:.3g} s/step {basis}{source}"
    if static_min is not None:
        text += f"; {_off(exact, static_min)}"
    c.time_min, c.time_note, c.time_exact, c.time_basis = minutes, text, exact, basis
    c.reasons.append(text)
    price = request.resources.hourly_cost_usd_per_gpu
    if price is not None:
        cost, cost_text, cost_exact = timing.cost_usd(minutes, c.workers * max(1, c.gpus_per_worker), price, exact)
        c.cost_usd, c.cost_note, c.cost_exact, c.cost_basis = cost, cost_text, cost_exact, basis
        c.reasons.append(cost_text)
    if c.feasible:
        apply_objective(c, objective)
