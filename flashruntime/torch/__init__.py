"""In-script torch helper, used as ``import flashruntime.torch as ft``.

Optional sugar over the launch contract: ``ft.prepare`` places, wraps and restores,
``ft.checkpoint`` writes verified checkpoints, ``ft.log_metrics`` streams metrics, and
per-rank heartbeats show progress. torch is imported inside the functions only.
"""

from __future__ import annotations

from flashruntime.torch._checkpoint import checkpoint, log_metrics
from flashruntime.torch._prepare import prepare
from flashruntime.torch._state import _resolve_device, backend, device, is_main, rank, start_step, world_size

__all__ = [
    "prepare",
    "checkpoint",
    "log_metrics",
    "rank",
    "world_size",
    "is_main",
    "start_step",
    "device",
    "backend",
]
