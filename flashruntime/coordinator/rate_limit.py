"""Per-credential request rate limiting: a token bucket for each caller.

Each key (a credential, or a client address in open mode) may make ``per_second``
requests a second on average, in bursts of up to ``burst``; a request beyond that is
refused with the seconds until the next one would pass (the 429's ``Retry-After``).
The clock is injected, so tests advance time instead of sleeping.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Hashable

__all__ = ["RateLimiter"]

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
