"""Verdict rules shared by every menu: the memory safety bands, the communication-bound
threshold, host-RAM limits and the objective's cost and deadline (SPEC §7.2, §7.3).

Each rule appends its arithmetic to the candidate's reasons and, when it rejects,
records how far off the candidate is and what would make it fit (for the hint).
"""

from __future__ import annotations

from flashruntime.planner import constants as K
from flashruntime.planner.candidate import Candidate, Memory, Miss
from flashruntime.protocol.plan_v1alpha1 import Objective


def memory_text(mem: Memory) -> str:
    parts = (
        f"weights {mem.weights_gb:.1f} + gradients {mem.gradients_gb:.1f} + optimizer {mem.optimizer_gb:.1f} + "
        f"activations {mem.activations_gb:.1f} + transient {mem.transient_gb:.1f} + overhead {mem.overhead_gb:.1f}"
    )
    return f"memory {mem.total_gb:.1f} GB/GPU = {parts}"


def fits(mem: Memory, vram_gb: float) -> bool:
    return mem.total_gb <= K.BAND_INFEASIBLE_ABOVE * vram_gb


def apply_memory_band(c: Candidate, mem: Memory, vram_gb: float, note: str = "") -> None:
    """Infeasible above 0.95 x VRAM; profiling required between 0.80 and 0.95; plain below."""
    c.memory = mem
    c.vram_gb = vram_gb
    share = mem.total_gb / vram_gb
    suffix = f" ({note})" if note else ""
    usable = K.BAND_INFEASIBLE_ABOVE * vram_gb
    if share > K.BAND_INFEASIBLE_ABOVE:
        needed = mem.total_gb / K.BAND_INFEASIBLE_ABOVE
        c.reject(
            "infeasible",
            f"{memory_text(mem)}{suffix} > {K.BAND_INFEASIBLE_ABOVE:.2f} x {vram_gb:g} GB = {usable:.1f} GB usable",
            Miss(share / K.BAND_INFEASIBLE_ABOVE, f"it needs GPUs with >= {needed:.1f} GB"),
        )
    elif share > K.BAND_PROFILE_ABOVE:
        c.profiling_required = True
        c.reasons.append(
            f"{memory_text(mem)}{suffix} = {share:.0%} of {vram_gb:g} GB: inside the "
            f"{K.BAND_PROFILE_ABOVE:.0%}-{K.BAND_INFEASIBLE_ABOVE:.0%} band, profile a few steps before the full run"
        )
    else:
        c.reasons.append(f"{memory_text(mem)}{suffix} = {share:.0%} of {vram_gb:g} GB")


def apply_host_ram(c: Candidate, host_gb: float, cpu_ram_gb: float, what: str) -> None:
    """Host-resident data must fit 80 % of the host's RAM."""
    usable = K.HOST_RAM_USABLE_FRACTION * cpu_ram_gb
    if host_gb > usable:
        needed = host_gb / K.HOST_RAM_USABLE_FRACTION
        c.reject(
            "infeasible",
            f"{what} {host_gb:.1f} GB > {K.HOST_RAM_USABLE_FRACTION:.2f} x {cpu_ram_gb:g} GB host RAM "
            f"= {usable:.1f} GB",
            Miss(host_gb / usable, f"it needs cpu_ram_gb >= {needed:.0f}"),
        )
    else:
        c.reasons.append(f"{what} {host_gb:.1f} GB <= {usable:.1f} GB ({K.HOST_RAM_USABLE_FRACTION:.0%} of host RAM)")


def apply_efficiency(c: Candidate, efficiency: float, comm_text: str) -> None:
    """Communication-bound below 0.5 (infeasible); a warning below 0.7."""
    c.efficiency = efficiency
    text = f"scaling efficiency {efficiency:.2f}: {comm_text}"
    if efficiency < K.EFFICIENCY_INFEASIBLE_BELOW:
        c.reject(
            "infeasible",
            f"communication-bound: {text} < {K.EFFICIENCY_INFEASIBLE_BELOW}",
            Miss(K.EFFICIENCY_INFEASIBLE_BELOW / max(efficiency, 1e-9), "it needs a faster interconnect"),
        )
    elif efficiency < K.EFFICIENCY_WARN_BELOW:
        c.reasons.append(f"warning: {text} < {K.EFFICIENCY_WARN_BELOW}, much of the time goes to communication")
    else:
        c.reasons.append(text)


def apply_objective(c: Candidate, objective: Objective) -> None:
    """Cost above ``max_cost_usd`` or time above ``deadline_minutes`` -> rejected_policy."""
    if objective.deadline_minutes is not None and c.time_min is not None:
        if c.time_min > objective.deadline_minutes:
            c.reject(
                "rejected_policy",
                f"time {c.time_min:.0f} min > deadline {objective.deadline_minutes:g} min",
                Miss(c.time_min / objective.deadline_minutes, f"deadline_minutes >= {c.time_min:.0f} would admit it"),
            )
    if objective.max_cost_usd is not None and c.cost_usd is not None:
        if c.cost_usd > objective.max_cost_usd:
            c.reject(
                "rejected_policy",
                f"cost ${c.cost_usd:.2f} > max_cost_usd ${objective.max_cost_usd:g}",
                Miss(c.cost_usd / objective.max_cost_usd, f"max_cost_usd >= {c.cost_usd:.2f} would admit it"),
            )
