"""The preemption_loss scenario at smoke scale: it runs, and its row is honest (measured,
with its comparator and target). Timings are never asserted here."""

from __future__ import annotations

import pytest

from benchmarks import targets
from benchmarks.registry import SCENARIOS

pytestmark = [pytest.mark.bench_smoke, pytest.mark.torch]


def test_preemption_loses_at_most_a_step_where_torchrun_falls_back_to_its_periodic_checkpoint() -> None:
    pytest.importorskip("torch")
    [row] = SCENARIOS["preemption_loss"].run(1, True)
    assert row["status"] == "measured" and row["metric"] == "steps_lost"
    assert row["median"] <= 1 and row["comparator"]["median"] == 3  # signal at 13, periodic checkpoint at 10
    assert row["target"] == targets.PREEMPTION_STEPS_LOST.as_dict()
    assert row["notes"][0].endswith("preempted within the grace in 1 of 1")
