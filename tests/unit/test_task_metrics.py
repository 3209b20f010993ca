"""A task's step records thinned to curves (what ``GET /v1alpha1/jobs/{id}/metrics`` answers)
and read by the worker to ship them: bounded reads, the figures kept, the points thinned."""

from __future__ import annotations

import json
import os
from pathlib import Path

from flashruntime.agent.log_shipper import read_step_records
from flashruntime.coordinator.task_metrics import metrics_share, read_curves, thin
from flashruntime.protocol.task_metrics import JOB_METRICS_MAX_BYTES, MAX_METRIC_KEYS, TASK_METRICS_MAX_BYTES


def _write(path: Path, records: list[object]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def test_curves_keep_the_top_level_finite_numbers_loss_first(tmp_path: Path) -> None:
    path = _write(tmp_path / "metrics.jsonl", [
        {"step": 1, "ts": 100.0, "acc": 0.1, "loss": 2.0, "note": "warmup", "grad": {"norm": 3.0}, "flag": True},
        "not json", '{"torn": ',
        {"step": 2, "ts": 101.0, "acc": 0.2, "loss": 1.0, "lr": 0.01},
        {"epoch": 1, "loss": 0.5},  # no step: not a step record
        {"step": True, "loss": 0.4},  # a bool is not a step
    ])
    curves = read_curves(path, TASK_METRICS_MAX_BYTES, 100)
    assert curves.keys == ["loss", "acc", "lr"]
    assert curves.points == [(1, 100.0, {"acc": 0.1, "loss": 2.0}), (2, 101.0, {"acc": 0.2, "loss": 1.0, "lr": 0.01})]
    assert (curves.records, curves.truncated) == (2, False)
    assert curves.points_json()[0] == {"step": 1, "ts": 100.0, "values": {"acc": 0.1, "loss": 2.0}}


def test_non_finite_values_long_names_and_too_many_figures_are_left_out(tmp_path: Path) -> None:
    record = {"step": 1, "nan": float("nan"), "inf": float("inf"), "x" * 65: 1.0}
    record.update({f"m{i}": float(i) for i in range(MAX_METRIC_KEYS + 4)})
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps(record) + "\n")  # json.dumps writes NaN and Infinity, as Python's loads reads them
    curves = read_curves(path, TASK_METRICS_MAX_BYTES, 100)
    assert curves.keys == [f"m{i}" for i in range(MAX_METRIC_KEYS)]
    assert set(curves.points[0][2]) == set(curves.keys)


def test_only_the_end_of_a_large_file_is_read_from_a_whole_line_on(tmp_path: Path) -> None:
    path = _write(tmp_path / "metrics.jsonl", [{"step": step, "loss": 1.0 / step} for step in range(1, 5001)])
    curves = read_curves(path, 4096, 1000)
    assert curves.truncated and 0 < curves.records < 5000
    steps = [step for step, _, _ in curves.points]
    assert steps == list(range(5001 - curves.records, 5001))  # the last records, none torn


def test_points_are_thinned_evenly_keeping_the_first_and_the_last() -> None:
    assert thin(list(range(10)), 20) == list(range(10))
    assert thin(list(range(101)), 5) == [0, 25, 50, 75, 100]
    assert thin(list(range(7)), 1) == [6]
    assert thin([], 3) == []


def test_a_missing_file_or_a_directory_has_no_curves(tmp_path: Path) -> None:
    assert read_curves(tmp_path / "none.jsonl", 100, 10).keys == []
    (tmp_path / "dir.jsonl").mkdir()
    assert read_curves(tmp_path / "dir.jsonl", 100, 10).records == 0
    assert read_curves(None, 100, 10).points == []


def test_one_answer_shares_its_read_bound_among_its_tasks() -> None:
    assert metrics_share(1) == TASK_METRICS_MAX_BYTES
    assert metrics_share(10_000) == JOB_METRICS_MAX_BYTES // 10_000


def test_the_worker_ships_the_tail_of_a_regular_file_only(tmp_path: Path) -> None:
    path = _write(tmp_path / "metrics.jsonl", [{"step": step} for step in range(1000)])
    whole = path.read_bytes()
    assert read_step_records(path) == whole
    tail = read_step_records(path, max_bytes=100)
    assert tail is not None and whole.endswith(tail) and tail.startswith(b'{"step"') and len(tail) <= 100
    secret = tmp_path / "secret"
    secret.write_text('{"step": 1, "password": 1}\n')
    link = tmp_path / "link.jsonl"
    link.symlink_to(secret)  # a task's link to a file of the worker's is never followed
    assert read_step_records(link) is None
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)  # nor is a FIFO waited on
    assert read_step_records(fifo) is None
    assert read_step_records(tmp_path / "missing.jsonl") is None
