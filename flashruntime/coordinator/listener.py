"""The coordinator's listener under connection pressure: open-file limit, connection bound,
idle connections, and accept errors logged once per interval.

At start ``raise_open_file_limit`` lifts the soft ``RLIMIT_NOFILE`` to the hard one. A
server process then holds at most ``connection_bound(max_connections, limit)``
connections, a reserve of descriptors below its limit kept for its own files (database,
artifacts), so accepting a connection never fails for want of one. At the bound a new
connection displaces the longest-idle one (before its first request or between requests),
so a crowd of silent sockets cannot keep a working client out; one that sends nothing is
closed after the keep-alive interval. The listen backlog (``listen_backlog``) keeps each
round of accepts within the reserve, since a displaced connection's descriptor is released
only once the round is over. Should an accept still fail (``EMFILE``: other
processes, a lower bound elsewhere), ``AcceptErrorThrottle`` lets one line through per
interval and counts the rest, where asyncio would log a traceback for every try.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["DEFAULT_MAX_CONNECTIONS", "MAX_CONNECTIONS_ENV", "AcceptErrorThrottle", "BoundedH11Protocol",
           "connection_bound", "install_accept_error_throttle", "listen_backlog", "open_file_limit",
           "raise_open_file_limit"]

log = logging.getLogger("flashruntime.service")

MAX_CONNECTIONS_ENV = "FLASHML_MAX_CONNECTIONS"
DEFAULT_MAX_CONNECTIONS = 10_000
_NO_DESCRIPTOR = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_RESERVE_MIN = 64  # descriptors kept for the process's own files, at the least
_RESERVE_SHARE = 8  # ... or one in this many of its limit, whichever is more
_SOFT_CAP = 1 << 20  # a hard limit of "unlimited" is raised to this, not beyond


def open_file_limit() -> int:
    """This process's soft ``RLIMIT_NOFILE`` (a large number where ``resource`` is missing)."""
    try:
        import resource
    except ImportError:  # not a POSIX system
        return _SOFT_CAP
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return _SOFT_CAP if soft == resource.RLIM_INFINITY else int(soft)


def raise_open_file_limit() -> tuple[int, int]:
    """Lift the soft ``RLIMIT_NOFILE`` to the hard limit → (soft before, soft now). Where it
    cannot be raised it stays as it was: the connection bound is then what protects."""
    try:
        import resource
    except ImportError:
        return _SOFT_CAP, _SOFT_CAP
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _SOFT_CAP if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError) as exc:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, target, exc)
    return (_SOFT_CAP if soft == resource.RLIM_INFINITY else int(soft)), open_file_limit()


def connection_bound(max_connections: int, file_limit: int) -> int:
    """The most connections a process with ``file_limit`` descriptors holds: ``max_connections``,
    or its limit less a reserve (an eighth, at least 64) for its own files if that is fewer."""
    reserve = max(_RESERVE_MIN, file_limit // _RESERVE_SHARE)
    return max(1, min(int(max_connections), file_limit - reserve))


def listen_backlog(file_limit: int) -> int:
    """The listening socket's backlog, which is also how many connections asyncio accepts in
    one go: half the descriptor reserve (at most uvicorn's default, 2048). A displaced
    connection's descriptor is released only after such a round, so a round must fit in the
    reserve beside the bound, or the round's last accepts fail for want of descriptors."""
    reserve = max(_RESERVE_MIN, file_limit // _RESERVE_SHARE)
    return max(16, min(2048, reserve // 2))


def _configured_bound() -> int:
    raw = os.environ.get(MAX_CONNECTIONS_ENV, "").strip()
    try:
        wanted = int(raw) if raw else DEFAULT_MAX_CONNECTIONS
    except ValueError:
        wanted = DEFAULT_MAX_CONNECTIONS  # the settings refuse such a value before a server starts
    return connection_bound(max(1, wanted), open_file_limit())


class _OncePerInterval:
    """Says whether to log now: once per ``interval_s``, counting the times it said no."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._last: float | None = None
        self._lock = threading.Lock()
        self.suppressed = 0

    def due(self) -> tuple[bool, int]:
        """(log now?, how many were not logged since the last line)."""
        now = self._clock()
        with self._lock:
            if self._last is not None and now - self._last < self.interval_s:
                self.suppressed += 1
                return False, 0
            self._last, skipped, self.suppressed = now, self.suppressed, 0
            return True, skipped


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the bound: a connection over it displaces the longest-idle
    one, or is closed itself when every other is busy; a connection that sends nothing is
    closed after ``timeout_keep_alive`` like one idle between requests."""

    bound: int | None = None  # set by ``flashruntime serve``; else from the environment, on first use
    refusals = _OncePerInterval(60.0)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.last_active = self.loop.time()
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)
        cls = type(self)
        if cls.bound is None:
            cls.bound = _configured_bound()
        if len(self.connections) > cls.bound:
            self._make_room(cls.bound)

    def data_received(self, data: bytes) -> None:
        self.last_active = self.loop.time()
        super().data_received(data)

    def on_response_complete(self) -> None:
        self.last_active = self.loop.time()
        super().on_response_complete()

    def idle(self) -> bool:
        """No request in flight: before the first one, or between two."""
        return (self.cycle is None or self.cycle.response_complete) and not self.transport.is_closing()

    def close_idle(self) -> None:
        """Close this connection as an idle keep-alive one is closed."""
        try:
            self.timeout_keep_alive_handler()
        except h11.LocalProtocolError:  # h11 was mid-exchange after all: just close it
            self.transport.close()

    def _make_room(self, bound: int) -> None:
        idle = [other for other in self.connections
                if other is not self and isinstance(other, BoundedH11Protocol) and other.idle()]
        excess = len(self.connections) - bound
        for victim in sorted(idle, key=lambda other: other.last_active)[:excess]:
            victim.close_idle()
        if len(idle) < excess:
            self.close_idle()
            due, skipped = type(self).refusals.due()
            if due:
                log.warning("a connection was closed at once: %d connections, all busy, are this process's bound "
                            "(FLASHML_MAX_CONNECTIONS, open-file limit); %d more since the last such line",
                            len(self.connections), skipped)


class AcceptErrorThrottle:
    """An event loop exception handler: an accept that failed for want of a descriptor (or
    of memory) is logged once per ``interval_s`` with the count of those not logged; every
    other context goes to the handler there was before (or the loop's default)."""

    def __init__(self, interval_s: float, previous: Any = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._once = _OncePerInterval(interval_s, clock)
        self._previous = previous

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in _NO_DESCRIPTOR:
            due, skipped = self._once.due()
            if due:
                log.error("accepting a connection failed: %s (%s); %d such failures since the last line; raise the "
                          "open-file limit or lower FLASHML_MAX_CONNECTIONS", exc.strerror or exc,
                          context.get("message", ""), skipped)
            return
        if self._previous is not None:
            self._previous(loop, context)
        else:
            loop.default_exception_handler(context)


def install_accept_error_throttle(loop: asyncio.AbstractEventLoop, interval_s: float) -> None:
    """Put an ``AcceptErrorThrottle`` in front of ``loop``'s exception handler (once)."""
    current = loop.get_exception_handler()
    if isinstance(current, AcceptErrorThrottle):
        return
    loop.set_exception_handler(AcceptErrorThrottle(interval_s, current))
    BoundedH11Protocol.refusals = _OncePerInterval(interval_s)
