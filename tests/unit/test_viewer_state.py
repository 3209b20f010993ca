"""``viewer.state.collect``: the run page's document, read from a real run directory."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest

from flashruntime.checkpoint.local import latest_valid_manifest, open_part, write_manifest
from flashruntime.viewer.series import RECENT_RECORDS, SERIES_POINTS
from flashruntime.viewer.state import LOG_LINES, TELEMETRY_TICKS, WINDOW_BYTES, collect


def _run_json(run_dir: Path, attempts: list[dict[str, Any]], **extra: Any) -> None:
    doc = {"contract": "viewer_v1", "workload": {"command": ["python", "train.py"], "mode": "local", "source": "."},
           "state": "RUNNING", "started_at": time.time() - 5, "finished_at": None, "max_restarts": 1,
           "checkpoint_dir": None, "attempts": attempts,
           "events": [{"ts": time.time(), "type": "LAUNCH_STARTED", "message": "task-000 launched (pid 1)"}],
           "trials": []}
    doc.update(extra)
    (run_dir / "run.json").write_text(json.dumps(doc))


def _attempt(run_dir: Path, attempt_id: str = "task-000", job_id: str = "local") -> tuple[dict[str, Any], Path]:
    attempt_dir = run_dir / job_id / attempt_id
    attempt_dir.mkdir(parents=True)
    row = {"attempt_id": attempt_id, "job_id": job_id, "state": "RUNNING", "pid": "1", "started_at": time.time(),
           "finished_at": None, "output_dir": str(attempt_dir), "exit_code": None}
    return row, attempt_dir


def _checkpoint(root: Path, step: int, job_id: str = "local") -> Path:
    step_dir = root / f"step-{step:06d}"
    with open_part(step_dir, "model.pt") as part:
        part.write(f"weights at {step}".encode())
    write_manifest(step_dir, job_id=job_id, attempt_id="task-000", step=step)
    return step_dir


@pytest.mark.parametrize("content, why", [
    (None, "no run.json"),
    ('{"contract": "viewer_v1", "state": ', "not valid JSON"),
    ('{"contract": "other"}', "not a viewer_v1 document"),
    ("[1, 2]", "not a viewer_v1 document"),
])
def test_a_missing_torn_or_foreign_run_json_is_an_error_document(tmp_path: Path, content: str | None,
                                                                 why: str) -> None:
    if content is not None:
        (tmp_path / "run.json").write_text(content)
    result = collect(tmp_path)
    assert set(result) == {"error"} and why in result["error"]


def test_collect_never_raises_even_for_a_file_path(tmp_path: Path) -> None:
    target = tmp_path / "plain-file"
    target.write_text("x")
    assert "error" in collect(target)


def test_attempts_get_bounded_tails_of_their_files_with_torn_lines_dropped(tmp_path: Path) -> None:
    row, attempt_dir = _attempt(tmp_path)
    lines = [json.dumps({"step": i, "loss": 1.0 / (i + 1), "ts": 1000.0 + i}) for i in range(RECENT_RECORDS + 20)]
    lines.append(json.dumps({"step": 998, "loss": 1e308}).replace("1e+308", "1e999"))  # too large for a float
    lines.append(json.dumps({"step": 999, "loss": float("nan")}))
    (attempt_dir / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 1000, "lo')  # last line being written
    (attempt_dir / "launcher.log").write_text("".join(f"line {i} <b>\n" for i in range(LOG_LINES + 50)))
    ticks = [{"ts": 2000.0 + i, "machine": {"hostname": "box", "cpu_percent": 10.0}} for i in range(TELEMETRY_TICKS + 9)]
    (attempt_dir / "telemetry.jsonl").write_text("".join(json.dumps(t) + "\n" for t in ticks))
    ranks = attempt_dir / "ranks"
    ranks.mkdir()
    for rank in (1, 0):
        (ranks / f"rank-{rank}.json").write_text(json.dumps({"rank": rank, "step": 7, "device": "cpu"}))
    (ranks / "rank-2.json").write_text('{"rank": 2, "st')  # mid-write: skipped, not an error
    _run_json(tmp_path, [row])

    result = collect(tmp_path)
    attempt = result["attempts"][0]
    metrics = attempt["metrics"]
    assert len(metrics) == RECENT_RECORDS and metrics[-1] == {"step": 999, "loss": None}  # NaN -> null
    assert metrics[-2] == {"step": 998, "loss": None}  # 1e999 -> null, like Infinity
    assert metrics[0]["step"] == 22  # the newest complete records
    assert attempt["metrics_records"] == RECENT_RECORDS + 22  # every complete record was read
    (segment,) = result["view"]["tasks"][0]["segments"]
    assert segment["points"][0] == [0, 1.0]  # the curve starts at the first record, not the window's
    assert segment["points"][-1] == [RECENT_RECORDS + 19, 1.0 / (RECENT_RECORDS + 20)]
    assert attempt["log_tail"] == [f"line {i} <b>" for i in range(50, LOG_LINES + 50)]
    assert len(attempt["telemetry"]) == TELEMETRY_TICKS and attempt["telemetry"][-1] == ticks[-1]
    assert [r["rank"] for r in attempt["ranks"]] == [0, 1]
    assert result["monitor"] == ticks[-1]
    assert result["events"][0]["type"] == "LAUNCH_STARTED" and result["now"] == pytest.approx(time.time(), abs=5)
    json.dumps(result, allow_nan=False)  # strict JSON for the browser


def test_a_metrics_file_larger_than_the_window_is_drawn_from_its_first_record(tmp_path: Path) -> None:
    row, attempt_dir = _attempt(tmp_path)
    count = (2 * WINDOW_BYTES) // len(json.dumps({"step": 0, "loss": 0.5, "note": "x" * 200}))
    (attempt_dir / "metrics.jsonl").write_text("".join(
        json.dumps({"step": i + 1, "loss": 1.0 / (i + 1), "note": "x" * 200}) + "\n" for i in range(count)))
    _run_json(tmp_path, [row])
    result = collect(tmp_path)
    assert result["attempts"][0]["metrics_records"] == count
    assert result["attempts"][0]["metrics"][-1]["step"] == count
    (segment,) = result["view"]["tasks"][0]["segments"]
    points = segment["points"]
    assert points[0] == [1, 1.0] and points[-1] == [count, 1.0 / count]  # the whole run, not its tail
    assert len(points) <= SERIES_POINTS < count
    assert [p[0] for p in points] == sorted(p[0] for p in points)


def test_missing_files_give_empty_sections(tmp_path: Path) -> None:
    row, _ = _attempt(tmp_path)
    gone = dict(row, attempt_id="task-000-r1", output_dir=str(tmp_path / "local" / "nowhere"))
    _run_json(tmp_path, [row, gone, {"attempt_id": "odd", "output_dir": None}])
    result = collect(tmp_path)
    for attempt in result["attempts"]:
        assert attempt["metrics"] == attempt["log_tail"] == attempt["telemetry"] == attempt["ranks"] == []
    assert result["checkpoints"] == [] and result["monitor"] is None


def test_checkpoints_are_verified_now_and_the_recovery_pick_is_starred(tmp_path: Path) -> None:
    row, _ = _attempt(tmp_path)
    restart = dict(row, attempt_id="task-000-r1", output_dir=str(tmp_path / "local" / "task-000-r1"))
    root = tmp_path / "local" / "ckpt"
    for step in (10, 20, 30):
        _checkpoint(root, step)
    (root / "step-000030" / "model.pt").write_bytes(b"corrupted after the manifest was written")
    _run_json(tmp_path, [row, restart])  # two attempts of one job share one root: listed once

    checkpoints = collect(tmp_path)["checkpoints"]
    assert [(c["job_id"], c["step"], c["validation"], c["latest_valid"]) for c in checkpoints] == [
        ("local", 10, "hash_verified", False),
        ("local", 20, "hash_verified", True),
        ("local", 30, "invalid", False),
    ]
    assert all(c["parts"] == 1 and 0 <= c["age_s"] < 60 for c in checkpoints)
    picked = latest_valid_manifest(root)
    assert picked is not None and picked.step == 20  # the star is recovery's own choice


def test_run_json_checkpoint_dir_replaces_the_job_scoped_roots(tmp_path: Path) -> None:
    row, _ = _attempt(tmp_path)
    _checkpoint(tmp_path / "local" / "ckpt", 5)
    shared = tmp_path / "shared-ckpt"
    _checkpoint(shared, 40, job_id="multi")
    _run_json(tmp_path, [row], checkpoint_dir=str(shared))
    assert [(c["job_id"], c["step"], c["latest_valid"]) for c in collect(tmp_path)["checkpoints"]] == [
        ("multi", 40, True)]


def test_every_number_in_the_document_is_finite(tmp_path: Path) -> None:
    row, attempt_dir = _attempt(tmp_path)
    (attempt_dir / "telemetry.jsonl").write_text('{"ts": 1.0, "machine": {"cpu_percent": Infinity}}\n')
    _run_json(tmp_path, [row])
    tick = collect(tmp_path)["monitor"]
    assert tick == {"ts": 1.0, "machine": {"cpu_percent": None}}
    assert not any(isinstance(v, float) and not math.isfinite(v) for v in tick["machine"].values() if v is not None)
