"""Classifier precedence against golden data: every rule, every
pair of rules, and the edge cases worth pinning."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from flashruntime.protocol.v1alpha1 import FailureClass
from flashruntime.recovery import CORRELATED_THRESHOLD, POLICY_VERSION, FailureSignals, classify

GOLDEN = json.loads((Path(__file__).parent / "golden" / "recovery_classifier_precedence.json").read_text())


def test_constants() -> None:
    assert POLICY_VERSION == "0.1.0"
    assert CORRELATED_THRESHOLD == 3


def test_signal_fields_in_spec_order_with_defaults() -> None:
    fields = [(f.name, f.default) for f in dataclasses.fields(FailureSignals)]
    assert fields == [
        ("exit_code", None),
        ("exit_deterministic", False),
        ("heartbeat_lost", False),
        ("node_unreachable", False),
        ("xid_event", False),
        ("driver_fault", False),
        ("hash_mismatch", False),
        ("validation_failed", False),
        ("preemption_notice", False),
        ("storage_errors", 0),
        ("control_plane_unreachable", False),
        ("concurrent_failures", 1),
        ("message", ""),
    ]


def test_signals_are_frozen_and_hashable() -> None:
    signals = FailureSignals(exit_code=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        signals.exit_code = 2  # type: ignore[misc]
    assert hash(signals) == hash(FailureSignals(exit_code=1))


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=[case["name"] for case in GOLDEN["cases"]])
def test_golden_precedence(case: dict) -> None:
    assert classify(FailureSignals(**case["signals"])) == FailureClass(case["expected"])


def test_golden_covers_every_rule_pair() -> None:
    names = [case["name"] for case in GOLDEN["cases"]]
    for winner in range(1, 10):
        for loser in range(winner + 1, 10):
            assert any(name.startswith(f"rule {winner} (") and f"beats rule {loser} (" in name for name in names), (
                winner,
                loser,
            )


def test_classify_never_yields_data_error_or_network_degradation() -> None:
    produced = {classify(FailureSignals(**case["signals"])) for case in GOLDEN["cases"]}
    assert FailureClass.DATA_ERROR not in produced
    assert FailureClass.NETWORK_DEGRADATION not in produced
    # A hang is what the hang watch saw (no progress for the timeout), never read from exit signals.
    assert FailureClass.HANG not in produced
    assert produced == set(FailureClass) - {FailureClass.DATA_ERROR, FailureClass.NETWORK_DEGRADATION,
                                            FailureClass.HANG}


@pytest.mark.parametrize(
    ("message", "comm", "storage"),
    [
        ("", False, False),
        ("NCCL WARN", True, False),
        ("process group has been destroyed", True, False),
        ("minio: connection refused", False, True),
        ("Object Store throttled", False, True),
        ("plain failure", False, False),
    ],
)
def test_markers_are_case_insensitive_substrings(message: str, comm: bool, storage: bool) -> None:
    signals = FailureSignals(message=message)
    assert signals.has_comm_marker() is comm
    assert signals.has_storage_marker() is storage
