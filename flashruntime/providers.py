"""What a workload asks of the machine it runs on; providers that supply machines
match against it. Unused by local launches."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["Requirements"]


class Requirements(BaseModel):
    model_config = ConfigDict(defer_build=True)

    gpus: int | None = None
    gpu_type: str | None = None
    vram_gb: float | None = None
    cpus: float | None = None
    memory_gb: float | None = None
    region: str | None = None
    max_hourly_usd: float | None = None
    spot_ok: bool = True
