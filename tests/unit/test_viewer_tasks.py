"""``collect()``'s ``view``: one task per job id, each with its attempts, restarts and one
curve spanning them; a sweep's trials from its ``sweep`` object, or derived from the attempt
rows and ``trials`` when the run document has none."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from flashruntime.viewer.series import SERIES_POINTS
from flashruntime.viewer.state import collect

PARAMS = [{"lr": 0.1}, {"lr": 0.5, "layers": [2, 4]}, {"lr": 1.0}]


def _attempt(run_dir: Path, job_id: str, attempt_id: str, state: str, records: list[dict[str, Any]],
             metrics: dict[str, Any] | None = None) -> dict[str, Any]:
    attempt_dir = run_dir / job_id / attempt_id
    attempt_dir.mkdir(parents=True)
    (attempt_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if metrics is not None:
        (attempt_dir / "metrics.json").write_text(json.dumps(metrics))
    now = time.time()
    return {"attempt_id": attempt_id, "job_id": job_id, "state": state, "pid": "1", "started_at": now - 10,
            "finished_at": None if state == "RUNNING" else now, "output_dir": str(attempt_dir),
            "exit_code": None if state == "RUNNING" else int(state != "SUCCEEDED")}


def _run_json(run_dir: Path, attempts: list[dict[str, Any]], **extra: Any) -> None:
    doc = {"contract": "viewer_v1", "workload": {"command": ["python", "t.py"], "mode": "local", "source": "."},
           "state": "RUNNING", "started_at": time.time() - 20, "finished_at": None, "max_restarts": 2,
           "checkpoint_dir": None, "attempts": attempts, "events": [], "trials": []}
    doc.update(extra)
    (run_dir / "run.json").write_text(json.dumps(doc))


def _steps(first: int, last: int) -> list[dict[str, Any]]:
    return [{"step": s, "loss": 10.0 / s} for s in range(first, last + 1)]


def test_a_restarted_command_is_one_task_whose_curve_spans_every_attempt(tmp_path: Path) -> None:
    rows = [_attempt(tmp_path, "local", "task-000", "FAILED", _steps(1, 25)),
            _attempt(tmp_path, "local", "task-000-r1", "SUCCEEDED", _steps(21, 60))]  # resumed at 20: 21..25 again
    _run_json(tmp_path, rows)
    view = collect(tmp_path)["view"]
    assert (view["fan_out"], view["derived"], view["loss"]["key"], view["loss"]["x"]) == (False, False, "loss", "step")
    (task,) = view["tasks"]
    assert (task["job_id"], task["restarts"], task["attempt_ids"], task["state"]) == (
        "local", 1, ["task-000", "task-000-r1"], "SUCCEEDED")
    first, second = task["segments"]
    assert (first["attempt_id"], first["points"][0], first["points"][-1]) == ("task-000", [1, 10.0], [25, 0.4])
    assert (second["attempt_id"], second["points"][0], second["points"][-1]) == (
        "task-000-r1", [21, 10 / 21], [60, 10 / 60])


def test_a_task_keeps_its_bound_and_every_attempt_its_first_and_last_point(tmp_path: Path) -> None:
    rows = [_attempt(tmp_path, "local", f"task-000{'' if r == 0 else f'-r{r}'}", "FAILED",
                     _steps(1 + 1000 * r, 1000 * (r + 1))) for r in range(3)]
    _run_json(tmp_path, rows)
    (task,) = collect(tmp_path)["view"]["tasks"]
    assert sum(len(s["points"]) for s in task["segments"]) <= SERIES_POINTS
    for r, segment in enumerate(task["segments"]):
        assert segment["points"][0][0] == 1 + 1000 * r and segment["points"][-1][0] == 1000 * (r + 1)
        assert len(segment["points"]) >= SERIES_POINTS // 6  # a fair share each (buckets fill a limit by half or more)


def test_without_steps_records_are_numbered_on_across_attempts(tmp_path: Path) -> None:
    rows = [_attempt(tmp_path, "local", "task-000", "FAILED", [{"acc": 0.1}, {"acc": 0.2}, {"note": "x"}]),
            _attempt(tmp_path, "local", "task-000-r1", "RUNNING", [{"acc": 0.3}, {"acc": 0.4, "step": 9}])]
    _run_json(tmp_path, rows)
    view = collect(tmp_path)["view"]
    assert view["loss"] == {"key": "acc", "x": "record", "points_per_series": SERIES_POINTS}
    assert [s["points"] for s in view["tasks"][0]["segments"]] == [[[0, 0.1], [1, 0.2]], [[3, 0.3], [4, 0.4]]]


def _sweep_dir(run_dir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Three trials run two at a time (their rows interleave); the first restarted once, the
    second failed without a metrics.json; attempt ids repeat across trials."""
    rows = [
        _attempt(run_dir, "local-000", "task-000", "FAILED", _steps(1, 5)),
        _attempt(run_dir, "local-001", "task-000", "FAILED", _steps(1, 3)),
        _attempt(run_dir, "local-000", "task-000-r1", "SUCCEEDED", _steps(6, 10), {"final_loss": 1.0}),
        _attempt(run_dir, "local-002", "task-000", "RUNNING", _steps(1, 7), {"final_loss": 1.5}),
    ]
    trials = [{"final_loss": 1.0, "params": PARAMS[0]}, {"final_loss": 1.5, "params": PARAMS[2]}]
    return rows, trials


