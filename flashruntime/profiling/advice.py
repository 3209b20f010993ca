"""Checkpoint-interval advice: Young/Daly's first-order optimum ``sqrt(2 * C * MTBF)`` for a
checkpoint that costs ``C`` seconds on a fleet that fails every ``MTBF`` seconds on average,
and the expected goodput at an interval. Pure functions.

Goodput model (first order, failures exponential): each interval of ``T`` useful seconds
costs ``C`` to save; a failure loses on average half an interval plus the restart time ``R``.
Goodput = T / (T + C) x (1 - (T / 2 + C + R) / MTBF), floored at 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from flashruntime.errors import InvalidProfileRequest

__all__ = ["CheckpointAdvice", "checkpoint_advice", "expected_goodput"]


def _positive(name: str, value: object, *, zero_ok: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not zero_ok):
        rule = ">= 0" if zero_ok else "> 0"
        raise InvalidProfileRequest(f"{name} must be a finite number of seconds {rule}, got {value!r}")
    return float(value)


def expected_goodput(interval_s: float, checkpoint_s: float, mtbf_s: float, restart_s: float = 0.0) -> float:
    """Expected fraction of wall time that is useful work when checkpointing every
    ``interval_s`` seconds of work (see the module docstring)."""
    t = _positive("interval_s", interval_s)
    c = _positive("checkpoint_s", checkpoint_s, zero_ok=True)
    m = _positive("mtbf_s", mtbf_s)
    r = _positive("restart_s", restart_s, zero_ok=True)
    return max(0.0, t / (t + c) * (1.0 - (t / 2 + c + r) / m))


@dataclass(frozen=True)
class CheckpointAdvice:
    """The advised interval and what it buys; ``source`` says where C and MTBF came from."""

    interval_s: float
    checkpoint_s: float
    mtbf_s: float
    goodput: float
    source: str

    def line(self) -> str:
        return (f"every {self.interval_s:.0f} s = sqrt(2 x C {self.checkpoint_s:.3g} s x MTBF {self.mtbf_s:.0f} s), "
                f"expected goodput {self.goodput:.1%} ({self.source})")


def checkpoint_advice(checkpoint_s: float, mtbf_s: float, *, restart_s: float = 0.0,
                      source: str = "stated MTBF") -> CheckpointAdvice:
    """Young/Daly: interval = sqrt(2 x ``checkpoint_s`` x ``mtbf_s``), with its expected goodput.
    A free checkpoint (C = 0) is advised at the smallest interval, one second."""
    c = _positive("checkpoint_s", checkpoint_s, zero_ok=True)
    m = _positive("mtbf_s", mtbf_s)
    interval = max(1.0, math.sqrt(2.0 * c * m))
    return CheckpointAdvice(interval, c, m, expected_goodput(interval, c, m, restart_s), source)
