"""``evidence_from_telemetry``: ``telemetry.jsonl`` → ``ExecutionEvidence``.

Only what was measured becomes a number; anything not measured stays None, never 0
. Malformed lines are skipped and the function never raises.
"""

from __future__ import annotations

import os
from typing import Any

from flashruntime.monitor.records import finite_number, json_lines
from flashruntime.protocol.v1alpha1 import ExecutionEvidence


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _read_ticks(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    return list(json_lines(path))


def summarize_ticks(
    ticks: list[dict[str, Any]], *, exit_code: int | None = None, wall_seconds: float | None = None
) -> ExecutionEvidence:
    """Pure core of ``evidence_from_telemetry`` over already-parsed tick records."""
    stamps = [ts for ts in (finite_number(t.get("ts")) for t in ticks) if ts is not None]
    if wall_seconds is None and len(stamps) >= 2:
        wall_seconds = stamps[-1] - stamps[0]
    cpu: list[float] = []
    gpu: list[float] = []
    for tick in ticks:
        machine = tick.get("machine")
        if not isinstance(machine, dict):
            continue
        value = finite_number(machine.get("cpu_percent"))
        if value is not None:
            cpu.append(value)
        gpus = machine.get("gpus")
        for row in gpus if isinstance(gpus, list) else []:
            util = finite_number(row.get("util_percent")) if isinstance(row, dict) else None
            if util is not None:
                gpu.append(util)
    return ExecutionEvidence(
        wall_seconds=wall_seconds,
        cpu_percent_mean=_mean(cpu),
        gpu_util_percent_mean=_mean(gpu),
        image_digest="",
        exit_code=exit_code,
    )


def evidence_from_telemetry(
    path: str | os.PathLike[str], *, exit_code: int | None = None, wall_seconds: float | None = None
) -> ExecutionEvidence:
    """Evidence of one attempt from its telemetry file; a missing or unreadable file
    measures nothing (every measured field None). Never raises."""
    try:
        return summarize_ticks(_read_ticks(path), exit_code=exit_code, wall_seconds=wall_seconds)
    except Exception:
        try:
            return ExecutionEvidence(exit_code=exit_code, wall_seconds=wall_seconds)
        except Exception:
            return ExecutionEvidence()
