"""Text rendering of a ``PlanReport`` (SPEC §7.6): the selected plan (or NO VALID
STRATEGY with the hint), every candidate with its verdict and arithmetic, the notes,
and a footer with planner version and request digest.
"""

from __future__ import annotations

from flashruntime.planner.candidate import STATUS_ORDER
from flashruntime.protocol.plan_v1alpha1 import CandidateVerdict, MemoryBreakdown, PlanReport, StrategyPlan

STATUS_LABELS = {
    "selected": "SELECTED",
    "feasible": "feasible (not chosen)",
    "infeasible": "INFEASIBLE",
    "rejected_policy": "rejected (constraint)",
    "rejected_dominated": "rejected (dominated)",
}
_LABEL_WIDTH = max(len(label) for label in STATUS_LABELS.values())


def _memory_line(mem: MemoryBreakdown) -> str:
    text = (
        f"{mem.total_gb:.1f} GB/GPU = weights {mem.weights_gb:.1f} + gradients {mem.gradients_gb:.1f} + "
        f"optimizer {mem.optimizer_gb:.1f} + activations {mem.activations_gb:.1f} + transient "
        f"{mem.transient_gb:.1f} + overhead {mem.overhead_gb:.1f}"
    )
    if mem.cpu_offload_gb:
        text += f"; {mem.cpu_offload_gb:.1f} GB/GPU offloaded to host RAM"
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


def _selected_block(p: StrategyPlan) -> list[str]:
    gpus = f"{p.gpus_per_worker} GPU" if p.gpus_per_worker else "no GPU"
    lines = [
        f"SELECTED PLAN {p.plan_id}",
        f"  mode        {p.workload_mode}",
        f"  strategy    {_strategy(p)}",
        f"  topology    {p.workers} worker(s) x {gpus} each ({'one host' if p.colocated else 'across hosts'})",
        f"  launcher    {p.launcher}",
        f"  knobs       {_knobs(p)}",
    ]
    if p.memory is not None:
        lines.append(f"  memory      {_memory_line(p.memory)}")
    lines.append(
        "  time        " + ("no estimate" if p.est_time_min is None else f"{p.est_time_min.value:.0f} min "
                            f"({p.est_time_min.value / 60:.1f} h, {p.est_time_min.basis})")
    )
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
        lines.extend(f"    - {lib.name} ({lib.role}){': ' + lib.purpose if lib.purpose else ''}" for lib in p.libraries)
    if p.selected_because:
        lines.append("  because")
        lines.extend(f"    - {line}" for line in p.selected_because)
    return lines


def _candidate_lines(c: CandidateVerdict) -> list[str]:
    label = STATUS_LABELS.get(c.status, c.status)
    figures = []
    if c.memory is not None:
        figures.append(f"{c.memory.total_gb:.1f} GB/GPU")
    if c.est_time_min is not None:
        figures.append(f"{c.est_time_min.value:.0f} min")
    if c.est_cost_usd is not None:
        figures.append(f"${c.est_cost_usd.value:.2f}")
    if c.profiling_required:
        figures.append("profile first")
    summary = f" - {', '.join(figures)}" if figures else ""
    head = f"  {label:<{_LABEL_WIDTH}}  {c.name} [{c.strategy_family}, {c.workers} worker(s)]{summary}"
    return [head, *(f"      {reason}" for reason in c.reasons)]


def _order(c: CandidateVerdict) -> tuple[int, int, str]:
    rank = STATUS_ORDER.index(c.status) if c.status in STATUS_ORDER else len(STATUS_ORDER)
    return (rank, c.workers, c.name)


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
    for c in sorted(report.candidates, key=_order):
        lines.extend(_candidate_lines(c))
    if report.warnings:
        lines.append("")
        lines.append("Notes")
        lines.extend(f"  - {w}" for w in report.warnings)
    lines.append("")
    lines.append(f"planner {report.planner_version} · request {report.request_digest}")
    return "\n".join(lines) + "\n"


render = render_report
