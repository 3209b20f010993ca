"""Measured figures in a plan: a profile that contradicts the static estimate re-ranks the
candidates, finished runs' medians (basis ledger) replace the figures, and a measured
checkpoint cost gives the Young/Daly interval."""

from __future__ import annotations

import math
from pathlib import Path

import flashruntime as flash
from flashruntime.cli.plan import explain_measurements
from flashruntime.profiling import CalibrationLedger, ProfileResult
from flashruntime.profiling.calibration import plan_key

REQUEST = {"workload": {"kind": "pytorch_training", "parameters_m": 0.0003, "est_train_gpu_hours": 1},
           "resources": {"gpus": 2, "vram_gb": 24}}


def _by_name(report: flash.PlanReport) -> dict:
    return {c.name: c for c in report.candidates}


def test_a_measurement_that_contradicts_the_static_estimate_changes_the_ranking() -> None:
    static = flash.plan(REQUEST)
    assert (static.selected.strategy_family, static.selected.workers) == ("ddp", 2)
    slow = ProfileResult(step_time_s=1.0, measured_steps=10, strategy_family="ddp", workers=2)
    measured = flash.plan(REQUEST, profile=slow, steps=10_000)
    ddp = _by_name(measured)["ddp_x2"]
    assert ddp.status == "feasible" and ddp.est_time_min.basis == "profiled"
    assert ddp.est_time_min.value == round(10_000 * 1.0 / 60, 2)
    assert any("static estimate 30, measured +456% off" in r for r in ddp.reasons)
    assert measured.selected.strategy_family == "fsdp2"
    assert "167 min (profiled)" in flash.render(measured)


def test_a_measured_peak_over_the_gpu_makes_the_candidate_infeasible() -> None:
    big = ProfileResult(step_time_s=0.1, measured_steps=5, peak_vram_gb=23.5, strategy_family="ddp", workers=2)
    ddp = _by_name(flash.plan(REQUEST, profile=big))["ddp_x2"]
    assert ddp.status == "infeasible" and ddp.memory.basis == "profiled" and ddp.memory.total_gb == 23.5


def test_after_two_runs_the_figures_are_the_ledgers_medians(tmp_path: Path) -> None:
    ledger = CalibrationLedger(tmp_path / "calibration.sqlite")
    plan_id = flash.plan(REQUEST).selected.plan_id
    ledger.record(plan_key(plan_id, "ddp", 2), "run-a", 0.2, peak_memory_gb=3.0, wall_s=3_600, failures=1)
    ledger.record(plan_key(plan_id, "ddp", 2), "run-b", 0.4, peak_memory_gb=5.0, wall_s=3_600, failures=0)
    report = flash.plan(REQUEST, ledger=ledger, steps=6_000)
    ddp = _by_name(report)["ddp_x2"]
    assert ddp.est_time_min.basis == "ledger" and ddp.memory.basis == "ledger"
    assert ddp.est_time_min.value == round(6_000 * 0.3 / 60, 2) and ddp.memory.total_gb == 4.0  # medians
    assert "runs run-a, run-b" in explain_measurements(report)
    assert ledger.observed_mtbf_s() == 7_200


def test_the_advised_interval_is_young_daly_for_the_measured_checkpoint_cost() -> None:
    measured = ProfileResult(step_time_s=0.01, measured_steps=10, checkpoint_save_s=12.0,
                             strategy_family="ddp", workers=2)
    report = flash.plan(REQUEST, profile=measured, steps=100, mtbf_s=86_400)
    checkpoint = report.selected.checkpoint
    assert checkpoint.interval_seconds == round(math.sqrt(2 * 12.0 * 86_400))
    assert checkpoint.note.startswith("Young/Daly: every 1440 s = sqrt(2 x C 12 s x MTBF 86400 s)")
