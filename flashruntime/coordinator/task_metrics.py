"""The step records of a lease job's tasks, as ``GET /v1alpha1/jobs/{id}/metrics`` answers them.

A worker uploads each running task's ``metrics.jsonl`` under the task's output prefix (its
last ``TASK_METRICS_MAX_BYTES``, whole lines), and the commit replaces it with the whole file.
This reads only the end of each file, never more than ``JOB_METRICS_MAX_BYTES`` for one
answer, keeps the top-level finite numbers of each record under a few bounded names, and
thins the points evenly, so a curve costs the same whatever the task wrote.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flashruntime.coordinator.artifacts import ArtifactStore, BadArtifactKey
from flashruntime.coordinator.task_logs import own_prefix
from flashruntime.monitor.records import finite_number
from flashruntime.protocol.task_logs import whole_lines_tail
from flashruntime.protocol.task_metrics import (
    JOB_METRICS_MAX_BYTES,
    MAX_METRIC_KEY_LENGTH,
    MAX_METRIC_KEYS,
    TASK_METRICS_MAX_BYTES,
    task_metrics_key,
)

__all__ = ["Curves", "metrics_path", "metrics_share", "read_curves", "thin"]

_NOT_FIGURES = frozenset({"step", "ts"})


@dataclass(frozen=True)
class Curves:
    """One task's curves: the figures shown, the points (step, ts, values), how many records
    were read and whether earlier ones are left out."""

    keys: list[str] = field(default_factory=list)
    points: list[tuple[int, float | None, dict[str, float]]] = field(default_factory=list)
    records: int = 0
    truncated: bool = False

    def points_json(self) -> list[dict[str, Any]]:
        return [{"step": step, "ts": ts, "values": values} for step, ts, values in self.points]


def metrics_share(tasks: int) -> int:
    """Bytes of each task's records one answer may read when it shows ``tasks`` tasks."""
    return min(TASK_METRICS_MAX_BYTES, JOB_METRICS_MAX_BYTES // max(1, tasks))


def metrics_path(artifacts: ArtifactStore, job_id: str, task_id: str, payload: dict[str, Any]) -> Path | None:
    """Where the task's step records lie on the coordinator, or None when the key cannot be a file."""
    try:
        return artifacts.path_of(task_metrics_key(own_prefix(job_id, task_id, payload)))
    except BadArtifactKey:
        return None


def _tail(path: Path, max_bytes: int) -> tuple[bytes, bool]:
    """The whole lines of the file's last ``max_bytes`` and whether anything is left out;
    nothing for a file that is missing (or a directory where the file should be)."""
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            if size <= max_bytes:
                handle.seek(0)
                return handle.read(), False
            handle.seek(size - max_bytes - 1)
            return whole_lines_tail(handle.read(max_bytes + 1), max_bytes), True
    except OSError:
        return b"", False


def _figures(record: dict[str, Any]) -> dict[str, float]:
    figures = {}
    for key, value in record.items():
        if key in _NOT_FIGURES or not isinstance(key, str) or not 0 < len(key) <= MAX_METRIC_KEY_LENGTH:
            continue
        number = finite_number(value)
        if number is not None:
            figures[key] = number
    return figures


def thin(points: list[Any], wanted: int) -> list[Any]:
    """At most ``wanted`` of ``points``, evenly spaced, the first and the last always kept (pure)."""
    if len(points) <= wanted:
        return list(points)
    if wanted <= 1:
        return points[-1:]
    last = len(points) - 1
    return [points[round(i * last / (wanted - 1))] for i in range(wanted)]


def read_curves(path: Path | None, max_bytes: int, points: int) -> Curves:
    """The curves of the step records at ``path`` (see the module); empty when there are none."""
    if path is None:
        return Curves()
    data, truncated = _tail(path, max_bytes)
    rows: list[tuple[int, float | None, dict[str, float]]] = []
    seen: dict[str, None] = {}
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a torn last line, or not JSON
        step = record.get("step") if isinstance(record, dict) else None
        if not isinstance(step, int) or isinstance(step, bool):
            continue
        figures = _figures(record)
        for key in figures:
            seen.setdefault(key)
        rows.append((step, finite_number(record.get("ts")), figures))
    keys = sorted(seen, key=lambda key: key != "loss")[:MAX_METRIC_KEYS]  # stable: loss first, then as written
    shown = set(keys)
    kept = [(step, ts, {key: value for key, value in figures.items() if key in shown}) for step, ts, figures in rows]
    return Curves(keys, thin(kept, points), len(rows), truncated)
