"""The recovery table cell by cell from golden data, pinned ``explain``
strings and ``replay``'s decisions, one per signals record."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from flashruntime.protocol.v1alpha1 import FailureClass, RecoveryActionType, RecoveryDecision
from flashruntime.recovery import POLICY_VERSION, FailureSignals, classify, decide, explain, replay

GOLDEN = json.loads((Path(__file__).parent / "golden" / "recovery_decision_table.json").read_text())
CELLS = GOLDEN["cells"]
MODES = ("independent_tasks", "coordinated_training")
AT = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


def test_golden_table_has_every_cell_once() -> None:
    keys = [(cell["failure_class"], cell["mode"]) for cell in CELLS]
    assert len(keys) == len(set(keys)) == 28
    assert set(keys) == {(fc.value, mode) for fc in FailureClass for mode in MODES}
    assert GOLDEN["policy_version"] == POLICY_VERSION


@pytest.mark.parametrize("cell", CELLS, ids=[f"{c['failure_class']}-{c['mode']}" for c in CELLS])
def test_decision_cell(cell: dict) -> None:
    decision = decide(FailureClass(cell["failure_class"]), cell["mode"], at=AT)
    assert decision.policy_version == POLICY_VERSION
    assert decision.failure_class == FailureClass(cell["failure_class"])
    assert decision.action == RecoveryActionType(cell["action"])
    assert decision.scope == cell["scope"]
    assert decision.cordon_node is cell["cordon_node"]
    assert decision.needs_checkpoint is cell["needs_checkpoint"]
    assert decision.reason == cell["reason"]
    assert decision.evidence == {}
    assert decision.decided_at == AT
    assert explain(decision) == cell["explain"]


@pytest.mark.parametrize("cell", CELLS, ids=[f"{c['failure_class']}-{c['mode']}" for c in CELLS])
def test_failure_may_be_given_as_its_value(cell: dict) -> None:
    by_value = decide(cell["failure_class"], cell["mode"], at=AT)
    by_member = decide(FailureClass(cell["failure_class"]), cell["mode"], at=AT)
    assert by_value.model_dump_json() == by_member.model_dump_json()


def test_spec_check_heartbeat_lost_independent() -> None:
    decision = decide(classify(FailureSignals(heartbeat_lost=True)), mode="independent_tasks")
    assert decision.action == RecoveryActionType.RETRY_TASK
    assert decision.cordon_node is True


def test_spec_example_explain_prefix() -> None:
    decision = decide("node_loss", "independent_tasks", at=AT)
    assert explain(decision).startswith(
        "node_loss -> retry_task (scope=task, cordon_node=yes, needs_checkpoint=no; policy 0.1.0): "
    )


@pytest.mark.parametrize("mode", ["", "independent", "COORDINATED_TRAINING", "batch"])
def test_unknown_mode_is_a_value_error(mode: str) -> None:
    with pytest.raises(ValueError, match="unknown recovery mode"):
        decide(FailureClass.UNKNOWN, mode)


def test_unknown_failure_class_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown failure class 'meteor_strike'"):
        decide("meteor_strike", "independent_tasks")


def test_decided_at_defaults_to_now_and_naive_at_is_utc() -> None:
    before = datetime.now(timezone.utc)
    decision = decide(FailureClass.WORKER_CRASH, "independent_tasks")
    assert before - timedelta(seconds=1) <= decision.decided_at <= datetime.now(timezone.utc) + timedelta(seconds=1)
    naive = decide(FailureClass.WORKER_CRASH, "independent_tasks", at=datetime(2026, 1, 1))
    assert naive.decided_at == datetime(2026, 1, 1, tzinfo=timezone.utc)


def test_same_at_gives_byte_identical_decisions() -> None:
    first = decide("preemption", "coordinated_training", {"node": "n1"}, at=AT)
    second = decide("preemption", "coordinated_training", {"node": "n1"}, at=AT)
    assert first.model_dump_json() == second.model_dump_json()


def test_evidence_is_copied() -> None:
    evidence = {"node": "n1"}
    decision = decide("node_loss", "independent_tasks", evidence, at=AT)
    evidence["node"] = "n2"
    assert decision.evidence == {"node": "n1"}


def test_explain_with_evidence_uses_sorted_json() -> None:
    decision = decide("storage_timeout", "coordinated_training", {"z": 1, "a": [1, 2], "m": {"y": 2, "b": None}}, at=AT)
    assert explain(decision) == (
        "storage_timeout -> pause_job (scope=job, cordon_node=no, needs_checkpoint=no; policy 0.1.0): "
        "storage unavailable or slow: pause the job until storage recovers "
        '[evidence: {"a": [1, 2], "m": {"b": null, "y": 2}, "z": 1}]'
    )


def test_explain_ignores_decided_at() -> None:
    early = decide("unknown", "coordinated_training", at=AT)
    late = decide("unknown", "coordinated_training", at=AT + timedelta(days=3))
    assert explain(early) == explain(late)


def test_explain_of_a_decision_read_back_from_json() -> None:
    decision = decide("accelerator_failure", "independent_tasks", {"gpu": 3}, at=AT)
    again = RecoveryDecision.model_validate_json(decision.model_dump_json())
    assert explain(again) == explain(decision)


# --- replay ----------------------------------------------------------------------

SIGNALS = [
    FailureSignals(exit_code=1, exit_deterministic=True),
    FailureSignals(heartbeat_lost=True),
    FailureSignals(exit_code=-9),
    FailureSignals(message="NCCL timeout"),
    FailureSignals(concurrent_failures=5),
    FailureSignals(),
]


def test_replay_validates_mode_first() -> None:
    with pytest.raises(ValueError, match="unknown recovery mode"):
        replay([], "nope")
    with pytest.raises(ValueError, match="unknown recovery mode"):
        replay(["not signals"], "nope")  # type: ignore[list-item]


def test_replay_rejects_other_objects() -> None:
    with pytest.raises(TypeError, match="FailureSignals"):
        replay([FailureSignals(), {"exit_code": 1}], "independent_tasks")  # type: ignore[list-item]


def test_replay_decides_each_independently_with_index_and_signals() -> None:
    decisions = replay(SIGNALS, "coordinated_training")
    assert [d.failure_class for d in decisions] == [classify(s) for s in SIGNALS]
    for index, (decision, signals) in enumerate(zip(decisions, SIGNALS, strict=True)):
        expected = decide(classify(signals), "coordinated_training", at=decision.decided_at)
        assert (decision.action, decision.scope, decision.reason) == (expected.action, expected.scope, expected.reason)
        assert decision.evidence["index"] == index
        assert decision.evidence["signals"] == FailureSignals(**decision.evidence["signals"]).__dict__
        assert FailureSignals(**decision.evidence["signals"]) == signals
        assert decision.decided_at == datetime(1970, 1, 1, tzinfo=timezone.utc)


def test_replay_infers_no_correlation_across_the_list() -> None:
    crashes = [FailureSignals(exit_code=1)] * 5
    assert {d.failure_class for d in replay(crashes, "independent_tasks")} == {FailureClass.WORKER_CRASH}


def test_replay_at_and_json_are_stable() -> None:
    first = replay(SIGNALS, "independent_tasks", at=AT)
    second = replay(list(SIGNALS), "independent_tasks", at=AT)
    assert all(d.decided_at == AT for d in first)
    assert [d.model_dump_json() for d in first] == [d.model_dump_json() for d in second]
    assert first[0].model_dump_json().endswith('"decided_at":"2026-03-01T12:00:00Z"}')


def test_replay_of_nothing_is_empty() -> None:
    assert replay([], "independent_tasks") == []
    assert replay(iter(()), "coordinated_training") == []
