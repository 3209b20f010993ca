"""The "no valid strategy" hint: name the nearest miss among the rejected
candidates and say what would make it fit.

Nearest = the smallest miss ratio (how many times over its limit a candidate is).
"""

from __future__ import annotations

from flashruntime.planner.candidate import Candidate, Miss


def no_valid_strategy_hint(candidates: list[Candidate]) -> str:
    if not candidates:
        return "no candidate strategies for this request"
    missed: list[tuple[Miss, Candidate]] = [(c.miss, c) for c in candidates if c.miss is not None]
    if not missed:
        names = ", ".join(c.name for c in candidates)
        return f"no valid strategy among {names}; see each candidate's reasons"
    miss, nearest = min(missed, key=lambda pair: (pair[0].ratio, pair[1].workers, pair[1].name))
    return f"no valid strategy: the nearest miss is {nearest.name} ({nearest.status}): {miss.reason}; {miss.fix}"
