"""A hang in the goodput ledger and the chaos plan: the time an attempt hung before the watch
saw it is counted apart, and its detection is the watch's, not the attempt's end."""

from __future__ import annotations

import pytest

from flashruntime.local.chaos import ChaosPlan, Fault
from flashruntime.local.goodput import goodput_ledger, ledger_lines


def _document(**chaos: object) -> dict:
    """Steps 1..14 one second apart from t=102, then no progress: the watch saw it at 127
    (12 s after the last step) and the attempt ended at 129; the relaunch resumed from 10."""
    hang = {"idle_s": 12.0, "detected_at": 127.0, "timeout_s": 10.0, "stacks": "/runs/x/local/task-000/hang-stacks.txt"}
    return {
        "started_at": 100.0, "finished_at": 170.0,
        "attempts": [
            {"attempt_id": "task-000", "job_id": "local", "state": "FAILED", "started_at": 101.0,
             "finished_at": 129.0, "failure": {"class": "hang", "hang": hang}},
            {"attempt_id": "task-000-r1", "job_id": "local", "state": "SUCCEEDED", "started_at": 130.0,
             "finished_at": 169.0},
        ],
        "events": [{"ts": 129.5, "type": "RESUME_SELECTED", "message": "task-000-r1 resumes from step 10 (ck-1)"}],
        **chaos,
    }


RECORDS = {
    "task-000": [(step, 101.0 + step) for step in range(1, 15)],
    "task-000-r1": [(step, 124.0 + step) for step in range(11, 31)],
}


def _ledger(document: dict):
    return goodput_ledger(document, lambda row: iter(RECORDS.get(row["attempt_id"], [])))


def test_hang_time_is_counted_apart_and_detection_is_the_watchs() -> None:
    ledger = _ledger(_document())
    assert ledger.hung_s == pytest.approx(12.0)
    (recovery,) = ledger.recoveries
    assert recovery.hang_s == pytest.approx(12.0)
    assert recovery.detected_at == pytest.approx(127.0)  # not the attempt's end at 129
    assert recovery.mttd_s == pytest.approx(127.0 - 115.0) and recovery.mttr_s == pytest.approx(135.0 - 127.0)
    lines = "\n".join(ledger_lines(ledger))
    assert "4 steps recomputed, hung 12.00 s without progress" in lines
    assert "lost work 42.00 s, of it hung 12.00 s;" in lines


def test_a_forever_hang_injected_times_detection_from_the_injection() -> None:
    chaos = {"chaos": {"injected": [{"kind": "hang_forever", "attempt_id": "task-000", "ts": 116.0, "done": True}]}}
    (recovery,) = _ledger(_document(**chaos)).recoveries
    assert recovery.injected is True and recovery.mttd_s == pytest.approx(127.0 - 116.0)


def test_a_run_without_hangs_says_nothing_of_them() -> None:
    document = _document()
    del document["attempts"][0]["failure"]
    ledger = _ledger(document)
    assert ledger.hung_s == 0.0 and ledger.recoveries[0].hang_s is None
    assert "hung" not in "\n".join(ledger_lines(ledger))


def test_a_hang_until_detected_is_a_fault_of_the_plan() -> None:
    fault = Fault(kind="hang_forever", rank=1, at_step=30)
    assert fault.describe(30) == "hang_forever at step 30: stop rank 1 until the hang is detected"
    assert ChaosPlan(faults=[fault]).steps() == [30]


def test_the_time_a_preemption_took_is_counted_apart_from_hung_time() -> None:
    document = _document()
    document["attempts"][1] = {**document["attempts"][1], "state": "PREEMPTED", "finished_at": 169.0,
                               "preempted": {"signal": "SIGTERM", "grace_s": 25.0, "ended_in_s": 2.5,
                                             "within_grace": True, "saved_step": 30}}
    ledger = _ledger(document)
    assert ledger.preempted_s == 2.5 and ledger.hung_s == 12.0
    (goodput,) = [text for text in ledger_lines(ledger) if "goodput" in text]
    assert "of it hung 12.00 s, of it ending in a preemption 2.50 s;" in goodput
    assert _ledger(_document()).preempted_s == 0.0
    assert "preemption" not in " ".join(ledger_lines(_ledger(_document())))
