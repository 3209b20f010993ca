"""A coordinator job's goodput ledger from its events: machine time, useful time, lost work,
and a recovery (MTTD from the last heartbeat, MTTR to the next claim) for each attempt that
ended without a commit and was followed by another."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from flashruntime.job_goodput import job_goodput, job_goodput_lines
from flashruntime.protocol.v1alpha1 import Event, EventType

T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)
JOB = "job-1"


def event(kind: EventType | str, at: float, **data: Any) -> Event:
    return Event(job_id=JOB, type=kind, timestamp=T0 + timedelta(seconds=at), source="test", data=data)


def claimed(at: float, task: str, lease: str, node: str) -> Event:
    return event(EventType.LEASE_CLAIMED, at, task_id=task, lease_id=lease, node_id=node)


def test_a_task_that_expired_then_committed_elsewhere_and_one_that_failed_then_committed() -> None:
    events = [
        event(EventType.JOB_ACCEPTED, 0.0),
        claimed(1.0, "t0", "L1", "a"),
        event(EventType.LEASE_RENEWED, 5.0, task_id="t0", lease_id="L1"),
        event(EventType.LEASE_RENEWED, 9.0, task_id="t0", lease_id="L1"),  # its last sign of life
        event(EventType.LEASE_EXPIRED, 21.0, task_id="t0", lease_id="L1"),
        claimed(22.5, "t0", "L2", "b"),
        event(EventType.TASK_COMMIT_ACCEPTED, 32.5, task_id="t0", lease_id="L2"),
        claimed(1.0, "t1", "L3", "b"),
        event(EventType.TASK_ATTEMPT_FAILED, 3.0, task_id="t1", lease_id="L3", reason="exit 1"),
        claimed(4.0, "t1", "L4", "a"),
        event(EventType.TASK_COMMIT_ACCEPTED, 8.0, task_id="t1", lease_id="L4"),
        event(EventType.JOB_SUCCEEDED, 33.0),
        event(EventType.TASK_COMMIT_ACCEPTED, 40.0, task_id="t1", lease_id="L4"),  # a second end: ignored
    ]
    ledger = job_goodput(reversed(events))  # any order
    # Machine time: L1 20 s, L2 10 s, L3 2 s, L4 4 s; useful: L2 + L4.
    assert (ledger.attempts, ledger.committed, ledger.running) == (4, 2, 0)
    assert (ledger.machine_s, ledger.useful_s, ledger.lost_work_s) == (36.0, 14.0, 22.0)
    assert ledger.goodput == pytest.approx(14.0 / 36.0)
    assert ledger.wall_s == 33.0  # the first event to JOB_SUCCEEDED
    first, second = ledger.recoveries  # by detection time
    assert (first.task_id, first.cause, first.mttd_s, first.mttr_s, first.next_node_id) == ("t1", "failed", 2.0, 1.0, "a")
    assert (second.task_id, second.cause, second.mttd_s, second.mttr_s) == ("t0", "expired", 12.0, 1.5)
    lines = job_goodput_lines(ledger)
    assert lines[-1] == ("  goodput   38.9% (useful machine time 14.00 s of 36.00 s; lost work 22.00 s; 4 attempts, "
                         "2 committed; wall 33.00 s)")
    assert "t0 lease L1 on a expired: MTTD 12.00 s (from its last heartbeat), MTTR 1.50 s (to the next claim on b)" \
        in lines[1]
    assert ledger.as_json()["recoveries"][1]["detected_at"] == (T0 + timedelta(seconds=21)).isoformat()


def test_an_abandoned_lease_and_a_running_attempt_counted_up_to_now() -> None:
    events = [
        claimed(0.0, "t0", "L1", "a"),
        event(EventType.LEASE_EXPIRED, 3.0, task_id="t0", lease_id="L1", abandoned=True),
        claimed(3.25, "t0", "L2", "a"),
    ]
    ledger = job_goodput(events, now=T0 + timedelta(seconds=10))
    assert (ledger.attempts, ledger.committed, ledger.running) == (2, 0, 1)
    assert (ledger.machine_s, ledger.useful_s, ledger.goodput) == (9.75, 0.0, 0.0)
    (recovery,) = ledger.recoveries
    assert (recovery.cause, recovery.mttd_s, recovery.mttr_s) == ("abandoned", 3.0, 0.25)


def test_a_cancelled_attempt_is_lost_work_but_no_recovery_and_no_events_is_no_figure() -> None:
    ledger = job_goodput([claimed(0.0, "t0", "L1", "a"), event(EventType.TASK_CANCELLED, 2.0, task_id="t0",
                                                                lease_id="L1")])
    assert (ledger.machine_s, ledger.lost_work_s, ledger.recoveries) == (2.0, 2.0, ())
    empty = job_goodput([])
    assert (empty.attempts, empty.goodput, empty.wall_s) == (0, None, None)
    assert job_goodput_lines(empty) == ["  goodput   no attempt has taken time yet"]
