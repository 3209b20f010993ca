"""In-script torch helper, used as ``import flashruntime.torch as ft``.

Optional sugar over the launch contract: ``ft.prepare`` places, wraps and restores,
``ft.checkpoint`` writes verified checkpoints (every N steps, or at the Young/Daly interval
with ``every="auto"``; on a background thread with ``async_save=True``, flushed by
``ft.wait_for_checkpoint``), ``ft.log_metrics`` streams metrics, and per-rank heartbeats show
progress. torch is imported inside the functions only.
"""

from __future__ import annotations

from flashruntime.torch._checkpoint import checkpoint, checkpoint_cadence, log_metrics, wait_for_checkpoint
from flashruntime.torch._prepare import prepare
from flashruntime.torch._state import _resolve_device, backend, device, is_main, rank, start_step, world_size

__all__ = [
    "prepare",
    "checkpoint",
    "checkpoint_cadence",
    "log_metrics",
    "rank",
    "world_size",
    "is_main",
    "start_step",
    "device",
    "backend",
    "wait_for_checkpoint",
]
