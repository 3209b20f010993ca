"""The ``fedavg_reduce`` benchmark scenario at smoke scale: row shapes and honesty, never timings."""

from __future__ import annotations

import pytest

from benchmarks import targets
from benchmarks.registry import SCENARIOS

pytestmark = pytest.mark.bench_smoke


def test_fedavg_reduce_smoke_rows():
    scenario = SCENARIOS["fedavg_reduce"]
    assert scenario.section == "performance"
    rows = {row["metric"]: row for row in scenario.run(1, True)}
    assert set(rows) == {"pure_ms_1e4", "fast_ms_1e4", "compact_roundtrip_ms_1e4", "compact_roundtrip_ms_1e4_from_buffers",
                         "stdlib_hex_floor_ms_1e4", "json_lists_roundtrip_ms_1e4"}
    for row in rows.values():
        assert row["scenario"] == "fedavg_reduce" and row["unit"] == "ms"
        if row["status"] == "measured":
            assert row["repeats"] == 1 and row["median"] > 0
    fast = rows["fast_ms_1e4"]
    assert fast["target"] == targets.FEDAVG_FAST_OVER_NUMPY.as_dict()
    if fast["status"] == "measured":
        assert fast["comparator"]["name"] == "numpy weighted mean"
        assert fast["ratio"] == pytest.approx(fast["median"] / fast["comparator"]["median"])
        assert "bit-identical to the pure path: true" in fast["notes"]
    else:
        assert "numpy" in fast["skip_reason"]
    assert "clip events: 0 (honest round)" in rows["pure_ms_1e4"]["notes"]
    # the target is for 1e6 floats; the smoke size carries none rather than a misleading one
    compact = rows["compact_roundtrip_ms_1e4"]
    assert compact["target"] is None and compact["comparator"]["name"].startswith("stdlib base64 floor")
    assert compact["ratio"] == pytest.approx(compact["median"] / compact["comparator"]["median"])
    assert rows["compact_roundtrip_ms_1e4_from_buffers"]["target"] is None
    assert rows["stdlib_hex_floor_ms_1e4"]["target"] is None
    assert rows["stdlib_hex_floor_ms_1e4"]["notes"][0].startswith("informational")


def test_stdlib_floor_round_trips_the_exact_bytes():
    import array
    import binascii

    from benchmarks.scenarios.fedavg_reduce import _stdlib_round_trip

    state = {"w": ([3], [1.5, -0.0, 5e-324])}
    expected = array.array("d", [1.5, -0.0, 5e-324]).tobytes()
    assert _stdlib_round_trip(state, binascii.b2a_base64, binascii.a2b_base64) == [expected]
    assert _stdlib_round_trip(state, memoryview.hex, bytes.fromhex) == [expected]


def test_full_size_compact_row_is_judged_against_the_base64_floor_of_the_same_run():
    from benchmarks.scenarios import fedavg_reduce as scenario

    lists, buffers = scenario._compact_rows(1_000_000, 1, smoke=True)[:2]
    assert (lists["metric"], buffers["metric"]) == ("compact_roundtrip_ms_1e6", "compact_roundtrip_ms_1e6_from_buffers")
    assert lists["status"] == buffers["status"] == "measured"
    assert lists["target"] == targets.FEDAVG_COMPACT_OVER_BASE64_FLOOR.as_dict()
    assert lists["comparator"]["name"].startswith("stdlib base64 floor")
    assert buffers["target"] is None and buffers["notes"][0].startswith("informational")
