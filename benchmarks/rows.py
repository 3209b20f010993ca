"""Result rows of the ``bench_v1`` file: measured samples in, summary statistics out.

Every figure in a row is computed here from samples measured in this run; only a
row's ``target`` is copied in (from ``benchmarks.targets``, with its reason). Scenarios build rows
with ``measured_row`` or ``skipped_row`` and never write numbers by hand.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

Op = Literal["<=", ">=", "=="]


@dataclass(frozen=True)
class Target:
    """What a row is asked to hold: ``value`` compared with ``op``; ``source`` says why.

    ``unit == "x"`` means the target applies to the row's ratio (metric / comparator);
    any other unit means it applies to the row's median itself (an absolute target).
    """

    op: Op
    value: float
    unit: str
    source: str

    def as_dict(self) -> dict[str, Any]:
        return {"op": self.op, "value": self.value, "unit": self.unit, "source": self.source}

    def holds(self, observed: float) -> bool:
        if self.op == "<=":
            return observed <= self.value
        if self.op == ">=":
            return observed >= self.value
        return observed == self.value


def quantile(samples: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile, q in [0, 1]."""
    ordered = sorted(samples)
    if not ordered:
        raise ValueError("quantile of no samples")
    position = q * (len(ordered) - 1)
    lower = int(position)
    upper = min(lower + 1, len(ordered) - 1)
    return ordered[lower] + (ordered[upper] - ordered[lower]) * (position - lower)


def summarize(samples: Sequence[float]) -> dict[str, float]:
    if not samples:
        raise ValueError("a measured row needs at least one sample")
    return {
        "min": min(samples),
        "median": statistics.median(samples),
        "max": max(samples),
        "p10": quantile(samples, 0.10),
        "p90": quantile(samples, 0.90),
    }


def measured_row(
    scenario: str,
    section: str,
    metric: str,
    unit: str,
    samples: Sequence[float],
    *,
    comparator: tuple[str, Sequence[float]] | None = None,
    ratio: float | None = None,
    target: Target | None = None,
    notes: Sequence[str] = (),
) -> dict[str, Any]:
    """A measured row. ``ratio`` defaults to median / comparator median.

    ``met`` is filled later by the runner, which knows whether this host is the
    reference host (off it, ``met`` stays null).
    """
    stats = summarize(samples)
    comparator_block = None
    if comparator is not None:
        name, comparator_samples = comparator
        comparator_stats = summarize(comparator_samples)
        comparator_block = {
            "name": name,
            "min": comparator_stats["min"],
            "median": comparator_stats["median"],
            "max": comparator_stats["max"],
        }
        if ratio is None and comparator_stats["median"] != 0:
            ratio = stats["median"] / comparator_stats["median"]
    return {
        "scenario": scenario,
        "section": section,
        "metric": metric,
        "unit": unit,
        "repeats": len(samples),
        **stats,
        "status": "measured",
        "comparator": comparator_block,
        "ratio": ratio,
        "target": target.as_dict() if target else None,
        "met": None,
        "skip_reason": None,
        "notes": list(notes),
    }


def skipped_row(
    scenario: str,
    section: str,
    metric: str,
    unit: str,
    reason: str,
    *,
    target: Target | None = None,
    notes: Sequence[str] = (),
) -> dict[str, Any]:
    """A row that could not be measured here: no figure, only the reason."""
    return {
        "scenario": scenario,
        "section": section,
        "metric": metric,
        "unit": unit,
        "repeats": 0,
        "min": None,
        "median": None,
        "max": None,
        "p10": None,
        "p90": None,
        "status": "skipped",
        "comparator": None,
        "ratio": None,
        "target": target.as_dict() if target else None,
        "met": None,
        "skip_reason": reason,
        "notes": list(notes),
    }



def skipped_rows(scenario: str, section: str, metrics: Sequence[tuple[str, str]], reason: str) -> list[dict[str, Any]]:
    """One skipped row per ``(metric, unit)``, all for the same reason (e.g. a missing extra)."""
    return [skipped_row(scenario, section, metric, unit, reason) for metric, unit in metrics]


def judge(row: dict[str, Any], on_reference_host: bool) -> dict[str, Any]:
    """Fill ``met``: null when skipped, without target, or off the reference host."""
    target = row.get("target")
    if row["status"] != "measured" or not target or not on_reference_host:
        row["met"] = None
        return row
    spec = Target(**target)
    observed = row["ratio"] if spec.unit == "x" else row["median"]
    row["met"] = None if observed is None else spec.holds(observed)
    return row
