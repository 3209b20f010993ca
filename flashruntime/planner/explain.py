"""Text rendering of a ``PlanReport``: the selected plan (or NO VALID
STRATEGY with the hint), every candidate with its verdict and arithmetic, the notes,
and a footer with planner version and request digest.
"""

from __future__ import annotations

from flashruntime.planner.candidate import CPU_FAMILIES, STATUS_ORDER
from flashruntime.planner.measured import basis_label
from flashruntime.planner.timing import duration_text
from flashruntime.protocol.plan_v1alpha1 import CandidateVerdict, Estimate, MemoryBreakdown, PlanReport, StrategyPlan

STATUS_LABELS = {
    "selected": "SELECTED",
    "feasible": "feasible (not chosen)",
    "infeasible": "INFEASIBLE",
    "rejected_policy": "rejected (constraint)",
    "rejected_dominated": "rejected (dominated)",
}
_LABEL_WIDTH = max(len(label) for label in STATUS_LABELS.values())


_MEMORY_LINE = (
    "%.1f GB/GPU = weights %.1f + gradients %.1f + optimizer %.1f + activations %.1f + transient %.1f + overhead %.1f"
)


def _memory_line(mem: MemoryBreakdown) -> str:
    # %-formatting renders floats exactly as the ``:.1f`` spec does, in one call.
    text = _MEMORY_LINE % (
        mem.total_gb,
        mem.weights_gb,
        mem.gradients_gb,
        mem.optimizer_gb,
        mem.activations_gb,
        mem.transient_gb,
        mem.overhead_gb,
    )
    if mem.cpu_offload_gb:
        text += "; %.1f GB/GPU offloaded to host RAM" % mem.cpu_offload_gb
    return f"{text} ({mem.basis})"


def _strategy(p: StrategyPlan) -> str:
    extras = [x for x in (p.peft, p.quantization) if x]
    return " + ".join([p.strategy_family, *extras])


def _knobs(p: StrategyPlan) -> str:
    parts = []
    if p.precision:
        parts.append(f"precision {p.precision}")
    if p.micro_batch_per_gpu is not None:
        parts.append(f"micro-batch {p.micro_batch_per_gpu}/GPU")
    if p.grad_accum is not None:
        parts.append(f"grad accum {p.grad_accum}")
    if p.activation_checkpointing is not None:
        parts.append(f"activation checkpointing {'on' if p.activation_checkpointing else 'off'}")
    parts.append(f"offload {p.offload}")
    return ", ".join(parts)


def _topology(p: StrategyPlan) -> str:
    where = "one host" if p.colocated else "across hosts"
    if p.strategy_family in CPU_FAMILIES:
        return f"{p.workers} process(es) on the CPU ({where})"
    gpus = f"{p.gpus_per_worker} GPU" if p.gpus_per_worker else "no GPU"
    return f"{p.workers} worker(s) x {gpus} each ({where})"


def _time(t: Estimate | None, family: str) -> str:
    """``96 min (1.6 h, static)``; under a minute in seconds, ``7.25 s (profiled on the CPU)``."""
    if t is None:
        return "no estimate"
    label = basis_label(t.basis, family in CPU_FAMILIES)
    if t.value < 1:
        return f"{duration_text(t.value)} ({label})"
    return f"{t.value:.0f} min ({t.value / 60:.1f} h, {label})"


def _selected_block(p: StrategyPlan) -> list[str]:
    lines = [
        f"SELECTED PLAN {p.plan_id}",
        f"  mode        {p.workload_mode}",
        f"  strategy    {_strategy(p)}",
        f"  topology    {_topology(p)}",
        f"  launcher    {p.launcher}",
        f"  knobs       {_knobs(p)}",
    ]
    if p.memory is not None:
        lines.append(f"  memory      {_memory_line(p.memory)}")
    lines.append("  time        " + _time(p.est_time_min, p.strategy_family))
    lines.append(
        "  cost        " + ("no estimate" if p.est_cost_usd is None else f"${p.est_cost_usd.value:.2f} "
                            f"({p.est_cost_usd.basis})")
    )
    if p.scaling_efficiency is not None:
        lines.append(f"  scaling     efficiency {p.scaling_efficiency:.2f}")
    if p.checkpoint is not None:
        ck = p.checkpoint
        lines.append(f"  checkpoint  {ck.backend} every {ck.interval_seconds} s: {ck.note}")
    if p.profiling_required:
        lines.append(
            "  WARNING     profiling required: the memory estimate is within 80-95 % of VRAM; "
            "run a few steps and check the peak before the full run"
        )
    if p.libraries:
        lines.append("  libraries")
        lines.extend(
            [f"    - {lib.name} ({lib.role}): {lib.purpose}" if lib.purpose else f"    - {lib.name} ({lib.role})"
             for lib in p.libraries]
        )
    if p.selected_because:
        lines.append("  because")
        lines.extend(["    - " + line for line in p.selected_because])
    return lines


# Labels padded to a common width, and each status's place in the list (unknown statuses last).
_PADDED_LABELS = {status: f"{label:<{_LABEL_WIDTH}}" for status, label in STATUS_LABELS.items()}
_STATUS_RANK = {status: rank for rank, status in enumerate(STATUS_ORDER)}
_REASON_BREAK = "\n      "


def _candidate_lines(c: CandidateVerdict) -> str:
    """The candidate's head line and its indented reasons, as one block of lines."""
    label = _PADDED_LABELS.get(c.status)
    if label is None:
        label = f"{STATUS_LABELS.get(c.status, c.status):<{_LABEL_WIDTH}}"
    figures = []
    on_cpu = c.strategy_family in CPU_FAMILIES
    if c.memory is not None:
        figures.append("%.1f GB/GPU" % c.memory.total_gb + _basis(c.memory.basis))
    if c.est_time_min is not None:
        figures.append(duration_text(c.est_time_min.value) + _basis(c.est_time_min.basis, on_cpu))
    if c.est_cost_usd is not None:
        figures.append("$%.2f" % c.est_cost_usd.value + _basis(c.est_cost_usd.basis))
    if c.profiling_required:
        figures.append("profile first")
    head = "  %s  %s [%s, %s worker(s)]%s" % (
        label, c.name, c.strategy_family, c.workers, " - " + ", ".join(figures) if figures else ""
    )
    if not c.reasons:
        return head
    return head + _REASON_BREAK + _REASON_BREAK.join(c.reasons)


def _basis(basis: str, on_cpu: bool = False) -> str:
    """A measured figure is marked; a static one (the usual case) is not."""
    return "" if basis == "static" else f" ({basis_label(basis, on_cpu)})"


def _order(c: CandidateVerdict) -> tuple[int, int, str]:
    return (_STATUS_RANK.get(c.status, len(STATUS_ORDER)), c.workers, c.name)


def render_report(report: PlanReport) -> str:
    """The human-readable report: plan, candidates, notes, footer."""
    lines: list[str] = []
    if report.selected is not None:
        lines.extend(_selected_block(report.selected))
    else:
        lines.append("NO VALID STRATEGY")
        lines.append(f"  {report.no_valid_strategy_hint or 'no candidate fits the request'}")
    lines.append("")
    lines.append(f"Candidates evaluated ({len(report.candidates)}):")
    lines.extend([_candidate_lines(c) for c in sorted(report.candidates, key=_order)])
    if report.warnings:
        lines.append("")
        lines.append("Notes")
        lines.extend(["  - " + w for w in report.warnings])
    lines.append("")
    lines.append(f"planner {report.planner_version} · request {report.request_digest}")
    return "\n".join(lines) + "\n"


render = render_report
