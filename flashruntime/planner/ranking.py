"""Ranking of feasible candidates per objective mode and the sentences
that explain the choice.

Missing numbers sort as +∞; ties fall to the simpler launch (a local process before
a coordinated one), then the name, so equal inputs always give the same order.
"""

from __future__ import annotations

import math

from flashruntime.planner import constants as K
from flashruntime.planner.candidate import Candidate
from flashruntime.planner.checks import exceeds
from flashruntime.planner.timing import duration_text

_INF = math.inf
_LOCAL_FAMILIES = ("single_gpu", "local_process", "cpu")
_FEASIBLE = ("feasible", "selected")  # Candidate.feasible
_BALANCED_HEAD = (
    f"objective balanced: fastest among candidates within {K.BALANCED_COST_SLACK - 1:.0%} of the cheapest "
    "estimated cost"
)


def _num(value: float | None) -> float:
    return _INF if value is None else value


def _tie(c: Candidate) -> tuple[int, str]:
    return (0 if c.family in _LOCAL_FAMILIES else 1, c.name)


def _headroom(c: Candidate) -> float:
    if c.memory is None or c.vram_gb is None:
        return -_INF  # unknown headroom ranks last among equals
    return c.vram_gb - c.memory.total_gb


def _reliable_key(c: Candidate) -> tuple:
    return (c.workers, c.knobs.offload != "none", c.knobs.quantization is not None, -_headroom(c), _tie(c))


def cheapest_cost(feasible: list[Candidate]) -> float | None:
    costs = [c.exact_cost for c in feasible if c.cost_usd is not None]  # exact: the band's floor
    return min(costs) if costs else None


def rank(candidates: list[Candidate], mode: str) -> list[Candidate]:
    """Feasible candidates, best first."""
    feasible = [c for c in candidates if c.status in _FEASIBLE]
    if mode == "cheapest":
        return sorted(feasible, key=lambda c: (_num(c.cost_usd), _num(c.time_min), c.workers, _tie(c)))
    if mode == "fastest":
        return sorted(feasible, key=lambda c: (_num(c.time_min), _num(c.cost_usd), c.workers, _tie(c)))
    if mode == "reliable":
        return sorted(feasible, key=_reliable_key)
    # balanced: within 10 % of the cheapest cost first, fastest among them; the rest by cost. Band
    # membership compares exact costs; the sort keys are the shown figures, so estimates equal to the
    # cent and minute fall through to fewer workers rather than to float noise.
    floor = cheapest_cost(feasible)

    def balanced_key(c: Candidate) -> tuple:
        cost = c.exact_cost
        in_band = floor is None or (cost is not None and not exceeds(cost, K.BALANCED_COST_SLACK * floor))
        if in_band:
            return (0, _num(c.time_min), _num(c.cost_usd), c.workers, _tie(c))
        return (1, _num(c.cost_usd), _num(c.time_min), c.workers, _tie(c))

    return sorted(feasible, key=balanced_key)


def objective_line(mode: str, ranked: list[Candidate]) -> str:
    if mode == "cheapest":
        return "objective cheapest: lowest estimated cost, then time, then fewest workers"
    if mode == "fastest":
        return "objective fastest: shortest estimated time, then cost, then fewest workers"
    if mode == "reliable":
        return "objective reliable: fewest workers, no offload, no quantisation, most memory headroom"
    floor = cheapest_cost(ranked)
    if floor is None:
        return "objective balanced: no cost estimates, so the shortest estimated time, then fewest workers"
    return f"{_BALANCED_HEAD} (${floor:.2f} -> <= ${K.BALANCED_COST_SLACK * floor:.2f})"


def runner_up_line(ranked: list[Candidate]) -> str:
    if len(ranked) < 2:
        return "no other feasible candidate"
    winner, second = ranked[0], ranked[1]
    return f"runner-up {second.name}: {_summary(second)} (selected: {_summary(winner)})"


def _summary(c: Candidate) -> str:
    time = "time unknown" if c.time_min is None else duration_text(c.time_min)
    cost = "cost unknown" if c.cost_usd is None else f"${c.cost_usd:.2f}"
    memory = "" if c.memory is None else f", {c.memory.total_gb:.1f} GB/GPU"
    return f"{time}, {cost}, {c.workers} worker(s){memory}"
