"""The main-job benchmark scenarios at smoke scale: they run, and their rows are honest
(measured, with their targets attached). Timings are never asserted here."""

from __future__ import annotations

import pytest

from benchmarks import targets
from benchmarks.registry import SCENARIOS

pytestmark = pytest.mark.bench_smoke


def _rows(name: str) -> dict[str, dict]:
    rows = SCENARIOS[name].run(1, True)
    assert rows and all(r["scenario"] == name for r in rows)
    return {r["metric"]: r for r in rows}


def test_fault_routing_routes_every_fault() -> None:
    row = _rows("fault_routing")["typed_outcomes_correct"]
    assert row["status"] == "measured" and row["median"] == 5, row["notes"]
    assert row["target"] == targets.faults_routed(5).as_dict()


def test_auto_resume_does_not_recompute_checkpointed_steps() -> None:
    rows = _rows("auto_resume")
    assert rows["steps_not_recomputed"]["median"] == 20
    assert rows["recompute_fraction"]["median"] == 0
    assert rows["recompute_fraction"]["comparator"]["median"] == 0.5  # rerun from zero redoes 20 of 40


def test_trial_storm_needs_no_human() -> None:
    rows = _rows("trial_storm")
    assert rows["trials_completed"]["median"] == 16 and rows["manual_interventions"]["median"] == 0
    assert rows["trials_auto_resumed"]["median"] == 8


def test_demo_wall_records_exit_code() -> None:
    row = _rows("demo_wall")["demo_wall_s"]
    assert row["status"] == "measured" and row["notes"] == ["exit codes [0]"]
    assert row["target"]["unit"] == "s"


@pytest.mark.torch
def test_launch_overhead_smoke() -> None:
    pytest.importorskip("torch")
    rows = _rows("launch_overhead")
    row = rows["submit_vs_torchrun"]
    assert row["status"] == "measured" and row["comparator"]["name"] == "bare torchrun"
    assert row["ratio"] > 0 and rows["overhead_s"]["repeats"] == 1


def test_sweep_parallel_smoke() -> None:
    row = _rows("sweep_parallel")["parallel_2_vs_1"]
    assert row["status"] == "measured" and row["comparator"]["name"] == "--parallel 1"
    assert row["target"] == targets.SWEEP_PARALLEL_OVER_SERIAL.as_dict() and row["ratio"] > 0


@pytest.mark.torch
def test_hang_mttd_smoke() -> None:
    pytest.importorskip("torch")
    rows = _rows("hang_mttd")
    row = rows["mttd_s"]
    assert row["status"] == "measured" and row["comparator"]["name"] == "torchrun --max-restarts=1 alone"
    assert row["target"] == targets.HANG_MTTD_S.as_dict()
    assert "final states ['SUCCEEDED']" in row["notes"][0], row["notes"]
    assert rows["hung_s"]["median"] > 0
