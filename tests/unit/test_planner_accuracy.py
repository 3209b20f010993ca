"""Pins docs/planner-accuracy.md: each row's planner estimate is re-computed from the
documented inputs, must equal the documented figure, and must lie within ±15 % of the
published measurement (every figure in GiB)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from flashruntime.planner import plan
from flashruntime.protocol.plan_v1alpha1 import MemoryBreakdown, PlanRequest

DOC = Path(__file__).resolve().parents[2] / "docs" / "planner-accuracy.md"
TOLERANCE = 0.15


def _table_rows(text: str) -> dict[str, dict[str, str]]:
    lines = [line for line in text.splitlines() if line.startswith("| R")]
    header_line = next(line for line in text.splitlines() if line.startswith("| ID |"))
    headers = [h.strip() for h in header_line.strip("|").split("|")]
    rows = {}
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        row = dict(zip(headers, cells))
        rows[row["ID"]] = row
    return rows


def _cases(text: str) -> dict[str, dict[str, Any]]:
    block = re.search(r"```json planner-accuracy-cases\n(.*?)\n```", text, re.S)
    assert block, "the doc lost its planner-accuracy-cases block"
    return {case["id"]: case for case in json.loads(block.group(1))}


TEXT = DOC.read_text(encoding="utf-8")
ROWS = _table_rows(TEXT)
CASES = _cases(TEXT)


def _compared(memory: MemoryBreakdown, quantity: str) -> float:
    if quantity == "total":
        return memory.total_gb
    if quantity == "tensors":
        return memory.total_gb - memory.overhead_gb
    if quantity == "model_states":
        return memory.weights_gb + memory.gradients_gb + memory.optimizer_gb
    raise AssertionError(f"unknown compared quantity {quantity!r}")


def _estimate(case: dict[str, Any]) -> float:
    request = PlanRequest.model_validate({
        "workload": case["workload"],
        "resources": {"gpus": 1, "vram_gb": 80},
        "objective": {"allow_quantization": False},
    })
    single = [c for c in plan(request).candidates if c.strategy_family == "single_gpu"]
    assert len(single) == 1 and single[0].memory is not None
    return _compared(single[0].memory, case["compare"])


def test_the_table_has_at_least_five_sourced_rows_each_with_its_inputs() -> None:
    assert len(ROWS) >= 5
    assert set(ROWS) == set(CASES)
    for row in ROWS.values():
        assert row["Source"] and row["Published"], row


@pytest.mark.parametrize("row_id", sorted(ROWS))
def test_row_is_reproduced_and_within_15_percent(row_id: str) -> None:
    row, case = ROWS[row_id], CASES[row_id]
    assert row["Compared"] == case["compare"]
    published = float(row["Published, GiB"])
    documented = float(row["Planner, GiB"])
    estimate = _estimate(case)
    assert round(estimate, 2) == pytest.approx(documented, abs=0.005), f"{row_id}: planner now gives {estimate:.2f}"
    error = (estimate - published) / published
    assert abs(error) <= TOLERANCE, f"{row_id}: {error:+.1%} is outside ±15 %"
    assert row["Error"] == f"{error:+.1%}"


def test_mean_absolute_error_line_matches_the_rows() -> None:
    errors = [abs(float(r["Error"].rstrip("%"))) for r in ROWS.values()]
    stated = re.search(r"Mean absolute error over the \w+ rows: ([\d.]+) %", TEXT)
    assert stated is not None
    assert float(stated.group(1)) == pytest.approx(sum(errors) / len(errors), abs=0.05)
