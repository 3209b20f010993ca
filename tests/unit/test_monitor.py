"""telemetry → evidence rules (None = not measured, never 0), nvidia-smi parsing,
and the sampler's record shape with and without psutil (no real child processes here)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from flashruntime.monitor import ResourceSampler, evidence_from_telemetry, gpus, sampler
from flashruntime.monitor.evidence import summarize_ticks


def _tick(ts: float, cpu: float | None, utils: list[float | None] | None = None) -> dict:
    rows = [{"name": "G", "util_percent": u, "mem_used_mb": 1, "mem_total_mb": 2} for u in (utils or [])]
    return {"ts": ts, "machine": {"cpu_percent": cpu, "gpus": rows}, "processes": []}


def _write(path: Path, lines: list[object]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


# Where a Ray backend ran the attempt: not set by an agent's telemetry.
NOT_ON_RAY = {"ray_node_id": None, "node_ip": None, "hostname": None, "worker_pid": None, "gpu_ids": None}


def test_missing_file_measures_nothing(tmp_path: Path) -> None:
    evidence = evidence_from_telemetry(tmp_path / "absent.jsonl")
    assert evidence.model_dump() == {"wall_seconds": None, "cpu_percent_mean": None, "gpu_util_percent_mean": None,
                                     "image_digest": "", "exit_code": None, **NOT_ON_RAY}


def test_arguments_pass_through_even_without_telemetry(tmp_path: Path) -> None:
    evidence = evidence_from_telemetry(tmp_path / "absent.jsonl", exit_code=0, wall_seconds=0.0)
    assert (evidence.exit_code, evidence.wall_seconds, evidence.cpu_percent_mean) == (0, 0.0, None)


def test_means_and_wall_time_from_ticks(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", [
        _tick(100.0, None, [10.0, 30.0]),   # first tick: cpu not yet measured
        _tick(102.0, 20.0, [50.0, None]),  # an [N/A] GPU reading is skipped, not counted as 0
        "{torn line",
        _tick(104.5, 40.0, [90.0, 0.0]),
    ])
    evidence = evidence_from_telemetry(path, exit_code=3)
    assert evidence.wall_seconds == pytest.approx(4.5)
    assert evidence.cpu_percent_mean == pytest.approx(30.0)
    assert evidence.gpu_util_percent_mean == pytest.approx((10 + 30 + 50 + 90 + 0) / 5)
    assert (evidence.exit_code, evidence.image_digest) == (3, "")
    assert evidence_from_telemetry(path, wall_seconds=9.0).wall_seconds == 9.0  # the argument wins


def test_zero_is_kept_as_a_measurement() -> None:
    evidence = summarize_ticks([_tick(1.0, 0.0, [0.0]), _tick(1.0, 0.0, [0.0])])
    assert (evidence.wall_seconds, evidence.cpu_percent_mean, evidence.gpu_util_percent_mean) == (0.0, 0.0, 0.0)


def test_one_tick_and_no_gpus_leave_none() -> None:
    evidence = summarize_ticks([_tick(5.0, None, [])])
    assert (evidence.wall_seconds, evidence.cpu_percent_mean, evidence.gpu_util_percent_mean) == (None, None, None)


def test_garbage_never_raises(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", ["[1, 2]", '"text"', json.dumps({"ts": "soon", "machine": [1]}),
                                         json.dumps({"ts": 1, "machine": {"cpu_percent": True, "gpus": [5, None]}})])
    assert evidence_from_telemetry(path).model_dump()["cpu_percent_mean"] is None
    assert evidence_from_telemetry(tmp_path).wall_seconds is None  # a directory, not a file
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\x00garbage\n")
    assert evidence_from_telemetry(tmp_path / "bin.jsonl").cpu_percent_mean is None


def test_parse_nvidia_smi_rows() -> None:
    text = "NVIDIA H100 80GB HBM3, 87, 40000, 81559\nNVIDIA H100 80GB HBM3, [N/A], 12, 81559\n\nbad line\n"
    assert gpus.parse_nvidia_smi(text) == [
        {"name": "NVIDIA H100 80GB HBM3", "util_percent": 87.0, "mem_used_mb": 40000, "mem_total_mb": 81559},
        {"name": "NVIDIA H100 80GB HBM3", "util_percent": None, "mem_used_mb": 12, "mem_total_mb": 81559},
    ]


def test_query_gpus_is_empty_without_nvidia_smi(tmp_path: Path) -> None:
    assert gpus.query_gpus(str(tmp_path / "no-such-nvidia-smi")) == []
    failing = tmp_path / "nvidia-smi"
    failing.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' ; exit 9\n")
    failing.chmod(0o755)
    assert gpus.query_gpus(str(failing)) == []
    fake = tmp_path / "fake-smi"
    fake.write_text("#!/bin/sh\necho 'Fake GPU, 5, 1, 2'\n")
    fake.chmod(0o755)
    assert gpus.query_gpus(str(fake)) == [{"name": "Fake GPU", "util_percent": 5.0, "mem_used_mb": 1,
                                           "mem_total_mb": 2}]


def test_without_psutil_only_the_root_appears_with_nulls(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sampler, "_load_psutil", lambda: None)
    monkeypatch.setattr(sampler, "query_gpus", lambda: [])
    s = ResourceSampler(tmp_path, 4242)
    record = s.tick()
    assert record is not None
    machine = record["machine"]
    assert machine["limited"] is True and machine["cpu_count"] == os.cpu_count()
    assert (machine["cpu_percent"], machine["mem_total"], machine["mem_used"], machine["gpus"]) == (None, None, None,
                                                                                                     [])
    assert record["processes"] == [{"pid": 4242, "ppid": None, "cmd": None, "cpu_percent": None, "rss_bytes": None,
                                    "create_time": None, "status": None}]
    assert s.last_seen_pids() == {4242}
    assert json.loads((tmp_path / "telemetry.jsonl").read_text()) == record


def test_stop_without_start_is_a_no_op(tmp_path: Path) -> None:
    ResourceSampler(tmp_path, os.getpid()).stop()
    assert not (tmp_path / "telemetry.jsonl").exists()


def test_a_failing_tick_is_swallowed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setattr(sampler, "query_gpus", lambda: [])
    assert ResourceSampler(blocker / "sub", os.getpid()).tick() is None  # output dir cannot be created


class _FakePsutil:
    """psutil as the sampler uses it, with CPU times the test sets: the machine readings
    are exact, and the root pid is gone (no process rows)."""

    STATUS_ZOMBIE = "zombie"

    def __init__(self) -> None:
        from collections import namedtuple

        self.Times = namedtuple("Times", "user nice system idle iowait guest guest_nice")
        self.times = self.Times(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)

    def cpu_times(self):  # a namedtuple, as psutil's
        return self.times

    def virtual_memory(self):
        from types import SimpleNamespace

        return SimpleNamespace(total=8 * 2**30, used=2 * 2**30)

    def Process(self, pid: int) -> None:  # psutil's name
        raise ProcessLookupError(pid)


def test_the_machine_cpu_is_measured_between_readings_of_this_sampler(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    fake = _FakePsutil()
    monkeypatch.setattr(sampler, "_load_psutil", lambda: fake)
    monkeypatch.setattr(sampler, "query_gpus", lambda: [])
    s = ResourceSampler(tmp_path, 4242)
    first = s.sample()["machine"]
    assert first["cpu_percent"] is None and first["limited"] is False  # the baseline: nothing measured yet
    assert (first["mem_total"], first["mem_used"]) == (8 * 2**30, 2 * 2**30)
    # 3 s busy (guest time is inside user already) and 9 s idle or waiting: 25%.
    fake.times = fake.Times(2.0, 0.0, 1.0, 8.0, 1.0, 0.5, 0.0)
    assert s.sample()["machine"]["cpu_percent"] == 25.0
    # No CPU time passed: not measured (None, not 0), and the baseline stays where it was.
    assert s.sample()["machine"]["cpu_percent"] is None
    fake.times = fake.Times(2.0, 0.0, 1.0, 11.0, 1.0, 0.5, 0.0)  # 3 s more, all idle
    assert s.sample()["machine"]["cpu_percent"] == 0.0


def test_stopping_takes_a_closing_reading(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An attempt shorter than one period (the demo's are) still gets its CPU use: the
    sampler reads once more when it is stopped."""
    from tests._support import wait_until

    fake = _FakePsutil()
    monkeypatch.setattr(sampler, "_load_psutil", lambda: fake)
    monkeypatch.setattr(sampler, "query_gpus", lambda: [])
    s = ResourceSampler(tmp_path, 4242, period_s=3600)
    s.start()
    wait_until(lambda: (tmp_path / "telemetry.jsonl").exists(), "the first tick")
    fake.times = fake.Times(1.0, 0.0, 1.0, 2.0, 0.0, 0.0, 0.0)
    s.stop()
    ticks = [json.loads(line) for line in (tmp_path / "telemetry.jsonl").read_text().splitlines()]
    assert [tick["machine"]["cpu_percent"] for tick in ticks] == [None, 50.0]
