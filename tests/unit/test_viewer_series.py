"""``viewer.series``: a curve's whole history in a bounded number of points, and metrics files
read incrementally — only what was appended, torn last lines left for the next poll."""

from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path

import pytest

from flashruntime.viewer import series
from flashruntime.viewer.series import SERIES_POINTS, Downsampler, MetricsCache, ReadBudget, reduce_points


def _stream(n: int, seed: int = 0) -> list[tuple[int, float, float]]:
    rng = random.Random(seed)
    return [(i, float(i + 1), math.exp(-i / 500) + rng.gauss(0, 0.05)) for i in range(n)]


@pytest.mark.parametrize("n", [0, 1, 2, 3, 10, SERIES_POINTS, SERIES_POINTS + 1, 5_000, 100_003])
def test_the_bound_holds_and_the_first_last_and_extreme_points_are_kept(n: int) -> None:
    points = _stream(n)
    kept = Downsampler(SERIES_POINTS).extend(points).points()
    assert len(kept) <= SERIES_POINTS
    assert len(kept) == min(n, len(kept))
    if n <= SERIES_POINTS // 2:
        assert kept == points  # nothing to drop
    if n:
        assert kept[0] == points[0] and kept[-1] == points[-1]  # the beginning is never cut
        assert min(points, key=lambda p: p[2]) in kept and max(points, key=lambda p: p[2]) in kept
        assert [p[0] for p in kept] == sorted({p[0] for p in kept})  # in stream order, each once


