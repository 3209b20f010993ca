"""The measured profile of a few real steps of a user's command: ``ProfileResult``.

Every figure is per process (per rank, per GPU) unless it says otherwise; a figure the
profile could not measure is None and ``notes`` says why.
"""

from __future__ import annotations

from pydantic import Field

from flashruntime.protocol.base import WireModel
from flashruntime.protocol.plan_v1alpha1 import EstimateBasis

__all__ = ["ProfileResult"]


class ProfileResult(WireModel):
    """What a profiler measured. ``basis`` is ``profiled`` for a fresh measurement and
    ``ledger`` for medians of finished runs; ``strategy_family`` and ``workers`` name the
    candidate the measurement is of (``ddp`` on 2 workers for a 2-rank torchrun command on GPUs,
    ``cpu_ddp`` on 2 workers on the CPU); ``device`` is what the ranks ran on (``cpu``, ``cuda:0``)."""

    basis: EstimateBasis = "profiled"
    peak_vram_gb: float | None = Field(default=None, ge=0)
    host_ram_gb: float | None = Field(default=None, ge=0)
    step_time_s: float = Field(gt=0)
    tokens_per_s: float | None = Field(default=None, ge=0)
    dataloader_wait_fraction: float | None = Field(default=None, ge=0, le=1)
    checkpoint_save_s: float | None = Field(default=None, ge=0)
    checkpoint_restore_s: float | None = Field(default=None, ge=0)
    checkpoint_size_gb: float | None = Field(default=None, ge=0)
    measured_steps: int = Field(ge=1)
    warmup_steps: int = Field(default=0, ge=0)
    notes: list[str] = Field(default_factory=list)
    strategy_family: str | None = None
    workers: int | None = Field(default=None, ge=1)
    device: str | None = None
    sources: list[str] = Field(default_factory=list)
