"""The ``checkpoint_commit`` benchmark scenario at smoke scale: row shape and honesty,
never timings."""

from __future__ import annotations

import pytest

from benchmarks import targets
from benchmarks.registry import SCENARIOS
from benchmarks.scenarios import checkpoint_commit

pytestmark = pytest.mark.bench_smoke


def test_checkpoint_commit_smoke_rows() -> None:
    scenario = SCENARIOS["checkpoint_commit"]
    assert scenario.section == "performance"
    rows = scenario.run(1, True)
    assert [row["metric"] for row in rows] == ["ms_per_commit_1mb"]  # smoke: 1 MB only
    row = rows[0]
    assert row["scenario"] == "checkpoint_commit" and row["unit"] == "ms"
    assert row["status"] == "measured" and row["repeats"] == 1 and row["median"] > 0
    assert row["comparator"]["name"] in ("torch.save+fsync", "pickle+fsync")
    assert row["comparator"]["median"] > 0
    assert row["ratio"] == pytest.approx(row["median"] / row["comparator"]["median"])
    assert row["target"] is None  # the 1 MB row is informational
    if row["comparator"]["name"] == "pickle+fsync":
        assert any("torch is not importable" in note for note in row["notes"])
    assert any(note.startswith("phase medians (ms): write ") for note in row["notes"])
    assert any("writeback" in note for note in row["notes"])
    assert list(checkpoint_commit.WORK_DIR.glob("checkpoint_commit-*")) == []  # cleaned up


def test_full_run_carries_the_target_on_the_100mb_row() -> None:
    assert checkpoint_commit.TARGET is targets.CHECKPOINT_COMMIT_OVER_BARE_SAVE
    assert checkpoint_commit.TARGET.as_dict()["value"] == 1.15
    assert [label for label, _, _ in checkpoint_commit.SIZES] == ["1mb", "100mb"]
    assert checkpoint_commit.SIZES[1][1] == 100 << 20