def test_every_stretch_of_a_long_stream_is_represented() -> None:
    """Min/max buckets cover the stream evenly: no stretch of it (like the start) thins out."""
    n = 50_000
    kept = Downsampler(SERIES_POINTS).extend(_stream(n)).points()
    tenths = {p[0] * 10 // n for p in kept}
    assert tenths == set(range(10))
    assert len(kept) > SERIES_POINTS // 2  # the budget is used, not wasted


@pytest.mark.parametrize("limit", [4, 5, 7, 8, 33])
def test_small_limits(limit: int) -> None:
    points = _stream(1_000)
    kept = Downsampler(limit).extend(points).points()
    assert len(kept) <= limit and kept[0] == points[0] and kept[-1] == points[-1]


def test_limits_below_four_are_refused_and_reduce_points_keeps_the_ends() -> None:
    with pytest.raises(ValueError, match="limit must be an int >= 4"):
        Downsampler(3)
    points = _stream(100)
    assert reduce_points(points, 2) == [points[0], points[-1]]
    assert reduce_points(points, 100) == points
    assert len(reduce_points(points, 10)) <= 10


def _write(path: Path, records: list[dict], tail: str = "") -> None:
    with open(path, "a") as handle:
        handle.write("".join(json.dumps(r) + "\n" for r in records) + tail)


def _records(start: int, stop: int) -> list[dict]:
    return [{"step": s, "loss": 1.0 / s, "ts": 1000.0 + s} for s in range(start, stop)]


def test_appends_are_read_incrementally_and_agree_with_one_whole_read(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    cache = MetricsCache()
    _write(path, _records(1, 3_001))
    first = cache.read(path)
    assert first.records == 3_000 and first.read_fraction == 1.0
    budget = ReadBudget()
    cache.read(path, budget)
    assert budget.left == series.READ_BYTES_PER_POLL  # nothing appended: nothing read
    _write(path, _records(3_001, 4_501))
    budget = ReadBudget()
    later = cache.read(path, budget)
    assert series.READ_BYTES_PER_POLL - budget.left == path.stat().st_size - _size_of(_records(1, 3_001))
    whole = MetricsCache().read(path)
    assert later.records == whole.records == 4_500
    assert later.series == whole.series
    points, by_step = later.series["loss"]
    assert by_step and len(points) <= SERIES_POINTS
    assert points[0] == (0, 1, 1.0) and points[-1] == (4_499, 4_500, 1.0 / 4_500)
    assert [r["step"] for r in later.recent] == list(range(4_501 - series.RECENT_RECORDS, 4_501))


def _size_of(records: list[dict]) -> int:
    return sum(len(json.dumps(r)) + 1 for r in records)


def test_a_torn_last_line_is_left_for_the_next_poll_and_read_once_whole(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    cache = MetricsCache()
    _write(path, _records(1, 4), tail='{"step": 4, "lo')
    view = cache.read(path)
    assert view.records == 3 and view.recent[-1]["step"] == 3
    assert view.read_fraction < 1  # the torn line is still to be read
    with open(path, "a") as handle:
        handle.write('ss": 0.25}\nnot json\n[1, 2]\n\n')
    view = cache.read(path)
    assert view.records == 4 and view.recent[-1] == {"step": 4, "loss": 0.25}  # once, whole
    assert [p[1] for p in view.series["loss"][0]] == [1, 2, 3, 4]
    assert view.read_fraction == 1.0


def test_a_replaced_or_truncated_file_is_read_again_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    cache = MetricsCache()
    _write(path, _records(1, 101))
    assert cache.read(path).records == 100
    replacement = tmp_path / "new.jsonl"
    _write(replacement, [{"step": 1, "loss": 9.0}])
    os.replace(replacement, path)  # another inode
    view = cache.read(path)
    assert view.records == 1 and view.series["loss"][0] == [(0, 1, 9.0)]
    path.write_text("")  # truncated in place
    assert cache.read(path).records == 0
    _write(path, [{"step": 7, "acc": 0.5}] * 3)  # the same inode, written again from the start
    view = cache.read(path)
    assert view.records == 3 and "loss" not in view.series and view.series["acc"][0][0] == (0, 7, 0.5)
    path.unlink()
    assert cache.read(path).records == 0


def test_a_backlog_is_read_from_its_beginning_over_several_polls(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    _write(path, _records(1, 2_001))
    cache = MetricsCache()
    chunk = path.stat().st_size // 3 + 7
    view = cache.read(path, ReadBudget(chunk))
    assert 0 < view.read_fraction < 1 and view.series["loss"][0][0] == (0, 1, 1.0)
    polls = 1
    while view.read_fraction < 1:
        view = cache.read(path, ReadBudget(chunk))
        polls += 1
        assert polls < 10, "hang guard"
    assert polls >= 3 and view.records == 2_000
    assert view.series == MetricsCache().read(path).series


def test_a_line_longer_than_the_limit_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(series, "MAX_LINE_BYTES", 100)
    path = tmp_path / "metrics.jsonl"
    cache = MetricsCache()
    path.write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "note": "' + "x" * 300)
    assert cache.read(path, ReadBudget(64)).records == 1
    cache.read(path, ReadBudget(150))  # the long line fills the read: it is given up on
    with open(path, "a") as handle:
        handle.write('"}\n{"step": 3, "loss": 0.5}\n')
    view = cache.read(path)
    assert view.records == 2 and [p[1] for p in view.series["loss"][0]] == [1, 3]


def test_the_fallback_key_steps_and_odd_values(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"ts": 1, "phase": "train", "ok": true, "acc": 0.5}\n{"acc": NaN}\n{"acc": 1e999}\n'
                    '{"acc": 0.75, "step": 3}\n')
    view = MetricsCache().read(path)
    points, by_step = view.series["acc"]
    assert points == [(0, None, 0.5), (3, 3, 0.75)] and by_step is False  # NaN/inf are no points
    assert view.recent[1] == {"acc": None}


def test_the_cache_forgets_the_least_recently_read_files(tmp_path: Path) -> None:
    cache = MetricsCache(max_files=2)
    paths = [tmp_path / f"m{i}.jsonl" for i in range(3)]
    for path in paths:
        _write(path, _records(1, 3))
        cache.read(path)
    # Forgotten: read again from nothing (and a poll without budget reads nothing); remembered: as it was.
    assert cache.read(paths[2], ReadBudget(0)).records == 2
    assert cache.read(paths[0], ReadBudget(0)).records == 0
