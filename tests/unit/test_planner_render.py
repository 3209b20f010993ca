"""The render layout: selected block or NO VALID STRATEGY, candidates by
status order with their labels and reasons, notes, footer; ``render`` is
``explain.render_report``."""

from __future__ import annotations

import flashruntime.planner as planner
from flashruntime.planner import explain, plan, render
from flashruntime.protocol.plan_v1alpha1 import PlanRequest
from tests.unit.planner_cases import SANITY_REQUEST


def test_render_is_render_report_and_the_package_exports() -> None:
    assert render is explain.render_report
    assert planner.__all__ == ["PLANNER_VERSION", "plan", "render"]
    assert planner.PLANNER_VERSION == "0.2.0"


def test_selected_layout() -> None:
    report = plan(PlanRequest.model_validate(SANITY_REQUEST))
    text = render(report)
    lines = text.splitlines()
    assert lines[0] == f"SELECTED PLAN pl_{report.request_digest}"
    for label in ("mode", "strategy", "topology", "launcher", "knobs", "memory", "time", "cost", "scaling",
                  "checkpoint", "WARNING", "libraries", "because"):
        assert any(line.startswith(f"  {label}") for line in lines), label
    assert "  strategy    ddp + lora(r=16)" in lines
    assert "  topology    4 worker(s) x 1 GPU each (one host)" in lines
    assert "    - torchrun (launcher): starts one process per GPU with the rendezvous environment" in lines
    assert f"Candidates evaluated ({len(report.candidates)}):" in lines
    assert lines[-1] == f"planner 0.2.0 · request {report.request_digest}"
    # status order: selected, feasible, rejected_policy, rejected_dominated, infeasible
    heads = [line for line in lines if line.startswith("  ") and " [" in line and not line.startswith("      ")]
    order = {"SELECTED": 0, "feasible (not chosen)": 1, "rejected (constraint)": 2, "rejected (dominated)": 3,
             "INFEASIBLE": 4}
    ranks = [next(v for k, v in order.items() if h.strip().startswith(k)) for h in heads]
    assert ranks == sorted(ranks) and ranks[0] == 0
    assert len(heads) == len(report.candidates)


def test_no_valid_strategy_layout_with_notes() -> None:
    report = plan(PlanRequest.model_validate({
        "workload": {"kind": "transformer_finetune", "model": "meta-llama/Llama-3.1-70B", "method": "full"},
        "resources": {"gpus": 2, "gpu_type": "rtx4090"},
    }))
    text = render(report)
    lines = text.splitlines()
    assert lines[0] == "NO VALID STRATEGY"
    assert lines[1] == f"  {report.no_valid_strategy_hint}"
    assert "Notes" in lines and "  - workload.train_tokens_m not set: no time or cost estimates" in lines
    assert sum(line.strip().startswith("INFEASIBLE") for line in lines) == len(report.candidates)


def test_dominated_label() -> None:
    report = plan(PlanRequest.model_validate({"workload": {"kind": "independent_tasks", "task_count": 8}}))
    text = render(report)
    assert "  rejected (dominated)   local_sequential [local_process, 1 worker(s)] - 80 min" in text.splitlines()
