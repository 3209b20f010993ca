"""Per-credential request rate limiting (a token bucket for each caller) and the count of
failed authentications per client address (``FailureCounter``).

Each key (a credential, or a client address in open mode) may make ``per_second``
requests a second on average, in bursts of up to ``burst``; a request beyond that is
refused with the seconds until the next one would pass (the 429's ``Retry-After``).
An address that fails to authenticate ``limit`` times in a window is refused until that
window ends, whatever it sends meanwhile, so guessing tokens costs a window per ``limit``
guesses. The clock is injected, so tests advance time instead of sleeping.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Hashable

__all__ = ["FailureCounter", "RateLimiter"]

_PRUNE_AT = 10_000  # keys kept before idle ones (buckets full again) are dropped


class RateLimiter:
    """Token buckets by key; thread-safe. ``per_second`` > 0; ``burst`` defaults to twice it."""

    def __init__(self, per_second: float, burst: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not (isinstance(per_second, (int, float)) and math.isfinite(per_second) and per_second > 0):
            raise ValueError(f"per_second must be a finite number > 0, got {per_second!r}")
        self.per_second = float(per_second)
        self.burst = float(burst) if burst is not None else max(1.0, 2.0 * self.per_second)
        if not (math.isfinite(self.burst) and self.burst >= 1):
            raise ValueError(f"burst must be a finite number >= 1, got {burst!r}")
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[Hashable, tuple[float, float]] = {}  # key -> (tokens, at)

    def acquire(self, key: Hashable) -> float | None:
        """Take one request for ``key``: None when it may go ahead, else the seconds to wait."""
        now = self._clock()
        with self._lock:
            tokens, at = self._buckets.get(key, (self.burst, now))
            tokens = min(self.burst, tokens + max(0.0, now - at) * self.per_second)
            if tokens < 1.0:
                self._buckets[key] = (tokens, now)
                return (1.0 - tokens) / self.per_second
            self._buckets[key] = (tokens - 1.0, now)
            if len(self._buckets) > _PRUNE_AT:
                self._prune(now)
            return None

    def _prune(self, now: float) -> None:
        refill_s = self.burst / self.per_second
        for key in [k for k, (_, at) in self._buckets.items() if now - at >= refill_s]:
            del self._buckets[key]


class FailureCounter:
    """Failures by key in fixed windows of ``window_s`` seconds; thread-safe. A key with
    ``limit`` failures in its current window is blocked until the window ends. At most
    ``max_keys`` keys are kept: ended windows go first, then the least recent keys not
    blocked, then blocked ones, so memory stays bounded however many addresses fail."""

    def __init__(self, limit: int, window_s: float, *, max_keys: int = _PRUNE_AT,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be an int >= 1, got {limit!r}")
        if not (isinstance(window_s, (int, float)) and math.isfinite(window_s) and window_s > 0):
            raise ValueError(f"window_s must be a finite number > 0, got {window_s!r}")
        if isinstance(max_keys, bool) or not isinstance(max_keys, int) or max_keys < 1:
            raise ValueError(f"max_keys must be an int >= 1, got {max_keys!r}")
        self.limit = limit
        self.window_s = float(window_s)
        self.max_keys = max_keys
        self._clock = clock
        self._lock = threading.Lock()
        self._windows: dict[Hashable, tuple[float, int]] = {}  # key -> (window start, failures), oldest first

    def __len__(self) -> int:
        return len(self._windows)

    def blocked(self, key: Hashable) -> float | None:
        """Seconds until ``key`` may try again, or None when it may now."""
        now = self._clock()
        with self._lock:
            start, failures = self._windows.get(key, (now, 0))
            if now - start >= self.window_s or failures < self.limit:
                return None
            return start + self.window_s - now

    def record(self, key: Hashable) -> None:
        """Count one failure of ``key``."""
        now = self._clock()
        with self._lock:
            start, failures = self._windows.pop(key, (now, 0))
            if now - start >= self.window_s:
                start, failures = now, 0
            self._windows[key] = (start, failures + 1)
            if len(self._windows) > self.max_keys:
                self._prune(now, key)

    def _prune(self, now: float, keep: Hashable) -> None:
        for key in [k for k, (start, _) in self._windows.items() if now - start >= self.window_s]:
            del self._windows[key]
        # Keys still under the limit go before blocked ones: failing from many new addresses
        # must not buy a blocked address its next guesses. The dict keeps the order of last
        # failure, so the first entries are the least recent.
        # Down to nine tenths of the bound, so the next prune is that many failures away.
        target = self.max_keys - self.max_keys // 10
        unblocked = [k for k, (_, failures) in self._windows.items() if failures < self.limit and k != keep]
        for key in unblocked[:max(0, len(self._windows) - target)]:
            del self._windows[key]
        while len(self._windows) > target:
            del self._windows[next(iter(self._windows))]
