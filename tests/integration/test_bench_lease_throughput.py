"""The ``lease_throughput`` scenario runs and writes well-formed rows. Tests never
assert on timings (DESIGN.md): only on shape, targets and honesty."""

from __future__ import annotations

import itertools

import pytest

from benchmarks.registry import SCENARIOS
from benchmarks.rows import judge
from benchmarks.scenarios import lease_throughput
from benchmarks.targets import LEASE_FLATNESS, LEASE_MEMORY_OVER_FLOOR, LEASE_SQLITE_OVER_FLOOR

pytestmark = pytest.mark.bench_smoke

WORK = lease_throughput.WORK_DIR


def _by_metric(rows: list[dict]) -> dict[str, dict]:
    return {row["metric"]: row for row in rows}


def test_scenario_is_registered() -> None:
    scenario = SCENARIOS["lease_throughput"]
    assert scenario is lease_throughput.SCENARIO
    assert scenario.section == "performance" and "0.5x" in scenario.hypothesis


def test_smoke_run_rows() -> None:
    before = set(WORK.glob("lease_throughput-*")) if WORK.exists() else set()
    rows = lease_throughput.SCENARIO.run(1, True)
    by_metric = _by_metric(rows)
    assert {row["scenario"] for row in rows} == {"lease_throughput"}

    memory = by_metric["cycles_per_s_memory_n1000"]  # judged against the floor drained beside it
    assert memory["status"] == "measured" and memory["median"] > 0
    assert memory["comparator"]["name"] == "memory_floor" and memory["comparator"]["median"] > 0
    assert memory["ratio"] == pytest.approx(memory["median"] / memory["comparator"]["median"])
    assert memory["target"] == LEASE_MEMORY_OVER_FLOOR.as_dict()
    assert any(note.startswith("each round pinned to the CPU") for note in memory["notes"])

    sqlite = by_metric["cycles_per_s_sqlite_n1000"]
    assert sqlite["status"] == "measured" and sqlite["median"] > 0
    assert sqlite["comparator"]["name"] == "sqlite_floor" and sqlite["comparator"]["median"] > 0
    assert sqlite["ratio"] == pytest.approx(sqlite["median"] / sqlite["comparator"]["median"])
    assert sqlite["target"] == LEASE_SQLITE_OVER_FLOOR.as_dict()
    assert any("on " in note for note in sqlite["notes"])  # where the SQLite file lived

    for kind in ("memory", "sqlite"):
        median = by_metric[f"per_cycle_median_us_{kind}_n1000"]
        assert median["unit"] == "us" and median["median"] > 0 and median["target"] is None
        assert median["comparator"]["name"] == f"{kind}_floor"
        flatness = by_metric[f"per_cycle_median_flatness_{kind}"]
        assert flatness["status"] == "skipped" and flatness["skip_reason"]
        assert flatness["target"] == LEASE_FLATNESS.as_dict()
        for variant in ("gc_enabled", "on_event_append"):
            info = by_metric[f"cycles_per_s_{kind}_n1000_{variant}"]
            assert info["status"] == "measured" and info["target"] is None

    for row in rows:  # a smoke run is one sample per row, and judging works on every row
        assert row["repeats"] in (0, 1)
        judged = judge(dict(row), on_reference_host=True)
        assert judged["met"] is None or isinstance(judged["met"], bool)
    after = set(WORK.glob("lease_throughput-*")) if WORK.exists() else set()
    assert after == before, "the scenario left its scratch files behind"


