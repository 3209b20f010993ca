"""Measured figures in a plan: a profile (basis ``profiled``) or finished runs' medians
(basis ``ledger``) replace the static figures of the candidate they were measured on, and
each replaced figure says how far the static estimate was from the measurement. A step time
measured on the CPU is of the ``cpu`` device class whatever the run was labelled, is marked
"profiled on the CPU", and never stands for a GPU candidate's. Pure.
"""

from __future__ import annotations

from flashruntime.planner import constants as K
from flashruntime.planner import timing
from flashruntime.planner.candidate import CPU_FAMILIES, Candidate, Miss
from flashruntime.planner.checks import apply_host_ram, apply_objective
from flashruntime.protocol.plan_v1alpha1 import Objective, PlanRequest, TransformerFineTune
from flashruntime.protocol.profile_v1alpha1 import ProfileResult

__all__ = ["ON_THE_CPU", "apply_measurement", "basis_label", "matches", "measured_family", "measured_on_cpu",
           "run_steps", "unused_note"]

ON_THE_CPU = "profiled on the CPU"


def measured_on_cpu(measured: ProfileResult) -> bool:
    """Whether the profiled ranks ran on the CPU (``device`` ``cpu``; None: not recorded)."""
    return measured.device is not None and measured.device.split(":")[0] == "cpu"


def measured_family(measured: ProfileResult) -> str | None:
    """The strategy family a measurement is of: a CPU run is ``cpu`` (one process) or ``cpu_ddp``,
    even when it was labelled with a GPU family."""
    if measured_on_cpu(measured) and measured.strategy_family not in CPU_FAMILIES:
        return "cpu" if measured.workers == 1 else "cpu_ddp"
    return measured.strategy_family


def matches(c: Candidate, measured: ProfileResult) -> bool:
    """Whether ``measured`` is of candidate ``c`` (same strategy family and worker count)."""
    return measured_family(measured) == c.family and measured.workers == c.workers


def basis_label(basis: str, on_cpu: bool) -> str:
    """How a figure's basis reads: ``profiled on the CPU`` for a CPU candidate's profile."""
    return ON_THE_CPU if on_cpu and basis == "profiled" else basis


def unused_note(measured: ProfileResult, candidates: list[Candidate]) -> str:
    """The report's note for a measurement that is of no candidate of the request."""
    if measured_on_cpu(measured) and not any(c.on_cpu for c in candidates):
        return (f"the profile ran on the CPU ({measured.workers} process(es), {measured.step_time_s:.3g} s/step "
                f"{ON_THE_CPU}): it measures none of this request's GPU candidates, so their figures stay static; "
                "set resources.gpus = 0 for CPU plans, or profile on a GPU")
    return (f"the profile measured {measured_family(measured)} on {measured.workers} worker(s), which is not a "
            "candidate of this request; its figures were not used")


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
    label = basis_label(basis, c.on_cpu)
    source = f" (runs {', '.join(measured.sources)})" if measured.sources else ""
    if c.on_cpu and measured.host_ram_gb is not None:
        apply_host_ram(c, measured.host_ram_gb * c.workers, request.resources.cpu_ram_gb,
                       f"host RAM {label}{source}: {c.workers} process(es) x {measured.host_ram_gb:.2f} GB peak "
                       "resident =")
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
        c.reasons.append(f"step time {measured.step_time_s:.3g} s {label}{source}; no step count, so no measured "
                         "time (give steps= or --steps)")
        return
    exact = total * measured.step_time_s / 60
    static_min = c.exact_time
    minutes = timing.shown_minutes(exact)
    text = f"time {timing.duration_text(minutes)} = {total} steps x {measured.step_time_s:.3g} s/step {label}{source}"
    if static_min is not None:
        text += f"; {_off(exact, static_min)}"
    c.set_time(minutes, text, exact, basis)
    price = request.resources.hourly_cost_usd_per_gpu
    if price is not None and not c.on_cpu:  # a per-GPU price says nothing of a CPU run's cost
        cost, cost_text, cost_exact = timing.cost_usd(minutes, c.workers * max(1, c.gpus_per_worker), price, exact)
        c.cost_usd, c.cost_note, c.cost_exact, c.cost_basis = cost, cost_text, cost_exact, basis
        c.reasons.append(cost_text)
    if c.feasible:
        apply_objective(c, objective)
