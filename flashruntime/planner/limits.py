"""Numbers the planner's float arithmetic can carry. The request models accept
any positive number, and wire models never tighten an accepted input, so the planner itself refuses
what it cannot model: ``unmodelable_input`` names a workload figure that is infinite, too
large for a float, or that overflows once scaled to its unit (``plan`` reports it as the
hint); ``apply_finite`` rejects a candidate whose estimates still overflow from finite inputs.
"""

from __future__ import annotations

import math

from flashruntime.planner.candidate import Candidate, Miss
from flashruntime.protocol.plan_v1alpha1 import PlanRequest

# Fields whose value is scaled to a unit before any arithmetic: parameters_b x 1e9 parameters, ...
_UNIT_SCALE = {"parameters_b": 1e9, "parameters_m": 1e6, "train_tokens_m": 1e6}
_LOG10_2 = math.log10(2)

# The request fields each estimate is computed from, per workload kind (named in a rejection).
_SOURCES = {
    "transformer_finetune": {
        "memory": "workload.parameters_b, hidden_size, num_layers, seq_len, micro_batch_per_gpu",
        "time": "workload.parameters_b, train_tokens_m, seq_len, micro_batch_per_gpu, grad_accum",
    },
    "pytorch_training": {
        "memory": "workload.parameters_m, activation_gb_per_gpu",
        "time": "workload.est_train_gpu_hours",
    },
    "independent_tasks": {"time": "workload.task_count, est_minutes_per_task"},
}


def unmodelable_input(request: PlanRequest) -> str | None:
    """A hint naming the first workload figure (or ``resources.gpus``) that no float can carry, else None.

    Resource capacities and objective limits may be infinite (no limit); a workload figure may not.
    """
    wl = request.workload
    checked = [(f"workload.{name}", name, getattr(wl, name)) for name in type(wl).model_fields]
    checked.append(("resources.gpus", "gpus", request.resources.gpus))
    for label, name, value in checked:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        try:
            number = float(value)
        except OverflowError:
            return _hint(label, _shown(value), "it is too large for a 64-bit float (at most about 1.8e308)")
        if not math.isfinite(number):
            return _hint(label, _shown(value), "it is not a finite number")
        scale = _UNIT_SCALE.get(name)
        if scale is not None and not math.isfinite(number * scale):
            return _hint(label, _shown(value), f"scaled to units (x {scale:g}) it overflows a 64-bit float")
    return None


def _hint(label: str, shown: str, why: str) -> str:
    return f"{label} = {shown} is beyond what the planner can model: {why}; give a realistic figure"


def _shown(value: float) -> str:
    if isinstance(value, int) and value.bit_length() > 1000:  # str() of it may exceed int_max_str_digits
        return f"a {int(value.bit_length() * _LOG10_2) + 1}-digit integer"
    return f"{value:g}" if isinstance(value, float) else str(value)


def apply_finite(c: Candidate, kind: str) -> None:
    """Infeasible when an estimate overflowed to infinity or NaN (finite but astronomically large
    inputs). The figure is dropped from the candidate, as JSON has no infinity, and the reason says
    which request fields it came from; this miss, not the overflowed arithmetic's, feeds the hint."""
    sources = _SOURCES.get(kind, {})
    bad: list[str] = []
    if c.memory is not None and not (math.isfinite(c.memory.total_gb) and math.isfinite(c.memory.cpu_offload_gb)):
        bad.append(_what(f"memory {c.memory.total_gb:.1f} GB/GPU", sources.get("memory")))
        c.memory = None
    if not (_finite(c.time_min) and _finite(c.time_exact)):
        bad.append(_what(f"time {c.exact_time} min", sources.get("time")))
        c.time_min = c.time_exact = None
    if not (_finite(c.cost_usd) and _finite(c.cost_exact)):
        bad.append(_what(f"cost ${c.exact_cost}", "the time x resources.hourly_cost_usd_per_gpu"))
        c.cost_usd = c.cost_exact = None
    if not _finite(c.efficiency):
        bad.append(_what(f"scaling efficiency {c.efficiency}", None))
        c.efficiency = None
    if bad:
        c.miss = None
        c.reject(
            "infeasible",
            f"estimate out of range: {'; '.join(bad)}; the request's figures are beyond what the planner can model",
            Miss(math.inf, "give realistic workload figures"),
        )


def _finite(value: float | None) -> bool:
    return value is None or math.isfinite(value)


def _what(figure: str, source: str | None) -> str:
    return figure if source is None else f"{figure} (from {source})"
