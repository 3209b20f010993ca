"""the Qwen2.5-7B LoRA request on four RTX 4090s selects DDP + LoRA r=16 via
torchrun at ~21-22 GB/GPU (profiling required), ~1.5 h, ~$3; single GPU misses the
deadline, 2-way DDP is feasible but slower; every rejection shows its arithmetic."""

from __future__ import annotations

import hashlib
import re

import pytest

from flashruntime.planner import PLANNER_VERSION, plan, render
from flashruntime.protocol.plan_v1alpha1 import CandidateVerdict, PlanReport, PlanRequest
from tests.unit.planner_cases import SANITY_REQUEST


@pytest.fixture(scope="module")
def report() -> PlanReport:
    return plan(PlanRequest.model_validate(SANITY_REQUEST))


def _one(report: PlanReport, family: str, workers: int) -> CandidateVerdict:
    found = [c for c in report.candidates
             if c.strategy_family == family and c.workers == workers and not c.name.startswith("qlora_")]
    assert len(found) == 1, [c.name for c in report.candidates]
    return found[0]


def test_selects_ddp_lora_on_four_workers_via_torchrun(report: PlanReport) -> None:
    s = report.selected
    assert s is not None
    assert (s.strategy_family, s.workers, s.gpus_per_worker, s.launcher) == ("ddp", 4, 1, "torchrun")
    assert s.peft == "lora(r=16)" and s.quantization is None
    assert s.workload_mode == "coordinated_training"
    assert s.plan_id == f"pl_{report.request_digest}"
    assert s.checkpoint is not None and s.checkpoint.backend == "pytorch_dcp" and s.checkpoint.interval_seconds == 300


def test_memory_is_21_to_22_gb_inside_the_profiling_band(report: PlanReport) -> None:
    s = report.selected
    assert s is not None and s.memory is not None
    assert 21.0 <= s.memory.total_gb <= 22.0
    assert 0.80 * 24 < s.memory.total_gb <= 0.95 * 24
    assert s.profiling_required is True
    assert s.activation_checkpointing is True  # what makes a 7B LoRA fit 24 GB at 2048 tokens


def test_about_one_and_a_half_hours_and_three_dollars(report: PlanReport) -> None:
    s = report.selected
    assert s is not None and s.est_time_min is not None and s.est_cost_usd is not None
    assert 80 <= s.est_time_min.value <= 100
    assert 2.5 <= s.est_cost_usd.value <= 3.5
    assert s.est_time_min.basis == "static" and s.est_cost_usd.unit == "USD"


def test_single_gpu_is_rejected_by_the_deadline(report: PlanReport) -> None:
    single = _one(report, "single_gpu", 1)
    assert single.status == "rejected_policy"
    assert single.est_time_min is not None and 5.5 * 60 <= single.est_time_min.value <= 6.5 * 60
    assert any(re.fullmatch(r"time \d+ min > deadline 240 min", r) for r in single.reasons)


def test_ddp_x2_is_feasible_within_ten_percent_of_the_cheapest_but_slower(report: PlanReport) -> None:
    pair = _one(report, "ddp", 2)
    chosen = _one(report, "ddp", 4)
    assert pair.status == "feasible" and chosen.status == "selected"
    feasible_costs = [c.est_cost_usd.value for c in report.candidates
                      if c.status in ("feasible", "selected") and c.est_cost_usd is not None]
    assert pair.est_cost_usd is not None and pair.est_cost_usd.value <= 1.10 * min(feasible_costs)
    assert pair.est_time_min is not None and chosen.est_time_min is not None
    assert pair.est_time_min.value > chosen.est_time_min.value


def test_every_candidate_is_listed_with_its_arithmetic(report: PlanReport) -> None:
    names = {c.name for c in report.candidates}
    assert len(names) == len(report.candidates) == 12  # W in {1, 2, 4}; lora and qlora_ variants
    for c in report.candidates:
        assert c.reasons, c.name
        assert any(r.startswith("memory ") and " = weights " in r for r in c.reasons), c.name
        if c.status in ("rejected_policy", "infeasible"):
            assert any(" > " in r for r in c.reasons), c.name
    text = render(report)
    for c in report.candidates:
        assert c.name in text
    assert "rejected (constraint)" in text and "feasible (not chosen)" in text


def test_selected_because_states_the_objective_and_the_runner_up(report: PlanReport) -> None:
    s = report.selected
    assert s is not None
    assert any(line.startswith("objective balanced:") for line in s.selected_because)
    assert s.selected_because[-1].startswith("runner-up ddp_x2")


def test_plan_is_deterministic_and_digest_follows_the_spec(report: PlanReport) -> None:
    request = PlanRequest.model_validate(SANITY_REQUEST)
    again = plan(request)
    assert again.model_dump_json() == report.model_dump_json()
    expected = hashlib.sha256((request.model_dump_json() + PLANNER_VERSION).encode()).hexdigest()[:16]
    assert report.request_digest == expected
    assert render(again) == render(report)


def test_plan_accepts_a_plain_mapping() -> None:
    assert plan(SANITY_REQUEST).model_dump() == plan(PlanRequest.model_validate(SANITY_REQUEST)).model_dump()
