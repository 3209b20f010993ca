"""The ``profile_accuracy`` scenario at smoke scale: one pair of a normal run and a profile
of the 2-rank DDP example under real torchrun, rows of the right shape, judged on the
largest pair's error. Tests never assert on speed: only on shape and honesty."""

from __future__ import annotations

import pytest

from benchmarks.registry import SCENARIOS
from benchmarks.rows import judge
from benchmarks.scenarios import profile_accuracy

pytestmark = [pytest.mark.bench_smoke, pytest.mark.torch, pytest.mark.slow]
pytest.importorskip("torch")


def test_profile_accuracy_smoke_rows() -> None:
    assert SCENARIOS["profile_accuracy"] is profile_accuracy.SCENARIO
    rows = {row["metric"]: row for row in profile_accuracy.SCENARIO.run(1, True)}
    assert set(rows) == {"step_time_error", "profiled_step_s"}
    error, step = rows["step_time_error"], rows["profiled_step_s"]
    assert error["status"] == step["status"] == "measured"
    assert error["repeats"] == 1 and error["ratio"] == error["max"] >= 0
    assert error["target"]["op"] == "<=" and judge(dict(error), on_reference_host=True)["met"] in (True, False)
    assert step["median"] > 0 and step["comparator"]["median"] > 0
    assert step["ratio"] == pytest.approx(step["median"] / step["comparator"]["median"])
    assert "profiled ÷ normal per pair" in error["notes"][0]