def test_a_sweep_is_one_task_per_trial_from_its_sweep_object(tmp_path: Path) -> None:
    rows, trials = _sweep_dir(tmp_path)
    sweep = {"metric": "final_loss", "mode": "min", "max_concurrent_trials": 2, "fail_fast": False,
             "best_trial_id": "local-000", "trials": [
                 {"trial_id": f"local-{k:03d}", "index": k, "params": PARAMS[k], "state": state,
                  "attempt_ids": ids, "started_at": 100.0 + k, "finished_at": end, "metric": metric,
                  "metrics": None if metric is None else {"final_loss": metric, "params": PARAMS[k]}}
                 for k, (state, ids, end, metric) in enumerate([
                     ("SUCCEEDED", ["task-000", "task-000-r1"], 130.0, 1.0), ("FAILED", ["task-000"], 104.0, None),
                     ("RUNNING", ["task-000"], None, None)])]}
    _run_json(tmp_path, rows, trials=trials, sweep=sweep)
    view = collect(tmp_path)["view"]
    assert (view["fan_out"], view["derived"], view["metric"], view["mode"], view["best_trial_id"]) == (
        True, False, "final_loss", "min", "local-000")
    tasks = view["tasks"]
    assert [(t["job_id"], t["params"], t["state"], t["restarts"], t["best"]) for t in tasks] == [
        ("local-000", PARAMS[0], "SUCCEEDED", 1, True), ("local-001", PARAMS[1], "FAILED", 0, False),
        ("local-002", PARAMS[2], "RUNNING", 0, False)]
    assert [t["attempts"] for t in tasks] == [[0, 2], [1], [3]]
    assert (tasks[0]["metric"], tasks[0]["metrics"], tasks[0]["started_at"], tasks[0]["finished_at"]) == (
        1.0, {"final_loss": 1.0}, 100.0, 130.0)
    assert [[s["points"][0][0] for s in t["segments"]] for t in tasks] == [[1, 6], [1], [1]]


def test_without_a_sweep_object_the_trials_are_derived_from_the_attempt_rows(tmp_path: Path) -> None:
    rows, trials = _sweep_dir(tmp_path)
    _run_json(tmp_path, rows, trials=trials)  # an older run.json: no "sweep"
    view = collect(tmp_path)["view"]
    assert (view["fan_out"], view["derived"], view["metric"], view["best_trial_id"]) == (True, True, None, None)
    tasks = view["tasks"]
    # The failed trial left no metrics.json, so no trials entry: the others still get their own parameters.
    assert [(t["job_id"], t["params"], t["state"], t["restarts"], t["attempt_ids"]) for t in tasks] == [
        ("local-000", PARAMS[0], "SUCCEEDED", 1, ["task-000", "task-000-r1"]),
        ("local-001", None, "FAILED", 0, ["task-000"]),
        ("local-002", PARAMS[2], "RUNNING", 0, ["task-000"])]
    assert tasks[0]["metrics"] == {"final_loss": 1.0}


def test_derived_trials_fall_back_to_job_order_when_their_files_are_gone(tmp_path: Path) -> None:
    rows = [_attempt(tmp_path, f"local-{k:03d}", f"task-{k:03d}", "SUCCEEDED", _steps(1, 3)) for k in range(3)]
    _run_json(tmp_path, rows, trials=[{"acc": 0.5 + k, "params": PARAMS[k]} for k in range(3)], sweep=None)
    assert [t["params"] for t in collect(tmp_path)["view"]["tasks"]] == PARAMS


@pytest.mark.parametrize("sweep", [{"trials": [None, {"trial_id": 5, "params": "x", "metric": "high"}]}, {}])
def test_an_odd_sweep_object_still_gives_a_view(tmp_path: Path, sweep: dict[str, Any]) -> None:
    rows = [_attempt(tmp_path, "local-000", "task-000", "RUNNING", _steps(1, 2))]
    _run_json(tmp_path, rows, sweep=sweep)
    tasks = collect(tmp_path)["view"]["tasks"]
    assert [t["job_id"] for t in tasks][-1] == "local-000"  # its rows are shown, not dropped
    json.dumps(tasks, allow_nan=False)
