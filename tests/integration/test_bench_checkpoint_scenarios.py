"""The ``checkpoint_cost``, ``checkpoint_stall`` and ``checkpoint_integrity`` benchmark scenarios
at smoke scale: row shape and honesty (status, units, comparators, the real fault counts), never
timings."""

from __future__ import annotations

import re
import sys

import pytest

from benchmarks.registry import SCENARIOS
from benchmarks.scenarios import checkpoint_cost, checkpoint_integrity

pytestmark = pytest.mark.bench_smoke


def _without_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``import torch`` fail in this process, as on a host without torch."""
    monkeypatch.setitem(sys.modules, "torch", None)


@pytest.mark.torch
def test_checkpoint_cost_smoke_rows() -> None:
    pytest.importorskip("torch")
    scenario = SCENARIOS["checkpoint_cost"]
    assert scenario.section == "performance"
    rows = scenario.run(1, True)
    assert [row["metric"] for row in rows] == ["ms_per_checkpoint_1mb"]  # smoke: the small state only
    row = rows[0]
    assert row["scenario"] == "checkpoint_cost" and row["unit"] == "ms"
    assert row["status"] == "measured" and row["repeats"] == 1 and row["median"] > 0
    assert row["comparator"]["name"] == "bare torch.save" and row["comparator"]["median"] > 0
    assert row["ratio"] == pytest.approx(row["median"] / row["comparator"]["median"])
    assert row["target"] is None and row["skip_reason"] is None  # no target is set for it
    assert any("flashruntime.torch.checkpoint" in note for note in row["notes"])
    assert any("nn.Linear(512, 512)" in note and "momentum" in note for note in row["notes"])
    assert list(checkpoint_cost.WORK_DIR.glob("checkpoint_cost-*")) == []  # cleaned up


def test_checkpoint_cost_full_run_sizes() -> None:
    assert [label for label, _, _ in checkpoint_cost.SIZES] == ["1mb", "100mb"]
    for label, layers, width in checkpoint_cost.SIZES:
        params_mib = layers * (width * width + width) * 4 / (1 << 20)
        assert params_mib == pytest.approx(1 if label == "1mb" else 100, rel=0.02)
    assert checkpoint_cost.MIN_SAMPLES >= 5


def test_checkpoint_cost_skips_without_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    _without_torch(monkeypatch)
    for smoke, metrics in (
        (True, ["ms_per_checkpoint_1mb"]),
        (False, ["ms_per_checkpoint_1mb", "ms_per_checkpoint_100mb"]),
    ):
        rows = checkpoint_cost.run(5, smoke)
        assert [row["metric"] for row in rows] == metrics
        for row in rows:
            assert row["status"] == "skipped" and row["median"] is None and row["comparator"] is None
            assert "torch is not importable" in row["skip_reason"] and "never estimated" in row["skip_reason"]


def _check_integrity_rows(rows: list[dict], comparator: str) -> dict[str, dict]:
    by_metric = {row["metric"]: row for row in rows}
    assert list(by_metric) == ["integrity", "corruption_rate"]
    for row in rows:
        assert row["scenario"] == "checkpoint_integrity" and row["section"] == "resilience"
        assert row["status"] == "measured" and row["repeats"] == 1  # smoke: one batch
        assert row["unit"] == "fraction of in-window kills" and row["target"] is None
    integrity, corruption = by_metric["integrity"], by_metric["corruption_rate"]
    assert integrity["median"] == 1.0, integrity["notes"]  # every kill left valid-or-absent steps
    assert integrity["comparator"] is None
    assert corruption["median"] == 0.0
    assert corruption["comparator"]["name"] == comparator
    assert 0.0 <= corruption["comparator"]["median"] <= 1.0
    # Numerator and denominator of the real injected faults, for both sides.
    ours = re.search(r"^ours: (\d+)/(\d+) in-window kills left every step valid-or-absent", integrity["notes"][0])
    assert ours and ours.group(1) == ours.group(2) == str(checkpoint_integrity.SMOKE_KILLS)
    naive = re.search(rf"^{comparator}: (\d+)/(\d+) in-window kills left a corrupt file", corruption["notes"][1])
    assert naive and int(naive.group(2)) == checkpoint_integrity.SMOKE_KILLS
    assert corruption["comparator"]["median"] == pytest.approx(int(naive.group(1)) / int(naive.group(2)))
    assert any("window length (median of" in note for note in integrity["notes"])
    assert list(checkpoint_integrity.WORK_DIR.glob("checkpoint_integrity-*")) == []  # cleaned up
    return by_metric


@pytest.mark.torch
def test_checkpoint_integrity_smoke_rows() -> None:
    pytest.importorskip("torch")
    scenario = SCENARIOS["checkpoint_integrity"]
    assert scenario.section == "resilience"
    rows = _check_integrity_rows(scenario.run(1, True), "naive torch.save")
    assert any("torch.load fails" in note for note in rows["corruption_rate"]["notes"])


def test_checkpoint_integrity_without_torch_uses_a_naive_pickle_write(monkeypatch: pytest.MonkeyPatch) -> None:
    _without_torch(monkeypatch)
    rows = _check_integrity_rows(checkpoint_integrity.run(1, True), "naive pickle write")
    notes = rows["corruption_rate"]["notes"]
    assert any("torch is not importable" in note for note in notes)
    assert any("pickle.load fails" in note for note in notes)


def test_checkpoint_integrity_full_run_counts() -> None:
    kills = checkpoint_integrity.MIN_KILLS
    assert kills >= 30 and checkpoint_integrity.BATCHES >= 3 and kills // checkpoint_integrity.BATCHES >= 10


@pytest.mark.torch
def test_checkpoint_stall_smoke_rows() -> None:
    pytest.importorskip("torch")
    from benchmarks.scenarios import checkpoint_stall

    rows = SCENARIOS["checkpoint_stall"].run(1, True)
    assert [row["metric"] for row in rows] == ["blocked_ms_per_save_1mb", "ms_to_commit_1mb",
                                               "step_ms_beside_write_1mb"]
    for row in rows:
        assert row["scenario"] == "checkpoint_stall" and row["section"] == "performance" and row["unit"] == "ms"
        assert row["status"] == "measured" and row["median"] > 0 and row["comparator"]["median"] > 0
        assert row["ratio"] == pytest.approx(row["median"] / row["comparator"]["median"])
        assert row["target"] is None  # the target is the 100 MB row's, which smoke does not run
    assert rows[0]["repeats"] == rows[1]["repeats"] == 1
    assert [row["comparator"]["name"] for row in rows] == ["ft.checkpoint(async_save=False)"] * 2 + [
        "the same step, no save in flight"]
    assert any("async_save=True" in note for note in rows[0]["notes"])
    assert any("warm-up) held the thread" in note for note in rows[0]["notes"])
    assert list(checkpoint_stall.WORK_DIR.glob("checkpoint_stall-*")) == []  # cleaned up


def test_checkpoint_stall_targets_the_100mb_save_and_skips_without_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks.scenarios import checkpoint_stall
    from benchmarks.targets import CHECKPOINT_STALL_ASYNC_OVER_SYNC

    assert (CHECKPOINT_STALL_ASYNC_OVER_SYNC.op, CHECKPOINT_STALL_ASYNC_OVER_SYNC.value) == ("<=", 0.1)
    assert checkpoint_stall.SIZES == checkpoint_cost.SIZES and checkpoint_stall.MIN_SAMPLES >= 5
    _without_torch(monkeypatch)
    rows = checkpoint_stall.run(5, False)
    assert [row["metric"] for row in rows] == [f"{metric}_{label}" for label in ("1mb", "100mb") for metric in (
        "blocked_ms_per_save", "ms_to_commit", "step_ms_beside_write")]
    assert all(row["status"] == "skipped" and "never estimated" in row["skip_reason"] for row in rows)
