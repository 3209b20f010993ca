"""The goodput_under_faults scenario at smoke scale: it runs both arms under the same kill
schedule, and its rows are honest (measured, with their comparator and target). Timings are
never asserted here."""

from __future__ import annotations

import pytest

from benchmarks import targets
from benchmarks.registry import SCENARIOS

pytestmark = [pytest.mark.bench_smoke, pytest.mark.torch]


def test_goodput_under_faults_kills_both_arms_alike_and_reports_the_ratio() -> None:
    pytest.importorskip("torch")
    rows = {row["metric"]: row for row in SCENARIOS["goodput_under_faults"].run(1, True)}
    assert set(rows) == {"goodput", "steps_kept", "restarts", "recovery_s"}
    assert all(row["status"] == "measured" and row["repeats"] == 1 for row in rows.values())
    goodput = rows["goodput"]
    assert goodput["target"] == targets.GOODPUT_OVER_TORCHRUN.as_dict()
    assert goodput["comparator"]["name"].startswith("torchrun --max-restarts")
    assert 0 <= goodput["median"] <= 1 and 0 <= goodput["comparator"]["median"] <= 1
    assert goodput["notes"][2].endswith("kills per sample: ours [1], torchrun [1]"), goodput["notes"]
    restarts = rows["restarts"]
    assert restarts["median"] == 1 and restarts["comparator"]["median"] == 1  # the one kill, relaunched once
