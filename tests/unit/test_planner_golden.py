"""Golden files of the planner: one request per workload kind x objective mode (and the
no-valid-strategy cases), each pinning candidate statuses, the selected plan and every
reason. Files live in tests/unit/golden/planner/ and are reviewed when they change.

Regenerate after an intended change with ``FLASHRUNTIME_UPDATE_GOLDEN=1 pytest tests/unit/test_planner_golden.py``
and review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from flashruntime.planner import PLANNER_VERSION, plan
from flashruntime.protocol.plan_v1alpha1 import PlanReport, PlanRequest
from tests.unit.planner_cases import MODES, golden_cases

GOLDEN_DIR = Path(__file__).parent / "golden" / "planner"
UPDATE = os.environ.get("FLASHRUNTIME_UPDATE_GOLDEN") == "1"
CASES = golden_cases()


def summarize(report: PlanReport) -> dict[str, Any]:
    """The reviewed part of a report: statuses, the selected plan, reasons, hint, notes."""
    selected = None
    if report.selected is not None:
        s = report.selected
        selected = {
            "plan_id": s.plan_id,
            "workload_mode": s.workload_mode,
            "strategy_family": s.strategy_family,
            "launcher": s.launcher,
            "workers": s.workers,
            "gpus_per_worker": s.gpus_per_worker,
            "colocated": s.colocated,
            "precision": s.precision,
            "quantization": s.quantization,
            "peft": s.peft,
            "activation_checkpointing": s.activation_checkpointing,
            "offload": s.offload,
            "memory_total_gb": None if s.memory is None else s.memory.total_gb,
            "est_time_min": None if s.est_time_min is None else s.est_time_min.value,
            "est_cost_usd": None if s.est_cost_usd is None else s.est_cost_usd.value,
            "scaling_efficiency": s.scaling_efficiency,
            "profiling_required": s.profiling_required,
            "libraries": [f"{lib.name} ({lib.role})" for lib in s.libraries],
            "checkpoint": None if s.checkpoint is None else s.checkpoint.backend,
            "selected_because": s.selected_because,
        }
    return {
        "planner_version": report.planner_version,
        "selected": selected,
        "candidates": [
            {
                "name": c.name,
                "status": c.status,
                "workers": c.workers,
                "memory_total_gb": None if c.memory is None else c.memory.total_gb,
                "est_time_min": None if c.est_time_min is None else c.est_time_min.value,
                "est_cost_usd": None if c.est_cost_usd is None else c.est_cost_usd.value,
                "profiling_required": c.profiling_required,
                "reasons": c.reasons,
            }
            for c in report.candidates
        ],
        "warnings": report.warnings,
        "no_valid_strategy_hint": report.no_valid_strategy_hint,
    }


def test_there_is_a_golden_case_for_every_workload_kind_and_objective_mode() -> None:
    kinds = ("transformer_finetune", "pytorch_training", "classical_ml", "independent_tasks")
    assert {f"{k}-{m}" for k in kinds for m in MODES} <= set(CASES)
    on_disk = {p.stem for p in GOLDEN_DIR.glob("*.json")}
    assert on_disk == set(CASES), "stale or missing golden files; regenerate and review"


@pytest.mark.parametrize("name", sorted(CASES))
def test_report_matches_golden_file(name: str) -> None:
    path = GOLDEN_DIR / f"{name}.json"
    request = CASES[name]
    actual = summarize(plan(PlanRequest.model_validate(request)))
    if UPDATE:
        path.write_text(json.dumps({"request": request, "expected": actual}, indent=2, ensure_ascii=False) + "\n")
    golden = json.loads(path.read_text())
    assert golden["request"] == request, f"{path.name}: the request changed; regenerate and review"
    assert golden["expected"]["planner_version"] == PLANNER_VERSION
    assert actual == golden["expected"]
