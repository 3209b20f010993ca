"""A plan's local run records itself into the calibration ledger when it succeeds, and the
next plan of the same request takes its figures from there (basis ``ledger``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import flashruntime as flash
from flashruntime.launchers import LaunchState
from flashruntime.planner.timing import shown_minutes
from flashruntime.profiling import CalibrationLedger
from flashruntime.profiling.calibration import plan_key
from flashruntime.workloads.command import CommandWorkload, Source

REQUEST = {"workload": {"kind": "pytorch_training", "parameters_m": 0.0003, "est_train_gpu_hours": 1},
           "resources": {"gpus": 1, "vram_gb": 24}}

TRAIN = """\
import time
import torch
import flashruntime.torch as ft

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = ft.prepare(model, optimizer)
for step in range(ft.start_step() + 1, 9):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    time.sleep(0.05)
    ft.log_metrics({"step": step, "loss": loss.item(), "peak_vram_gb": 0.25 if step < 5 else 0.5})
"""


def _workload(tmp_path: Path, text: str) -> CommandWorkload:
    script = tmp_path / "src" / "train.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(text)
    return CommandWorkload(command=[sys.executable, str(script)], source=Source(path=str(script.parent)))


@pytest.mark.torch
def test_a_succeeded_run_is_the_next_plans_ledger_figure(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    ledger = CalibrationLedger(tmp_path / "calibration.sqlite")
    selected = flash.plan(REQUEST).selected
    assert selected.workload_mode == "local"
    run = flash.run(selected, workload=_workload(tmp_path, TRAIN), output_dir=tmp_path / "out", watch=False,
                    ledger=ledger)
    assert run.state is LaunchState.SUCCEEDED, run.logs()

    key = plan_key(selected.plan_id, selected.strategy_family, selected.workers)
    [recorded] = ledger.runs(key)
    assert recorded.run_id == "out" and recorded.failures == 0 and recorded.peak_memory_gb == 0.5
    assert 0.05 <= recorded.step_time_s < 5  # each step sleeps 0.05 s; generous above
    assert any(e["type"] == "CALIBRATION_RECORDED" and key in e["message"] for e in run.events)

    report = flash.plan(REQUEST, ledger=ledger, steps=1_000)
    chosen = next(c for c in report.candidates if c.status == "selected")
    assert chosen.est_time_min.basis == "ledger" and chosen.memory.basis == "ledger"
    assert chosen.est_time_min.value == shown_minutes(1_000 * recorded.step_time_s / 60)


def test_a_failed_run_records_nothing_and_ledger_false_records_nothing(tmp_path: Path) -> None:
    ledger = CalibrationLedger(tmp_path / "calibration.sqlite")
    selected = flash.plan(REQUEST).selected
    key = plan_key(selected.plan_id, selected.strategy_family, selected.workers)
    steps = ("import time, flashruntime.torch as ft\n"
             "for step in range(1, 4):\n    time.sleep(0.01)\n    ft.log_metrics({'step': step})\n")
    failed = flash.run(selected, workload=_workload(tmp_path / "a", steps + "raise SystemExit(3)\n"),
                       output_dir=tmp_path / "failed", watch=False, ledger=ledger)
    assert failed.state is LaunchState.FAILED
    unlogged = flash.run(selected, workload=_workload(tmp_path / "b", steps), output_dir=tmp_path / "off",
                         watch=False, ledger=False)
    assert unlogged.state is LaunchState.SUCCEEDED, unlogged.logs()
    assert ledger.runs(key) == [] and not any(e["type"].startswith("CALIBRATION") for e in unlogged.events)


def test_the_default_ledger_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "elsewhere" / "ledger.sqlite"
    monkeypatch.setenv("FLASHML_CALIBRATION_LEDGER", str(path))
    selected = flash.plan(REQUEST).selected
    steps = ("import time, flashruntime.torch as ft\n"
             "for step in range(1, 4):\n    time.sleep(0.01)\n    ft.log_metrics({'step': step})\n")
    run = flash.run(selected, workload=_workload(tmp_path, steps), output_dir=tmp_path / "out", watch=False)
    assert run.state is LaunchState.SUCCEEDED, run.logs()
    [recorded] = CalibrationLedger(path).runs(plan_key(selected.plan_id, selected.strategy_family, selected.workers))
    assert recorded.peak_memory_gb is None and recorded.step_time_s > 0
