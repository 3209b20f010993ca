"""``Periodic``: calls every period until stopped, once more on stop unless told not to, and
no more once a tick says it is done."""

from __future__ import annotations

import threading

from flashruntime.periodic import Periodic


def test_a_tick_that_returns_false_ends_the_calls_and_the_last_tick_is_optional() -> None:
    calls: list[int] = []
    ended = threading.Event()

    def tick() -> bool:
        calls.append(len(calls))
        if len(calls) == 3:
            ended.set()
            return False
        return True

    periodic = Periodic(tick, 0.01, "test-periodic", last_tick=False).start()
    assert ended.wait(60)
    periodic.stop()
    assert calls == [0, 1, 2]  # none after the False, none on stop


def test_stop_calls_once_more_by_default() -> None:
    calls: list[str] = []
    periodic = Periodic(lambda: calls.append("tick"), 3600.0, "test-periodic").start()
    periodic.stop()
    assert calls == ["tick"]  # the last interval's call, on the stopping thread
