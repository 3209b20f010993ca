"""The ``ray_sweep`` scenario at smoke scale: one round of the 16-trial sweep on the Ray
backend, on two agents and with ``flash.submit``; rows of the right shape, judged against
their targets, nothing left behind. Tests never assert on speed: only on shape and honesty."""

from __future__ import annotations

import pytest

from benchmarks.registry import SCENARIOS
from benchmarks.rows import judge
from benchmarks.scenarios import _coordinator_http, ray_sweep

pytestmark = [pytest.mark.bench_smoke, pytest.mark.service, pytest.mark.ray, pytest.mark.slow]
pytest.importorskip("ray")
pytest.importorskip("uvicorn")


def test_ray_sweep_smoke_rows() -> None:
    assert SCENARIOS["ray_sweep"] is ray_sweep.SCENARIO
    work = _coordinator_http.WORK_DIR
    before = set(work.glob("ray_sweep-*")) if work.exists() else set()
    rows = {row["metric"]: row for row in ray_sweep.SCENARIO.run(1, True)}
    assert set(rows) == {"ray_backend_vs_local", "agent_fleet_vs_local"}
    for row in rows.values():
        assert row["status"] == "measured", row.get("skip_reason")
        assert row["repeats"] == 1 and row["median"] > 0 and row["comparator"]["median"] > 0
        assert row["ratio"] == pytest.approx(row["median"] / row["comparator"]["median"])
        assert row["target"]["op"] == "<=" and judge(dict(row), on_reference_host=True)["met"] in (True, False)
        assert "16 trials of 0.1 s of sleep" in row["notes"][0]
    assert (set(work.glob("ray_sweep-*")) if work.exists() else set()) == before  # no scratch left behind
