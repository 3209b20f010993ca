"""The clipping decision of the FedAvg reduce: which contributions are capped, and by how much.

Shared by the pure and the numpy path so both clip exactly the same contributions.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import NamedTuple


class ClipEvent(NamedTuple):
    """One capped contribution. ``index`` is its position in the caller's list, not a node id."""

    index: int
    norm: float
    cap: float
    scale: float


def clip_decisions(norms: Sequence[float], clip_factor: float) -> tuple[float, list[ClipEvent]]:
    """Cap = median(norms) × clip_factor; a norm strictly above it is scaled down to it."""
    cap = statistics.median(norms) * clip_factor
    events = [ClipEvent(i, norm, cap, cap / norm) for i, norm in enumerate(norms) if norm > cap]
    return cap, events
