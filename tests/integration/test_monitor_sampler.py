"""The resource sampler on real processes: the sampler follows a live process tree, primes CPU
readings (null on first sighting), and degrades to ``limited`` when psutil is missing."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flashruntime.monitor import ResourceSampler, evidence_from_telemetry
from tests._support import pid_alive, run_core_only, wait_until

_TREE = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(60)\n"
)


def _ticks(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_sampler_follows_a_real_process_tree(tmp_path: Path) -> None:
    pytest.importorskip("psutil")
    parent = subprocess.Popen([sys.executable, "-c", _TREE], stdout=subprocess.PIPE, text=True)
    child_pid = -1
    try:
        child_pid = int(parent.stdout.readline())  # type: ignore[union-attr]
        sampler = ResourceSampler(tmp_path, parent.pid, period_s=0.2)
        sampler.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(_ticks_or_empty(tmp_path)) < 3:
            time.sleep(0.1)
        seen = sampler.last_seen_pids()
        sampler.stop()
        sampler.stop()  # idempotent
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()  # type: ignore[union-attr]
        if child_pid > 0:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child_pid, signal.SIGKILL)
    ticks = _ticks(tmp_path / "telemetry.jsonl")
    assert len(ticks) >= 4  # three or more while it ran, and the closing one
    assert seen == {parent.pid, child_pid}
    # The last regular tick: the closing one, taken at stop(), may come too soon after it to measure CPU.
    first, later = ticks[0], ticks[-2]
    assert first["machine"]["limited"] is False and first["machine"]["cpu_percent"] is None
    assert isinstance(later["machine"]["cpu_percent"], float)
    assert later["machine"]["mem_total"] > later["machine"]["mem_used"] > 0
    rows = {row["pid"]: row for row in later["processes"]}
    assert set(rows) == {parent.pid, child_pid}
    assert rows[child_pid]["ppid"] == parent.pid and "time.sleep(60)" in rows[child_pid]["cmd"]
    assert rows[parent.pid]["rss_bytes"] > 0 and rows[parent.pid]["create_time"] > 0
    assert {row["cpu_percent"] for row in first["processes"]} == {None}  # first sighting
    assert all(isinstance(row["cpu_percent"], float) for row in later["processes"])
    evidence = evidence_from_telemetry(tmp_path / "telemetry.jsonl", exit_code=-9)
    assert evidence.wall_seconds is not None and evidence.wall_seconds > 0
    assert evidence.cpu_percent_mean is not None and evidence.exit_code == -9


def _ticks_or_empty(directory: Path) -> list[dict]:
    path = directory / "telemetry.jsonl"
    return _ticks(path) if path.exists() else []


def test_sampler_drops_a_vanished_root(tmp_path: Path) -> None:
    pytest.importorskip("psutil")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    record = ResourceSampler(tmp_path, gone.pid).tick()
    assert record is not None and record["processes"] == []


def test_without_psutil_the_sampler_is_limited(tmp_path: Path) -> None:
    code = (
        "import json, os, subprocess, sys, time\n"
        "from flashruntime.monitor import ResourceSampler, evidence_from_telemetry\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
        f"s = ResourceSampler({str(tmp_path)!r}, child.pid, period_s=0.2)\n"
        "s.start(); time.sleep(0.7); s.stop(); child.kill(); child.wait()\n"
        f"ev = evidence_from_telemetry({str(tmp_path / 'telemetry.jsonl')!r})\n"
        "print(json.dumps({'pid': child.pid, 'seen': sorted(s.last_seen_pids()), 'ev': ev.model_dump(),\n"
        "                  'psutil': 'psutil' in sys.modules}))\n"
    )
    result = run_core_only(code, refuse=("psutil",))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    ticks = _ticks(tmp_path / "telemetry.jsonl")
    assert len(ticks) >= 2 and report["psutil"] is False
    for tick in ticks:
        machine = tick["machine"]
        assert machine["limited"] is True
        assert (machine["cpu_percent"], machine["mem_total"], machine["mem_used"]) == (None, None, None)
        assert tick["processes"] == [{"pid": report["pid"], "ppid": None, "cmd": None, "cpu_percent": None,
                                      "rss_bytes": None, "create_time": None, "status": None}]
    assert report["seen"] == [report["pid"]]
    assert report["ev"]["cpu_percent_mean"] is None  # not measured, not zero
    assert report["ev"]["wall_seconds"] is not None and report["ev"]["wall_seconds"] > 0


def test_last_seen_pids_outlive_the_root_for_the_non_linux_sweep(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside Linux the launcher's sweep finds orphans only through ``last_seen_pids()``
   , and reads it after the root exited: ticks that can no longer see the tree
    (root a zombie, then gone) must leave the last set as it was."""
    pytest.importorskip("psutil")
    from flashruntime.launchers import _sweep

    # `read` returns at EOF on stdin, so the test decides when the leader exits.
    leader = subprocess.Popen(["sh", "-c", "sleep 300 & echo $!; read line"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    sampler = ResourceSampler(tmp_path, leader.pid, period_s=0.1)
    orphan = -1
    try:
        orphan = int(leader.stdout.readline())  # type: ignore[union-attr]
        sampler.start()
        wait_until(lambda: sampler.last_seen_pids() == {leader.pid, orphan}, "the sampler to see the tree")
        leader.stdin.close()  # type: ignore[union-attr]
        os.waitid(os.P_PID, leader.pid, os.WEXITED | os.WNOWAIT)  # exited, not yet reaped: a zombie
        _wait_for_ticks(tmp_path, 2)
        assert sampler.last_seen_pids() == {leader.pid, orphan}
        leader.wait()
        _wait_for_ticks(tmp_path, 2)
        assert _ticks(tmp_path / "telemetry.jsonl")[-1]["processes"] == []  # the root is gone
        assert sampler.last_seen_pids() == {leader.pid, orphan}
        sampler.stop()
        # The sweep without /proc (macOS) stops the orphan from exactly that set.
        monkeypatch.setattr(_sweep, "_PROC", tmp_path / "no-proc")
        monkeypatch.setattr(sys, "platform", "darwin")
        marker = f"FLASHML_OUTPUT_DIR={tmp_path}".encode()
        touched = _sweep.sweep(lambda: _sweep.attempt_processes(marker, [leader.pid], sampler.last_seen_pids()), 0.5)
        assert touched == {orphan}
        wait_until(lambda: not pid_alive(orphan), "the orphan to be reaped")
    finally:
        monkeypatch.undo()
        sampler.stop()
        if leader.poll() is None:
            leader.kill()
        leader.wait()
        leader.stdout.close()  # type: ignore[union-attr]
        if orphan > 0:
            with contextlib.suppress(ProcessLookupError):
                os.kill(orphan, signal.SIGKILL)


def _wait_for_ticks(directory: Path, more: int) -> None:
    start = len(_ticks_or_empty(directory))
    wait_until(lambda: len(_ticks_or_empty(directory)) >= start + more, f"{more} more sampler ticks")
