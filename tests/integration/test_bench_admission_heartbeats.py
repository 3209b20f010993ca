"""The ``admission_heartbeats`` scenario runs and writes well-formed rows. Tests never
assert on timings: only on shape, targets and that every beat and refusal was answered."""

from __future__ import annotations

import pytest

from benchmarks.registry import SCENARIOS
from benchmarks.scenarios import admission_heartbeats
from benchmarks.targets import HEARTBEAT_P99_DURING_ADMISSION_S, REFUSAL_S

pytestmark = pytest.mark.bench_smoke
pytest.importorskip("httpx")
pytest.importorskip("fastapi")


def test_scenario_is_registered() -> None:
    scenario = SCENARIOS["admission_heartbeats"]
    assert scenario is admission_heartbeats.SCENARIO
    assert scenario.section == "performance" and "10000-task job" in scenario.hypothesis


def test_smoke_run_rows() -> None:
    rows = {row["metric"]: row for row in admission_heartbeats.SCENARIO.run(1, True)}
    assert set(rows) == {metric for metric, _ in admission_heartbeats.METRICS}
    assert all(row["status"] == "measured" and row["scenario"] == "admission_heartbeats" for row in rows.values())

    beats = rows["heartbeat_p99_during_admission_s"]
    assert beats["repeats"] == 1 and beats["median"] > 0
    assert beats["comparator"]["name"].startswith("idle baseline") and beats["comparator"]["median"] > 0
    assert beats["ratio"] == pytest.approx(beats["median"] / beats["comparator"]["median"])
    assert beats["target"] == HEARTBEAT_P99_DURING_ADMISSION_S.as_dict()
    assert any("beats during admission" in note for note in beats["notes"])
    for name, status in admission_heartbeats.REFUSED:
        refusal = rows[f"refusal_{name}_s"]
        assert refusal["target"] == REFUSAL_S.as_dict() and refusal["median"] > 0
        assert any(f"answered {status}" in note for note in refusal["notes"])
