"""The hang rule: what counts as progress, the timeout, who stopped first, and reading an
attempt directory. A fake clock (plain numbers) drives every case."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flashruntime.errors import InvalidSubmission
from flashruntime.monitor import stacks as monitor_stacks
from flashruntime.monitor.hang_watch import hang_setting, task_hang_setting
from flashruntime.monitor.hangs import (
    HEARTBEATS,
    LOG,
    METRICS,
    Progress,
    ProgressReading,
    RankBeat,
    hang_timeout,
    judge,
    observe,
    read_progress,
)
from flashruntime.torch import _hang as helper_hang


def beats(*steps: int, ts: float = 0.0) -> ProgressReading:
    return ProgressReading(beats=tuple(RankBeat(rank, step, ts + step, 100 + rank) for rank, step in enumerate(steps)))


def feed(readings: list[tuple[float, ProgressReading]], start: float = 0.0) -> Progress:
    progress = Progress(started_at=start)
    for now, reading in readings:
        progress = observe(progress, reading, now)
    return progress


@pytest.mark.parametrize(("setting", "median", "source", "expected"), [
    (15.0, None, LOG, 15.0),  # a setting wins, whatever the source
    (15.0, 0.5, HEARTBEATS, 15.0),
    (0.0, 0.5, HEARTBEATS, None),  # 0: off
    (None, 0.5, HEARTBEATS, 60.0),  # 10 x 0.5 s is under the floor
    (None, 9.0, METRICS, 90.0),
    (None, None, HEARTBEATS, None),  # no step time yet: nothing to scale
    (None, 2.0, LOG, None),  # output alone says nothing of how long a step takes
])
def test_the_timeout(setting: float | None, median: float | None, source: str, expected: float | None) -> None:
    assert hang_timeout(setting, median, source) == expected


def test_steps_that_stop_make_a_hang_once_the_timeout_passes() -> None:
    progress = feed([(1.0, beats(0, 0)), (2.0, beats(2, 2)), (3.0, beats(4, 4)), (4.0, beats(6, 6))])
    assert progress.median_step_s == pytest.approx(0.5)
    assert judge(progress, 4.0 + 59.9, None) is None  # default: max(10 x 0.5 s, 60 s)
    hang = judge(progress, 4.0 + 60.0, None)
    assert hang is not None and hang.timeout_s == 60.0 and hang.idle_s == pytest.approx(60.0)
    assert hang.source == HEARTBEATS and hang.last_step == 6
    assert judge(progress, 4.0 + 10.0, 10.0) is not None and judge(progress, 4.0 + 9.0, 10.0) is None


def test_nothing_is_judged_before_the_source_first_advances() -> None:
    started = feed([(1.0, beats(0, 0))])  # prepare's heartbeat, then a long first step
    assert judge(started, 1000.0, 5.0) is None
    assert judge(feed([(1.0, beats(0, 0)), (2.0, beats(1, 1))]), 7.0, 5.0) is not None


def test_a_step_record_already_there_at_the_first_look_is_progress_made() -> None:
    # A fast script can write its first steps before the watch first looks, then stop.
    first_look = feed([(0.5, ProgressReading(metrics_step=3, metrics_ts=0.4))])
    assert judge(first_look, 4.0, 5.0) is None
    hang = judge(first_look, 6.0, 5.0)
    assert hang is not None and hang.last_step == 3 and hang.source == "metrics.jsonl"
    # Output alone at the first look is still the script starting.
    assert judge(feed([(0.5, ProgressReading(log_size=100))]), 600.0, 5.0) is None


def test_a_rank_still_advancing_is_progress() -> None:
    progress = feed([(1.0, beats(1, 1)), (2.0, beats(2, 2)), (3.0, beats(3, 2)), (9.0, beats(9, 2))])
    assert judge(progress, 12.0, 5.0) is None
    hang = judge(progress, 14.0, 5.0)
    assert hang is not None
    assert [(b.rank, b.step) for b in hang.stalled] == [(1, 2)]  # the lowest step
    assert hang.stopped_s == {0: pytest.approx(5.0), 1: pytest.approx(12.0)}
    assert hang.describe() == ("no progress for 5.0 s (hang timeout 5 s, by heartbeats): rank 1 stopped advancing "
                               "at step 2 (12.0 s ago); rank 0 at step 9")


def test_when_every_rank_is_at_one_step_the_first_to_go_quiet_is_named() -> None:
    a = ProgressReading(beats=(RankBeat(0, 4, 10.0), RankBeat(1, 4, 10.2)))
    b = ProgressReading(beats=(RankBeat(0, 6, 11.0), RankBeat(1, 6, 11.0)))
    c = ProgressReading(beats=(RankBeat(0, 6, 11.0), RankBeat(1, 7, 11.6)))  # rank 1 beat once more ...
    d = ProgressReading(beats=(RankBeat(0, 7, 11.9), RankBeat(1, 7, 11.6)))  # ... then rank 0 caught up: DDP
    progress = feed([(1.0, a), (2.0, b), (3.0, c), (4.0, d)])
    hang = judge(progress, 20.0, 10.0)
    assert hang is not None and [b.rank for b in hang.stalled] == [1]
    assert hang.describe().endswith(": every rank stopped at step 7; rank 1 stopped first (17.0 s ago)")


def test_ranks_that_said_they_are_exiting_are_not_hung() -> None:
    ending = ProgressReading(beats=(RankBeat(0, 6, 3.0, exiting=True), RankBeat(1, 6, 3.0, exiting=True)))
    progress = feed([(1.0, beats(4, 4)), (2.0, beats(6, 6)), (3.0, ending)])
    assert judge(progress, 1000.0, 5.0) is None  # a slow teardown is no hang
    one_left = ProgressReading(beats=(RankBeat(0, 6, 3.0, exiting=True), RankBeat(1, 5, 2.0)))
    hang = judge(feed([(1.0, beats(4, 4)), (2.0, beats(6, 5)), (3.0, one_left)]), 20.0, 5.0)
    assert hang is not None and [b.rank for b in hang.stalled] == [1]


def test_output_no_longer_counts_once_heartbeats_exist() -> None:
    chatty = [(float(t), ProgressReading(beats=(RankBeat(0, 3 if t > 1 else 1, 1.0 if t <= 1 else 2.0),),
                                         log_size=100 * t)) for t in range(1, 30)]
    hang = judge(feed(chatty), 29.0, 10.0)
    assert hang is not None and hang.idle_s == pytest.approx(27.0)


def test_a_log_without_steps_is_judged_against_a_setting_only() -> None:
    progress = feed([(1.0, ProgressReading(log_size=10)), (2.0, ProgressReading(log_size=20))])
    assert progress.source == LOG
    assert judge(progress, 10_000.0, None) is None
    hang = judge(progress, 32.0, 30.0)
    assert hang is not None and hang.stalled == () and hang.describe() == (
        "no progress for 30.0 s (hang timeout 30 s, by log)")


def test_metrics_steps_stand_in_for_heartbeats_and_sources_only_rise() -> None:
    progress = feed([(1.0, ProgressReading(log_size=5)), (2.0, ProgressReading(metrics_step=1, metrics_ts=1.0)),
                     (3.0, ProgressReading(metrics_step=3, metrics_ts=2.0, log_size=9))])
    assert progress.source == METRICS and progress.advanced and progress.step_times == (0.5,)
    # a reading without metrics (the file being rotated) neither regresses the source nor counts
    assert observe(progress, ProgressReading(log_size=99), 4.0) == progress
    hang = judge(progress, 70.0, None)
    assert hang is not None and hang.describe() == (
        "no progress for 67.0 s (hang timeout 60 s, by metrics.jsonl): last step 3")


def test_reading_an_attempt_directory(tmp_path: Path) -> None:
    assert read_progress(tmp_path, "launcher.log") == ProgressReading()
    (tmp_path / "ranks").mkdir()
    (tmp_path / "ranks" / "rank-0.json").write_text(json.dumps({"rank": 0, "step": 12, "ts": 5.5, "pid": 42}))
    (tmp_path / "ranks" / "rank-1.json").write_text('{"rank": 1, "st')  # torn: skipped
    (tmp_path / "ranks" / "rank-2.json").write_text(json.dumps({"rank": 2, "step": 12, "ts": 5.0, "exiting": True}))
    (tmp_path / "ranks" / "stack-0.txt").write_text("Thread 0x1 ...")  # a stack dump is no heartbeat
    (tmp_path / "metrics.jsonl").write_text('{"step": 11, "ts": 4.0}\n{"step": 12, "ts": 5.0}\n{"step": 1')
    (tmp_path / "launcher.log").write_text("hello\n")
    assert read_progress(tmp_path, "launcher.log") == ProgressReading(
        beats=(RankBeat(0, 12, 5.5, 42), RankBeat(2, 12, 5.0, None, exiting=True)), metrics_step=12, metrics_ts=5.0,
        log_size=6)


def test_the_setting_from_the_argument_else_the_environment() -> None:
    assert hang_setting(None, {}) is None
    assert hang_setting(None, {"FLASHML_HANG_TIMEOUT_S": " 45 "}) == 45.0
    assert hang_setting(20, {"FLASHML_HANG_TIMEOUT_S": "45"}) == 20.0
    assert hang_setting(0, {}) == 0.0
    with pytest.raises(InvalidSubmission, match=r"FLASHML_HANG_TIMEOUT_S='soon' is not a number of seconds"):
        hang_setting(None, {"FLASHML_HANG_TIMEOUT_S": "soon"})
    with pytest.raises(InvalidSubmission, match=r"hang_timeout_s must be a finite number of seconds >= 0 .* -1"):
        hang_setting(-1, {})
    with pytest.raises(InvalidSubmission, match=r"got True"):
        hang_setting(True, {})  # type: ignore[arg-type]


def test_the_rank_and_the_monitor_agree_on_the_self_dump(tmp_path: Path) -> None:
    assert helper_hang.SELF_DUMP_SIGNAL == monitor_stacks.SELF_DUMP_SIGNAL
    assert helper_hang.self_dump_path(tmp_path, 3) == monitor_stacks.self_dump_path(tmp_path, 3)


def test_a_fleet_task_s_own_hang_timeout_wins_over_its_machine_s() -> None:
    assert task_hang_setting({"FLASHML_HANG_TIMEOUT_S": "4"}, 300.0) == 4.0
    assert task_hang_setting({"FLASHML_HANG_TIMEOUT_S": "0"}, 300.0) == 0.0  # the job turns its watch off
    assert task_hang_setting({"FLASHML_HANG_TIMEOUT_S": " "}, 300.0) == 300.0
    assert task_hang_setting({}, None) is None
    with pytest.raises(InvalidSubmission, match="FLASHML_HANG_TIMEOUT_S='soon' is not a number of seconds"):
        task_hang_setting({"FLASHML_HANG_TIMEOUT_S": "soon"}, 300.0)
