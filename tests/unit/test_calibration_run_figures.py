"""``run_figures``: a finished run's step time, peak memory, failures and wall time from its
``run.json`` and attempts' ``metrics.jsonl``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flashruntime.errors import InvalidSubmission
from flashruntime.local.submit import submit
from flashruntime.profiling.calibration import CalibrationLedger, run_figures
from flashruntime.workloads.command import CommandWorkload


def _run(tmp_path: Path, attempts: list[tuple[str, list[str]]]) -> Path:
    rows = []
    for index, (state, lines) in enumerate(attempts):
        out = tmp_path / f"task-000-r{index}"
        out.mkdir()
        (out / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        rows.append({"attempt_id": out.name, "state": state, "output_dir": str(out)})
    document = {"state": "SUCCEEDED", "started_at": 100.0, "finished_at": 160.0, "attempts": rows}
    (tmp_path / "run.json").write_text(json.dumps(document))
    return tmp_path


def test_steps_logged_every_few_steps_are_timed_per_step_across_attempts(tmp_path: Path) -> None:
    first = ['{"step": 2, "ts": 10.0}', '{"step": 4, "ts": 11.0, "peak_vram_gb": 3.5}', '{"step": 6, "ts": 12.0}']
    second = ['{"step": 4, "ts": 20.0}', '{"step": 5, "ts": 20.5, "peak_vram_gb": 2.0}', '{"step": 6, "ts": 21.0}',
              '{"step": 7, "ts": 21.9}', '{"step": 8, "ts": 2', 'not json', '{"step": true, "ts": 30.0}']
    figures = run_figures(_run(tmp_path, [("FAILED", first), ("SUCCEEDED", second)]))
    assert figures.step_time_s == 0.5 and figures.timed_steps == 5  # 0.5, 0.5 | 0.5, 0.5, 0.9
    assert (figures.peak_memory_gb, figures.failures, figures.wall_s) == (3.5, 1, 60.0)


def test_a_run_without_two_timed_steps_records_nothing(tmp_path: Path) -> None:
    ledger = CalibrationLedger(tmp_path / "ledger.sqlite")
    figures = ledger.record_run("pl_x/ddp/x1", "r", _run(tmp_path, [("SUCCEEDED", ['{"step": 1, "ts": 1.0}'])]))
    assert figures.step_time_s is None and ledger.runs("pl_x/ddp/x1") == []


def test_submit_takes_a_ledger_only_with_its_plan_key(tmp_path: Path) -> None:
    workload = CommandWorkload(command=["python", "-c", "pass"])
    with pytest.raises(InvalidSubmission, match="ledger and plan_key go together"):
        submit(workload, output_dir=tmp_path, ledger=CalibrationLedger(tmp_path / "l.sqlite"))
    with pytest.raises(InvalidSubmission, match="plan_key must be a non-empty string"):
        submit(workload, output_dir=tmp_path, ledger=CalibrationLedger(tmp_path / "l.sqlite"), plan_key=" ")
