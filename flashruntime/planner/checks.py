"""Verdict rules shared by every menu: the memory safety bands, the communication-bound
threshold, host-RAM limits and the objective's cost and deadline.

Each rule appends its arithmetic to the candidate's reasons and, when it rejects,
records how far off the candidate is and what would make it fit (for the hint).
"""

from __future__ import annotations

import math

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
    """Cost above ``max_cost_usd`` or time above ``deadline_minutes`` -> rejected_policy.

    The exact figures are compared, not the rounded ones the report shows: 9.9992 min meets a
    9.9995 min deadline although it shows as 10.0 (``exceeds``).
    """
    deadline, minutes = objective.deadline_minutes, c.exact_time
    if deadline is not None and minutes is not None and exceeds(minutes, deadline):
        c.reject(
            "rejected_policy",
            f"time {_exceeding(minutes, deadline, 0)} min > deadline {deadline:g} min",
            Miss(minutes / deadline, f"deadline_minutes >= {_admitting(minutes, 0)} would admit it"),
        )
    budget, cost = objective.max_cost_usd, c.exact_cost
    if budget is not None and cost is not None and exceeds(cost, budget):
        c.reject(
            "rejected_policy",
            f"cost ${_exceeding(cost, budget, 2)} > max_cost_usd ${budget:g}",
            Miss(cost / budget, f"max_cost_usd >= {_admitting(cost, 2)} would admit it"),
        )


# Relative slack of a limit check: float noise is no excess (3 x 0.1 min = 0.30000000000000004 min
# meets a 0.3 min deadline), while any difference a figure could show (4 decimals at 1e4) still counts.
_FLOAT_SLACK = 1e-9


def exceeds(value: float, limit: float) -> bool:
    """Whether an exact estimate is over a limit, float noise aside."""
    return value > limit + abs(limit) * _FLOAT_SLACK


_MAX_PLACES = 12
_PLAIN_BELOW = 1e15  # from here on a float has no fractional digits to show; repr() is exact and short


def _exceeding(value: float, limit: float, places: int) -> str:
    """``value`` (> ``limit``) to ``places`` decimals, or to more where rounding would hide the excess."""
    if math.isfinite(value) and abs(value) < _PLAIN_BELOW:
        for digits in range(places, _MAX_PLACES):
            text = f"{value:.{digits}f}"
            if float(text) > limit:
                return text
    return repr(value)


def _admitting(value: float, places: int) -> str:
    """The figure to ``places`` decimals (or more) rounded up, so that a limit of it admits ``value``."""
    if math.isfinite(value) and abs(value) < _PLAIN_BELOW:
        for digits in range(places, _MAX_PLACES):
            scale = 10**digits
            text = f"{math.ceil(value * scale) / scale:.{digits}f}"
            if float(text) >= value:
                return text
    return repr(value)
