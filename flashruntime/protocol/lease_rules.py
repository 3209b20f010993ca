"""How long a lease lasts: the defaults and bounds every part of the project uses.

A task asks for ``lease_seconds`` (``TaskSpec.lease_seconds``, default
``DEFAULT_LEASE_SECONDS``); its holder must renew within that, or the task is requeued.
Lengths from untrusted input (a job's parameters) go through ``bounded_lease_seconds``:
at least ``MIN_LEASE_SECONDS``, capped at ``MAX_LEASE_SECONDS``; the lease manager refuses a task outside
``SHORTEST_LEASE_SECONDS``..``LONGEST_LEASE_SECONDS`` whatever its source. Pure.
"""

from __future__ import annotations

import math

__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "FEDAVG_LEASE_SECONDS",
    "LONGEST_LEASE_SECONDS",
    "MAX_LEASE_SECONDS",
    "MIN_LEASE_SECONDS",
    "SHORTEST_LEASE_SECONDS",
    "bounded_lease_seconds",
]

DEFAULT_LEASE_SECONDS = 60.0
# A federated round trains a model for local_steps before it can commit: twice the default.
FEDAVG_LEASE_SECONDS = 120.0
# The cap on a lease length a job's parameters ask for: an hour without a heartbeat is
# already long enough to notice a lost machine late.
MAX_LEASE_SECONDS = 3600
# The least a job's parameters may ask for: a holder must renew within it, over a network,
# and a shorter lease only expires its own task (and floods the sweeper) before any work is done.
MIN_LEASE_SECONDS = 1.0
# What a task may ask for at all: below a microsecond the deadline rounds to ``now`` (a lease
# dead when issued); beyond ten years ``now + lease_seconds`` nears datetime's last date.
SHORTEST_LEASE_SECONDS = 1e-6
LONGEST_LEASE_SECONDS = 10 * 365 * 86_400


def bounded_lease_seconds(raw: object, default: float) -> float:
    """A lease length from untrusted input: ``None`` -> ``default``; otherwise a finite
    number >= ``MIN_LEASE_SECONDS`` (numeric strings accepted), capped at ``MAX_LEASE_SECONDS``."""
    if raw is None:
        return default
    if isinstance(raw, bool):
        raise ValueError(f"lease_seconds must be a number of seconds, got the bool {raw!r}")
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"lease_seconds must be a number of seconds, got {raw!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"lease_seconds must be finite and > 0, got {raw!r}")
    if value < MIN_LEASE_SECONDS:
        raise ValueError(f"lease_seconds must be at least {MIN_LEASE_SECONDS:g} s, got {raw!r}: a holder renews "
                         "within its lease over the network")
    return float(min(value, MAX_LEASE_SECONDS))