def test_flatness_row_is_the_ratio_of_medians(monkeypatch: pytest.MonkeyPatch) -> None:
    """A full run's flatness row: per-cycle median at N=100k over the one at N=1k
    (here with the drains shrunk to 200 tasks and a fifth of the cycles per round, so the
    test stays fast)."""
    make_specs = lease_throughput._specs
    monkeypatch.setattr(lease_throughput, "_specs", lambda n: make_specs(min(n, 200)))
    monkeypatch.setattr(lease_throughput, "CYCLES_PER_ROUND", {"memory": 4_000, "sqlite": 1_000})
    rows = _by_metric(lease_throughput.run(2, False))
    # every N is drained ~CYCLES_PER_ROUND[kind] cycles' worth per round; in memory over at least MEMORY_ROUNDS rounds
    per_round = lease_throughput.CYCLES_PER_ROUND
    rounds = {"memory": max(lease_throughput.MEMORY_ROUNDS, 2 * lease_throughput.MEMORY_ROUNDS_PER_SQLITE_ROUND),
              "sqlite": 2}
    assert rounds == lease_throughput._rounds(2, full=True)
    expected = {(kind, n): rounds[kind] * max(1, per_round[kind] // n)
                for kind in ("memory", "sqlite") for n in (1_000, 10_000, 100_000)}
    assert expected[("memory", 1_000)] == 20 and expected[("sqlite", 1_000)] == 2
    for (kind, n), count in expected.items():
        assert rows[f"cycles_per_s_{kind}_n{n}"]["repeats"] == count
        assert rows[f"per_cycle_median_us_{kind}_n{n}"]["repeats"] == count
        assert (f"{count} drains (median of the drains) in {rounds[kind]} rounds spread over the run"
                in rows[f"cycles_per_s_{kind}_n{n}"]["notes"][0])
    for kind in ("memory", "sqlite"):
        flatness = rows[f"per_cycle_median_flatness_{kind}"]
        assert flatness["status"] == "measured" and flatness["repeats"] == expected[(kind, 100_000)]
        assert flatness["median"] == rows[f"per_cycle_median_us_{kind}_n100000"]["median"]
        assert flatness["comparator"]["median"] == rows[f"per_cycle_median_us_{kind}_n1000"]["median"]
        assert flatness["ratio"] == pytest.approx(flatness["median"] / flatness["comparator"]["median"])
        assert flatness["target"] == LEASE_FLATNESS.as_dict()
        assert rows[f"cycles_per_s_{kind}_n10000_gc_enabled"]["repeats"] == 2
    for n in (1_000, 10_000, 100_000):  # one memory_floor drain after each in-memory drain
        floor = rows[f"cycles_per_s_memory_n{n}"]["comparator"]
        assert floor["name"] == "memory_floor" and floor["median"] > 0
    pinning = [note for note in rows["cycles_per_s_memory_n1000"]["notes"] if note.startswith("each round pinned")]
    assert len(pinning) == 1 and pinning[0].count(" ms") == rounds["memory"]


def test_rounds_of_both_stores_are_spread_over_the_whole_run() -> None:
    """In memory a round takes seconds and on SQLite a minute: the memory rounds are
    interleaved with the SQLite ones, so a slow spell cannot meet every in-memory drain."""
    rounds = lease_throughput._rounds(5, full=True)
    assert rounds == {"memory": 10, "sqlite": 5}
    order = lease_throughput._schedule(rounds)
    assert order.count("memory") == 10 and order.count("sqlite") == 5
    assert order[0] == "memory" and order[-1] == "memory"
    sqlite_at = [i for i, kind in enumerate(order) if kind == "sqlite"]
    assert all(b - a == 3 for a, b in itertools.pairwise(sqlite_at))  # two memory rounds between SQLite rounds
    assert lease_throughput._schedule({"memory": 1, "sqlite": 1}) == ["memory", "sqlite"]  # a smoke run
    assert lease_throughput._rounds(1, full=False) == {"memory": 1, "sqlite": 1}
    uneven = lease_throughput._schedule({"memory": 5, "sqlite": 2})
    assert uneven == ["memory", "sqlite", "memory", "memory", "memory", "sqlite", "memory"]


@pytest.mark.bench_stress
def test_full_run_measures_every_row() -> None:
    """The full scale (N up to 100k on both stores, 3 repeats): every row is measured."""
    rows = lease_throughput.SCENARIO.run(3, False)
    by_metric = _by_metric(rows)
    for kind in ("memory", "sqlite"):
        for n in (1_000, 10_000, 100_000):
            assert by_metric[f"cycles_per_s_{kind}_n{n}"]["repeats"] >= 3
        assert by_metric[f"per_cycle_median_flatness_{kind}"]["status"] == "measured"
    assert all(row["status"] == "measured" for row in rows)
