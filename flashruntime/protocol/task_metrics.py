"""A running task's step records as a worker uploads them and the coordinator serves them:
``metrics.jsonl`` under the task's output prefix, the last ``TASK_METRICS_MAX_BYTES`` of the
file the task writes (whole lines), replaced by the whole file when the attempt commits. The
worker (which cuts it) and the coordinator (which reads and thins it) both need these facts,
so they live here. Pure.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_POINTS",
    "JOB_METRICS_MAX_BYTES",
    "MAX_METRIC_KEYS",
    "MAX_METRIC_KEY_LENGTH",
    "MAX_POINTS",
    "TASK_METRICS_MAX_BYTES",
    "TASK_METRICS_NAME",
    "task_metrics_key",
]

TASK_METRICS_NAME = "metrics.jsonl"
# A curve needs its shape, not every step: the last MiB holds thousands of steps, and keeps
# every upload of a fast-stepping task cheap.
TASK_METRICS_MAX_BYTES = 1024 * 1024
# What one answer of GET /v1alpha1/jobs/{id}/metrics reads at most, shared evenly among its tasks.
JOB_METRICS_MAX_BYTES = 8 * 1024 * 1024
MAX_METRIC_KEYS = 8  # the figures one task's curves show: loss first, then as the task first wrote them
MAX_METRIC_KEY_LENGTH = 64
DEFAULT_POINTS = 120
MAX_POINTS = 1000


def task_metrics_key(output_prefix: str) -> str:
    """The artifact key of a task's step records, given its output prefix (``jobs/<job>/<task>/``)."""
    base = output_prefix if output_prefix.endswith("/") else output_prefix + "/"
    return base + TASK_METRICS_NAME
