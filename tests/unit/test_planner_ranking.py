"""Ranking per objective mode on hand-built candidates: sort keys, the
balanced mode's 10 % cost band, missing numbers as +∞, and the reliable mode's order."""

from __future__ import annotations

from flashruntime.planner.candidate import Candidate, Knobs, Memory
from flashruntime.planner.ranking import objective_line, rank, runner_up_line


def _c(name: str, workers: int, time: float | None, cost: float | None, *, status: str = "feasible",
       offload: str = "none", quant: str | None = None, total_gb: float = 10.0) -> Candidate:
    return Candidate(name=name, family="ddp", workers=workers, launcher="torchrun",
                     workload_mode="coordinated_training", status=status, time_min=time, cost_usd=cost,
                     knobs=Knobs(offload=offload, quantization=quant), memory=Memory(weights_gb=total_gb),
                     vram_gb=24.0)


POOL = [
    _c("a", 1, 300, 2.00),
    _c("b", 2, 160, 2.15),  # within 10 % of 2.00
    _c("c", 4, 90, 2.60),  # outside the band
    _c("d", 8, None, None),  # unknown numbers sort as +inf
    _c("x", 1, 10, 0.10, status="infeasible"),  # never ranked
]


def _names(ranked: list[Candidate]) -> list[str]:
    return [c.name for c in ranked]


def test_cheapest_and_fastest() -> None:
    assert _names(rank(POOL, "cheapest")) == ["a", "b", "c", "d"]
    assert _names(rank(POOL, "fastest")) == ["c", "b", "a", "d"]


def test_balanced_prefers_the_fastest_within_ten_percent_of_the_cheapest() -> None:
    assert _names(rank(POOL, "balanced")) == ["b", "a", "c", "d"]
    assert "within 10% of the cheapest estimated cost ($2.00 -> <= $2.20)" in objective_line("balanced", POOL[:4])


def test_balanced_band_compares_exact_costs() -> None:
    # b shows $2.20 (the band's edge, 1.10 x $2.00) but costs $2.2049: outside the band
    b = _c("b", 2, 160, 2.20)
    b.cost_exact = 2.2049
    assert _names(rank([_c("a", 1, 300, 2.00), b], "balanced")) == ["a", "b"]
    b.cost_exact = 2.1999
    assert _names(rank([_c("a", 1, 300, 2.00), b], "balanced")) == ["b", "a"]


def test_balanced_without_costs_orders_by_time() -> None:
    pool = [_c("slow", 1, 100, None), _c("fast", 2, 50, None), _c("unknown", 1, None, None)]
    assert _names(rank(pool, "balanced")) == ["fast", "slow", "unknown"]


def test_reliable_prefers_few_workers_no_offload_no_quantisation_most_headroom() -> None:
    pool = [
        _c("two", 2, 1, 1),
        _c("one_offload", 1, 1, 1, offload="optimizer_cpu"),
        _c("one_quant", 1, 1, 1, quant="nf4"),
        _c("one_tight", 1, 1, 1, total_gb=20.0),
        _c("one_roomy", 1, 1, 1, total_gb=8.0),
    ]
    assert _names(rank(pool, "reliable")) == ["one_roomy", "one_tight", "one_quant", "one_offload", "two"]


def test_ties_fall_to_the_name_and_nothing_feasible_ranks_empty() -> None:
    assert _names(rank([_c("z", 2, 5, 1), _c("y", 2, 5, 1)], "cheapest")) == ["y", "z"]
    assert rank([_c("x", 1, 1, 1, status="infeasible")], "balanced") == []


def test_runner_up_line() -> None:
    ranked = rank(POOL, "balanced")
    assert runner_up_line(ranked).startswith("runner-up a: 300 min, $2.00, 1 worker(s)")
    assert runner_up_line(ranked[:1]) == "no other feasible candidate"
