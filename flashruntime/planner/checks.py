"""Verdict rules shared by every menu: the memory safety bands, the communication-bound
threshold, host-RAM limits and the objective's cost and deadline (SPEC §7.2, §7.3).

Each rule appends its arithmetic to the candidate's reasons and, when it rejects,
records how far off the candidate is and what would make it fit (for the hint).
"""

from __future__ import annotations

from flashruntime.planner import constants as K
from flashruntime.planner.candidate import Candidate, Memory, Miss
from flashruntime.protocol.plan_v1alpha1 import Objective

# %-formatting renders floats exactly as the f-string specs do (``:.0%`` is ``%.0f`` of 100 x the
# value, then "%"), in one C call: these sentences are built for every candidate.
_MEMORY_TEXT = (
    "memory %.1f GB/GPU = weights %.1f + gradients %.1f + optimizer %.1f + activations %.1f + transient %.1f + "
    "overhead %.1f%s"
)
_MEMORY_SHARE_TEXT = _MEMORY_TEXT + " = %.0f%% of %s GB"
_OF_HOST_RAM = f" ({K.HOST_RAM_USABLE_FRACTION:.0%} of host RAM)"
_PROFILE_BAND = (
    f": inside the {K.BAND_PROFILE_ABOVE:.0%}-{K.BAND_INFEASIBLE_ABOVE:.0%} band, "
    "profile a few steps before the full run"
)


class MemoryBand:
    """The safety bands of one GPU size, with the VRAM-only parts of their sentences built once
    per request rather than once per candidate. A memory estimate fits when its total is at or
    under ``usable_gb`` (0.95 x VRAM)."""

    __slots__ = ("_over", "_vram_text", "usable_gb", "vram_gb")

    def __init__(self, vram_gb: float) -> None:
        self.vram_gb = vram_gb
        self.usable_gb = usable = K.BAND_INFEASIBLE_ABOVE * vram_gb
        self._over = f" > {K.BAND_INFEASIBLE_ABOVE:.2f} x {vram_gb:g} GB = {usable:.1f} GB usable"
        self._vram_text = f"{vram_gb:g}"

    def apply(self, c: Candidate, mem: Memory, note: str = "") -> None:
        """Infeasible above 0.95 x VRAM; profiling required between 0.80 and 0.95; plain below."""
        vram_gb = self.vram_gb
        c.memory = mem
        c.vram_gb = vram_gb
        share = mem.total_gb / vram_gb
        figures = (
            mem.total_gb,
            mem.weights_gb,
            mem.gradients_gb,
            mem.optimizer_gb,
            mem.activations_gb,
            mem.transient_gb,
            mem.overhead_gb,
            f" ({note})" if note else "",
        )
        if share > K.BAND_INFEASIBLE_ABOVE:
            needed = mem.total_gb / K.BAND_INFEASIBLE_ABOVE
            c.reject(
                "infeasible",
                _MEMORY_TEXT % figures + self._over,
                Miss(share / K.BAND_INFEASIBLE_ABOVE, f"it needs GPUs with >= {needed:.1f} GB"),
            )
        elif share > K.BAND_PROFILE_ABOVE:
            c.profiling_required = True
            c.reasons.append(_MEMORY_SHARE_TEXT % (*figures, share * 100, self._vram_text) + _PROFILE_BAND)
        else:
            c.reasons.append(_MEMORY_SHARE_TEXT % (*figures, share * 100, self._vram_text))


def apply_memory_band(c: Candidate, mem: Memory, vram_gb: float, note: str = "") -> None:
    """Infeasible above 0.95 x VRAM; profiling required between 0.80 and 0.95; plain below."""
    MemoryBand(vram_gb).apply(c, mem, note)


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
        c.reasons.append("%s %.1f GB <= %.1f GB%s" % (what, host_gb, usable, _OF_HOST_RAM))


def apply_efficiency(c: Candidate, efficiency: float, text: str) -> None:
    """Communication-bound below 0.5 (infeasible); a warning below 0.7. ``text`` is the sentence
    ``scaling efficiency <e>: <communication arithmetic>`` (``comms.Link.step``)."""
    c.efficiency = efficiency
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
