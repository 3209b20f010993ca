"""The goodput ledger (pure, from a run document and step records) and the chaos plan's
rules: which steps count, what was recomputed, MTTD and MTTR, and how faults are drawn."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from flashruntime.local.chaos import ChaosPlan, Fault, compare_results
from flashruntime.local.goodput import goodput_ledger, ledger_lines


def _document(**extra: Any) -> dict[str, Any]:
    """A run that crashed at step 14 of its first attempt and resumed from step 10."""
    return {
        "started_at": 100.0, "finished_at": 160.0,
        "attempts": [
            {"attempt_id": "task-000", "job_id": "local", "state": "FAILED", "started_at": 101.0, "finished_at": 117.0},
            {"attempt_id": "task-000-r1", "job_id": "local", "state": "SUCCEEDED", "started_at": 118.0,
             "finished_at": 159.0},
        ],
        "events": [{"ts": 117.5, "type": "RESUME_SELECTED", "message": "task-000-r1 resumes from step 10 (ck-1)"}],
        **extra,
    }


# task-000 logs steps 1..14 one second apart from t=102; task-000-r1 logs 11..30 from t=125.
RECORDS = {
    "task-000": [(step, 101.0 + step) for step in range(1, 15)],
    "task-000-r1": [(step, 114.0 + step) for step in range(11, 31)],
}


def _ledger(document: dict[str, Any]):
    return goodput_ledger(document, lambda row: iter(RECORDS.get(row["attempt_id"], [])))


def test_only_the_steps_of_the_final_result_count_and_the_rest_were_recomputed() -> None:
    ledger = _ledger(_document())
    # task-000: steps 1..10 kept (9 s between its 10 records); 11..14 recomputed.
    # task-000-r1: 20 records 11..30, 19 s between them; its first step is startup.
    assert ledger.useful_s == pytest.approx(9 + 19)
    assert (ledger.steps, ledger.steps_recomputed, ledger.restarts) == (30, 4, 1)
    assert ledger.wall_s == pytest.approx(60) and ledger.goodput == pytest.approx(28 / 60)
    assert ledger.lost_work_s == pytest.approx(32)
    (recovery,) = ledger.recoveries
    assert (recovery.failed_attempt, recovery.next_attempt, recovery.resumed_from_step) == ("task-000", "task-000-r1", 10)
    assert recovery.injected is False and recovery.fault_at == pytest.approx(115)  # its last step
    assert recovery.mttd_s == pytest.approx(117 - 115) and recovery.mttr_s == pytest.approx(125 - 117)


def test_an_injected_fault_times_detection_from_the_injection() -> None:
    chaos = {"injected": [{"kind": "corrupt_checkpoint", "attempt_id": "task-000", "ts": 114.0, "done": True},
                          {"kind": "kill_rank", "attempt_id": "task-000", "ts": 115.5, "done": True},
                          {"kind": "hang_rank", "attempt_id": "task-000", "ts": 116.0, "done": True}]}
    (recovery,) = _ledger(_document(chaos=chaos)).recoveries
    assert recovery.injected is True and recovery.mttd_s == pytest.approx(117 - 115.5)  # from the kill
    corrupted_only = {"injected": [{"kind": "corrupt_checkpoint", "attempt_id": "task-000", "ts": 114.0, "done": True},
                                   {"kind": "kill_rank", "attempt_id": "task-000", "ts": 115.5, "done": False}]}
    (recovery,) = _ledger(_document(chaos=corrupted_only)).recoveries
    assert recovery.mttd_s == pytest.approx(117 - 114.0)  # a fault that was not injected times nothing


def test_a_run_whose_steps_carry_no_time_has_no_timed_figures() -> None:
    ledger = goodput_ledger(_document(), lambda row: iter(()))
    assert ledger.timed is False and ledger.goodput is None and ledger.lost_work_s is None
    assert "not timed" in "\n".join(ledger_lines(ledger))


def test_a_relaunch_that_started_over_keeps_nothing_of_the_failed_attempt() -> None:
    document = _document()
    document["events"] = [{"ts": 117.5, "type": "RESUME_SELECTED", "message": "task-000-r1 starts at step 0 (no valid "
                                                                               "checkpoint)"}]
    ledger = _ledger(document)
    assert ledger.steps_recomputed == 14 and ledger.recoveries[0].resumed_from_step == 0


def test_sweep_trials_are_separate_lineages() -> None:
    document = {"started_at": 0.0, "finished_at": 10.0, "events": [], "attempts": [
        {"attempt_id": "task-000", "job_id": "local-000", "state": "SUCCEEDED", "finished_at": 5.0},
        {"attempt_id": "task-001", "job_id": "local-001", "state": "SUCCEEDED", "finished_at": 9.0},
    ]}
    records = {"task-000": [(1, 1.0), (2, 2.0)], "task-001": [(1, 3.0), (2, 5.0)]}
    ledger = goodput_ledger(document, lambda row: iter(records[row["attempt_id"]]))
    assert ledger.useful_s == pytest.approx(1 + 2) and ledger.restarts == 0 and ledger.recoveries == ()


def test_a_plan_draws_its_random_steps_from_its_seed_and_needs_a_when() -> None:
    plan = ChaosPlan(faults=[Fault(kind="kill_rank", between=(10, 50)), Fault(kind="slow", at_step=5)], seed=7)
    assert plan.steps() == ChaosPlan(**plan.model_dump()).steps()  # the same seed, the same steps
    assert 10 <= plan.steps()[0] <= 50 and plan.steps()[1] == 5
    with pytest.raises(ValidationError, match="needs at_step=N or between"):
        Fault(kind="kill_rank")
    with pytest.raises(ValidationError, match="1 <= low <= high"):
        Fault(kind="kill_rank", between=(5, 2))
    with pytest.raises(ValidationError):
        ChaosPlan(faults=[])


def test_results_are_compared_on_their_floats_within_the_tolerance() -> None:
    with_faults = {"final_loss": 0.0188, "start_step": 20, "steps": 60}
    without = {"final_loss": 0.0188 + 5e-7, "start_step": 0, "steps": 60}
    result = compare_results(with_faults, without, metric=None, tolerance=1e-6)
    assert result["equal"] is True and list(result["values"]) == ["final_loss"]  # ints are not results
    assert compare_results(with_faults, {"final_loss": 0.02}, metric=None, tolerance=1e-6)["equal"] is False
    assert compare_results(None, without, metric=None, tolerance=1e-6)["why"] == "the run with faults wrote no metrics.json"
    assert compare_results(with_faults, without, metric="steps", tolerance=0)["equal"] is True
