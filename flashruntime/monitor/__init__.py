"""Resource telemetry of a launched command and the evidence derived from it.

``ResourceSampler`` appends one JSON line per tick to ``telemetry.jsonl`` (psutil
optional, imported lazily; ``nvidia-smi`` for GPUs); ``evidence_from_telemetry``
turns that file into ``ExecutionEvidence``, where None means "not measured".
"""

from __future__ import annotations

from flashruntime.monitor.evidence import evidence_from_telemetry
from flashruntime.monitor.sampler import ResourceSampler

__all__ = ["ResourceSampler", "evidence_from_telemetry"]
