"""The elastic_resume scenario at smoke scale: it runs, ours relaunches on the one rank left,
and its rows are honest (measured, with the torchrun comparator and the target). Timings
are never asserted here."""

from __future__ import annotations

import pytest

from benchmarks import targets
from benchmarks.registry import SCENARIOS
from benchmarks.scenarios.elastic_resume import EVERY, SMOKE_LOSE_AT

pytestmark = [pytest.mark.bench_smoke, pytest.mark.torch]


def test_a_rank_lost_for_good_resumes_on_one_where_fixed_size_torchrun_waits_for_its_node() -> None:
    pytest.importorskip("torch")
    rows = {row["metric"]: row for row in SCENARIOS["elastic_resume"].run(1, True)}
    resume, lost = rows["resume_s"], rows["steps_lost"]
    assert resume["status"] == "measured" and resume["median"] > 0
    assert resume["target"] == targets.ELASTIC_RESUME_S.as_dict()
    assert resume["comparator"]["name"] == "torchrun --nnodes=2 --max-restarts=3, a node lost for good"
    assert "world sizes per attempt [(2, 1)]; final states ['SUCCEEDED']" in resume["notes"][0], resume["notes"]
    # The survivor never takes a step: its figure is the cap, and the note says where it waited.
    assert "still in the rendezvous, waiting for a second node" in resume["notes"][1], resume["notes"]
    assert resume["notes"][1].endswith("a lower bound, so the ratio is an upper bound")
    # The loss lands at SMOKE_LOSE_AT; the relaunch resumes from the newest checkpoint before it.
    assert 0 <= lost["median"] <= SMOKE_LOSE_AT - (SMOKE_LOSE_AT // EVERY) * EVERY + 1, lost
