"""The ``framework_checkpoint_verify`` benchmark scenario at smoke scale: row shape, comparators
and targets, never timings."""

from __future__ import annotations

import pytest

from benchmarks.registry import SCENARIOS
from benchmarks.scenarios import framework_checkpoint_verify

pytestmark = [pytest.mark.bench_smoke, pytest.mark.torch, pytest.mark.frameworks]


def test_smoke_rows_measure_both_verifications_beside_their_comparators() -> None:
    pytest.importorskip("transformers")
    rows = SCENARIOS["framework_checkpoint_verify"].run(1, True)
    assert [row["metric"] for row in rows] == ["ms_verify_before_relaunch", "ms_verify_in_a_new_process",
                                               "ms_fingerprint_while_running"]
    assert all(row["status"] == "measured" and row["median"] > 0 for row in rows)
    assert [row["comparator"]["name"] for row in rows] == ["Trainer._save_checkpoint", "bare sha256 of every file",
                                                           "Trainer._save_checkpoint"]
    assert [row["target"]["value"] if row["target"] else None for row in rows] == [0.5, 1.25, None]
    assert list(framework_checkpoint_verify.WORK_DIR.glob("framework_checkpoint_verify-*")) == []
