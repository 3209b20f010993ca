"""The coordinator profile's attribution: a sample belongs to the first layer met from the
innermost frame out, waits are kept apart, and py-spy's collapsed lines are summed by layer."""

from __future__ import annotations

from pathlib import Path

from benchmarks.profile_coordinator import layer_of, read_collapsed

COMMIT = "_Transaction.__exit__ (flashruntime/db/sqlite.py:60)"
MANAGER = "LeaseManager.complete (flashruntime/leases/manager.py:300)"
ROUTE = "fleet_router.<locals>.complete (flashruntime/coordinator/routes_fleet.py:156)"
POLL = "EpollSelector.select (selectors.py:468)"


def test_the_innermost_known_frame_decides() -> None:
    assert layer_of([COMMIT, MANAGER, ROUTE]) == "database: transaction begin/commit"
    assert layer_of([MANAGER, ROUTE]) == "lease manager and placement"
    assert layer_of(["helper (mylib/x.py:1)", ROUTE]) == "coordinator logic"
    assert layer_of([POLL, "BaseEventLoop.run_forever (asyncio/base_events.py:607)"]).startswith("waiting")
    assert layer_of(["helper (mylib/x.py:1)"]) == "other"


def test_collapsed_stacks_are_summed_by_layer_and_innermost_frame(tmp_path: Path) -> None:
    raw = tmp_path / "profile.txt"
    raw.write_text(f"{ROUTE};{MANAGER};{COMMIT} 7\n{ROUTE};{MANAGER} 2\n{ROUTE};{MANAGER};{COMMIT} 1\nnot a line\n")
    counts, leaves = read_collapsed(raw)
    assert counts == {"database: transaction begin/commit": 8, "lease manager and placement": 2}
    assert leaves["database: transaction begin/commit"] == {COMMIT: 8}
