"""The files a rank writes under ``ranks/``: a heartbeat is only ``rank-<r>.json``, so the
record a rank leaves of its preemption save, beside it, is never read as a second heartbeat."""

from __future__ import annotations

import json
from pathlib import Path

from flashruntime.monitor.hangs import read_progress
from flashruntime.rank_files import heartbeat_paths, preempted_paths
from flashruntime.viewer.state import _ranks


def _ranks_dir(tmp_path: Path) -> Path:
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    for rank in (10, 2):
        (ranks / f"rank-{rank}.json").write_text(json.dumps({"rank": rank, "step": 5, "ts": 1.0, "pid": 100 + rank}))
    (ranks / "rank-2.preempted.json").write_text(json.dumps({"rank": 2, "step": 5, "pid": 102, "signal": "SIGTERM"}))
    (ranks / "stack-2.txt").write_text("")
    (ranks / "rank-x.json").write_text("{}")
    return ranks


def test_only_heartbeats_are_heartbeats_in_rank_order(tmp_path: Path) -> None:
    ranks = _ranks_dir(tmp_path)
    assert [path.name for path in heartbeat_paths(ranks)] == ["rank-2.json", "rank-10.json"]
    assert [path.name for path in preempted_paths(ranks)] == ["rank-2.preempted.json"]
    assert heartbeat_paths(tmp_path / "missing") == []


def test_a_preempted_rank_is_one_rank_to_the_hang_watch_and_the_run_page(tmp_path: Path) -> None:
    ranks = _ranks_dir(tmp_path)
    assert [beat.rank for beat in read_progress(tmp_path, "launcher.log").beats] == [2, 10]
    assert [record["rank"] for record in _ranks(ranks)] == [2, 10]
