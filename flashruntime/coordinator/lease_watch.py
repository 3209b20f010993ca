"""Watching a lease for its cancel: ``GET /v1alpha1/attempts/{id}/watch`` answers as soon as
the lease stops being live, or when its wait is over, whichever comes first.

A cancel in this process wakes every watch at once (``StandingChanges.notify``); a cancel
that another coordinator process sharing the database made is seen at the next recheck, so
a worker learns of a cancel within a second or two instead of at its next heartbeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable

__all__ = ["MAX_WATCH_S", "RECHECK_S", "StandingChanges", "watch_standing"]

MAX_WATCH_S = 20.0  # below every client's request timeout, so a watch is never taken for a dead coordinator
RECHECK_S = 1.0  # how stale a watch may be about a cancel made by another coordinator process

Standing = tuple[str, str | None]


class StandingChanges:
    """Wakes the watches of this process when a lease may have stopped being live (a cancel).
    ``notify`` may be called from any thread; each watch waits on its own event loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()

    def notify(self) -> None:
        with self._lock:
            waiters = list(self._waiters)
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # its loop has closed: nobody is waiting there
                loop.call_soon_threadsafe(event.set)

    @contextlib.asynccontextmanager
    async def listening(self) -> AsyncIterator[asyncio.Event]:
        """An event set by every ``notify`` while the block runs (registered first, so a
        notify between a read and the wait is never missed)."""
        waiter = (asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            self._waiters.add(waiter)
        try:
            yield waiter[1]
        finally:
            with self._lock:
                self._waiters.discard(waiter)


async def watch_standing(read: Callable[[], Standing], changes: StandingChanges, wait_s: float, *,
                         recheck_s: float = RECHECK_S) -> Standing:
    """``read()`` (a blocking store read, run off the event loop) once now, and again on each
    notify and every ``recheck_s``, until it is no longer ``live`` or ``wait_s`` has passed;
    returns the last reading."""
    from starlette.concurrency import run_in_threadpool

    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(0.0, wait_s)
    async with changes.listening() as changed:
        while True:
            changed.clear()
            standing = await run_in_threadpool(read)
            left = deadline - loop.time()
            if standing[0] != "live" or left <= 0:
                return standing
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout=min(left, recheck_s))
