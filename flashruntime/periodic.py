"""``Periodic``: a function called every so often on a daemon thread while something runs,
and once more when it is stopped (so what happened in the last interval is not missed).
The watchers of a running attempt are built on it. Standard library only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["Periodic"]


class Periodic:
    """Call ``tick()`` every ``period_s`` seconds from ``start()`` until ``stop()``, then once
    more on the stopping thread (unless ``last_tick`` is False). A tick that returns False
    ends the calls. ``tick`` must not raise: what it watches is not its to fail."""

    def __init__(self, tick: Callable[[], bool | None], period_s: float, name: str, *, at_once: bool = False,
                 last_tick: bool = True) -> None:
        self._tick = tick
        self._at_once = at_once  # the first call as the thread starts, not one period later
        self._last_tick = last_tick
        self._period_s = period_s
        self._name = name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Periodic:
        self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        if self._last_tick:
            self._tick()

    def _loop(self) -> None:
        if self._at_once and self._tick() is False:
            return
        while not self._stop.wait(self._period_s):
            if self._tick() is False:
                return
