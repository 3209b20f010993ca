"""The planner_latency scenario at smoke scale: rows have the bench_v1 shape, the main
row carries its absolute target, and the scenario planned the reference request."""

from __future__ import annotations

import pytest

from benchmarks import targets
from benchmarks.registry import SCENARIOS

pytestmark = pytest.mark.bench_smoke


def test_planner_latency_smoke_rows() -> None:
    scenario = SCENARIOS["planner_latency"]
    assert scenario.section == "performance"
    rows = scenario.run(1, True)
    by_metric = {row["metric"]: row for row in rows}
    assert set(by_metric) == {"plan_render_ms", "plan_ms", "render_ms"}
    for row in rows:
        assert row["scenario"] == "planner_latency" and row["status"] == "measured" and row["unit"] == "ms"
        assert row["repeats"] == 20
        assert 0 < row["min"] <= row["median"] <= row["max"]
        assert row["comparator"] is None and row["ratio"] is None and row["met"] is None
    main = by_metric["plan_render_ms"]
    assert main["target"] == targets.PLAN_RENDER_MS.as_dict()
    assert "selected ddp x4" in main["notes"][0]
    assert by_metric["plan_ms"]["target"] is None
