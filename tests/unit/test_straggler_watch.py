"""The straggler rule (a rank whose median compute time over the window is ``factor`` times
the other ranks' median), its episodes (reported once, ended below ``recovered_below``), the
heartbeat reader, and the watch's event and run.json record."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flashruntime.monitor.straggler_watch import (
    Episodes,
    RankTimes,
    StragglerWatch,
    detect,
    ratios,
    read_rank_times,
)


def times(rank: int, values: list[float], *, host: str | None = "node-a", step: int | None = 20) -> RankTimes:
    return RankTimes(rank=rank, host=host, step=step, compute_s=tuple(values))


def steady(rank: int, seconds: float, count: int = 10, **kwargs: Any) -> RankTimes:
    return times(rank, [seconds] * count, **kwargs)


# --- the rule ---------------------------------------------------------------------------


def test_a_rank_twice_as_slow_as_its_peer_is_a_straggler() -> None:
    found = detect([steady(0, 0.1), steady(1, 0.2, host="node-b", step=17)])
    assert [(s.rank, s.host, s.step) for s in found] == [(1, "node-b", 17)]
    assert found[0].ratio == pytest.approx(2.0)
    assert (found[0].median_s, found[0].others_s) == (pytest.approx(0.2), pytest.approx(0.1))


def test_ranks_at_the_same_pace_have_no_straggler() -> None:
    assert detect([steady(0, 0.1), steady(1, 0.11), steady(2, 0.105)]) == []


def test_the_factor_is_inclusive_and_configurable() -> None:
    assert [s.rank for s in detect([steady(0, 0.25), steady(1, 0.375)])] == [1]  # exactly 1.5x
    assert detect([steady(0, 0.25), steady(1, 0.37)]) == []
    assert detect([steady(0, 0.25), steady(1, 0.375)], factor=2.0) == []
    assert [s.rank for s in detect([steady(0, 0.25), steady(1, 0.3)], factor=1.1)] == [1]


def test_the_others_median_is_not_pulled_by_one_fast_rank() -> None:
    # Against the median of 0.1, 0.1, 0.01 (0.1), rank 3 at 0.16 is 1.6x: a straggler;
    # against their mean (0.07) the fast rank would make every other rank look slow.
    found = detect([steady(0, 0.1), steady(1, 0.1), steady(2, 0.01), steady(3, 0.16)])
    assert [s.rank for s in found] == [3]
    assert found[0].others_s == pytest.approx(0.1)


def test_one_slow_step_in_the_window_is_no_straggler() -> None:
    spiky = times(1, [0.1] * 9 + [0.9])  # a garbage collection, a page fault: one step
    assert detect([steady(0, 0.1), spiky]) == []


def test_only_the_last_window_counts() -> None:
    recovered = times(1, [0.3] * 10 + [0.1] * 10)  # slow once, at pace for the last 10 steps
    assert detect([steady(0, 0.1, count=20), recovered]) == []
    assert [s.rank for s in detect([steady(0, 0.1, count=20), recovered], window=20)] == [1]


def test_nothing_is_judged_before_two_ranks_have_a_full_window() -> None:
    assert detect([steady(0, 0.1, count=9), steady(1, 0.5, count=9)]) == []
    assert detect([steady(0, 0.1), steady(1, 0.5, count=9)]) == []  # rank 1's window is not full
    assert detect([steady(1, 0.5)]) == []  # one rank has no peers
    assert detect([]) == []


def test_a_rank_without_a_full_window_is_left_out_of_the_others() -> None:
    found = detect([steady(0, 0.1), steady(1, 0.2), steady(2, 5.0, count=3)])
    assert [s.rank for s in found] == [1] and found[0].others_s == pytest.approx(0.1)


def test_peers_that_report_no_compute_time_give_no_ratio() -> None:
    assert detect([steady(0, 0.0), steady(1, 0.2)]) == []


def test_ratios_compares_every_rank() -> None:
    compared = ratios([steady(0, 0.1), steady(1, 0.2)])
    assert [(s.rank, round(s.ratio, 3)) for s in compared] == [(0, 0.5), (1, 2.0)]


# --- episodes ---------------------------------------------------------------------------


def reading(ratio_of_rank_1: float) -> list:
    return ratios([steady(0, 0.1), steady(1, 0.1 * ratio_of_rank_1)])


def test_an_episode_is_reported_once_while_it_lasts() -> None:
    episodes = Episodes()
    started, ended = episodes.update(reading(2.0))
    assert [s.rank for s in started] == [1] and ended == []
    for ratio in (2.0, 1.8, 1.4, 1.3):  # still slow, or back between the two thresholds: the same episode
        assert episodes.update(reading(ratio)) == ([], [])
    started, ended = episodes.update(reading(1.1))
    assert started == [] and [s.rank for s in ended] == [1]
    assert episodes.update(reading(1.1)) == ([], [])
    started, _ = episodes.update(reading(1.6))  # slow again: a new episode
    assert [s.rank for s in started] == [1]


def test_a_rank_missing_from_a_reading_keeps_its_episode() -> None:
    episodes = Episodes()
    episodes.update(reading(2.0))
    assert episodes.update([]) == ([], [])
    assert episodes.update(reading(2.0)) == ([], [])
    assert set(episodes.active) == {1}


def test_the_recovery_threshold_must_lie_between_one_and_the_factor() -> None:
    with pytest.raises(ValueError, match=r"recovered_below \(1.6\) must lie between 1 and factor \(1.5\)"):
        Episodes(factor=1.5, recovered_below=1.6)


# --- the heartbeat files ----------------------------------------------------------------


def beat(ranks_dir: Path, rank: int, compute: Any, **extra: Any) -> None:
    ranks_dir.mkdir(parents=True, exist_ok=True)
    record = {"rank": rank, "step": 12, "ts": 1.0, "host": "node-a", "compute_s": compute, **extra}
    (ranks_dir / f"rank-{rank}.json").write_text(json.dumps(record))


def test_read_rank_times_takes_what_the_heartbeats_carry(tmp_path: Path) -> None:
    ranks = tmp_path / "ranks"
    beat(ranks, 0, [0.1, 0.2])
    beat(ranks, 1, [0.3, True, "x", 0.4], host=None, step=None)
    (ranks / "rank-2.json").write_text('{"rank": 2, "compute_s": [0.1')  # torn mid-write
    (ranks / "rank-3.json").write_text(json.dumps({"rank": 3, "step": 4}))  # a helper without compute times
    (ranks / "rank-4.json").write_text(json.dumps(["not", "a", "record"]))
    assert read_rank_times(ranks) == [
        RankTimes(rank=0, host="node-a", step=12, compute_s=(0.1, 0.2)),
        RankTimes(rank=1, host=None, step=None, compute_s=(0.3, 0.4)),
    ]
    assert read_rank_times(tmp_path / "absent") == []


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.rows: dict[str, dict[str, Any]] = {}

    def record_event(self, kind: str, message: str) -> None:
        self.events.append((kind, message))

    def update_attempt(self, attempt_id: str, changes: dict[str, Any]) -> None:
        self.rows.setdefault(attempt_id, {}).update(changes)


def test_the_watch_records_one_event_and_the_episode(tmp_path: Path) -> None:
    recorder = Recorder()
    watch = StragglerWatch(tmp_path, "task-000", recorder.record_event, recorder.update_attempt, clock=lambda: 50.0)
    watch.read()
    assert recorder.events == []  # no heartbeats yet
    beat(tmp_path / "ranks", 0, [0.1] * 10)
    beat(tmp_path / "ranks", 1, [0.2] * 10, host="node-b")
    watch.read()
    watch.read()
    assert [kind for kind, _ in recorder.events] == ["STRAGGLER_DETECTED"]
    assert recorder.events[0][1] == (
        "task-000: rank 1 on node-b is a straggler: it computes 2.0x as long as the other ranks' median "
        "(0.200 s against 0.100 s per step over its last 10 steps at step 12); every all-reduce waits for it")
    assert recorder.rows["task-000"]["stragglers"] == [{
        "rank": 1, "host": "node-b", "step": 12, "ratio": 2.0, "median_s": 0.2, "others_s": 0.1, "ts": 50.0,
        "ended_step": None}]
    beat(tmp_path / "ranks", 1, [0.1] * 10, host="node-b", step=30)
    watch.read()
    assert len(recorder.events) == 1
    assert recorder.rows["task-000"]["stragglers"][0]["ended_step"] == 30


def test_the_watch_judges_once_more_when_stopped(tmp_path: Path) -> None:
    recorder = Recorder()
    watch = StragglerWatch(tmp_path, "task-000", recorder.record_event, recorder.update_attempt,
                           period_s=3600).start()
    beat(tmp_path / "ranks", 0, [0.1] * 10)
    beat(tmp_path / "ranks", 1, [0.3] * 10)
    watch.stop()
    assert [kind for kind, _ in recorder.events] == ["STRAGGLER_DETECTED"]


def test_a_failing_recorder_never_escapes_the_watch(tmp_path: Path) -> None:
    def broken(*_: Any) -> None:
        raise OSError("disk full")

    beat(tmp_path / "ranks", 0, [0.1] * 10)
    beat(tmp_path / "ranks", 1, [0.3] * 10)
    StragglerWatch(tmp_path, "task-000", broken, broken).read()
