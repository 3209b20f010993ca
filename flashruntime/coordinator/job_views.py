"""What the job routes read of a coordinator's tasks: their rows, their logs (each earlier
attempt's kept log included) and their metric curves, each sorted by task id."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flashruntime.coordinator.task_logs import TaskLog, log_share, read_log, task_log_path, with_tail
from flashruntime.coordinator.task_metrics import metrics_path, metrics_share, read_curves
from flashruntime.protocol.task_metrics import DEFAULT_POINTS
from flashruntime.protocol.v1alpha1 import TaskState

__all__ = ["task_logs", "task_metrics", "task_rows"]


def task_logs(coordinator: Any, job_id: str, *, task: str | None = None, tail: int | None = None) -> list[TaskLog]:
    """The logs of the job's tasks (only ``task``'s when given; none when it has no such
    task), sorted by task id; ``tail``: each one's last lines only."""
    records = sorted(coordinator.manager.records(job_id), key=lambda record: record.spec.task_id)
    if task is not None:
        records = [record for record in records if record.spec.task_id == task]
    wanted: list[tuple[Any, int | None, Path | None]] = []  # (record, earlier attempt or None, path)
    for record in records:
        spec = record.spec
        for number in range(1, record.attempts_used):  # the latest attempt's log is task.log itself
            path = task_log_path(coordinator.artifacts, job_id, spec.task_id, spec.payload, number)
            if path is not None and path.is_file():
                wanted.append((record, number, path))
        wanted.append((record, None, task_log_path(coordinator.artifacts, job_id, spec.task_id, spec.payload)))
    share = log_share(len(wanted))
    logs = []
    for record, number, path in wanted:
        text, truncated = read_log(path, share) if path is not None else ("", False)
        text, truncated = with_tail(text, truncated, tail)
        state = record.state.value if number is None else "FAILED"
        logs.append(TaskLog(record.spec.task_id, state, _last_node(record), text, truncated, number))
    return logs


def task_metrics(coordinator: Any, job_id: str, *, task: str | None = None, points: int = DEFAULT_POINTS
                 ) -> list[dict[str, Any]]:
    """The curves of the job's tasks (only ``task``'s when given; none when it has no such
    task), sorted by task id, as ``TaskMetrics`` objects."""
    records = sorted(coordinator.manager.records(job_id), key=lambda record: record.spec.task_id)
    if task is not None:
        records = [record for record in records if record.spec.task_id == task]
    share = metrics_share(len(records))
    answer = []
    for record in records:
        spec = record.spec
        curves = read_curves(metrics_path(coordinator.artifacts, job_id, spec.task_id, spec.payload), share, points)
        answer.append({"task_id": spec.task_id, "state": record.state.value, "node_id": _last_node(record),
                       "keys": curves.keys, "points": curves.points_json(), "records": curves.records,
                       "truncated": curves.truncated})
    return answer


def task_rows(coordinator: Any, job_id: str) -> list[dict[str, Any]]:
    """``GET /jobs/{id}/tasks`` rows, sorted by task id."""
    evidence = coordinator.ledger.evidence_for(job_id)
    rows = []
    for record in coordinator.manager.records(job_id):
        spec = record.spec
        active = record.active_lease
        rows.append({
            "task_id": spec.task_id,
            "state": record.state.value,
            "attempts": record.attempts_used,
            "max_attempts": spec.max_attempts,
            "node_id": _last_node(record),
            "deadline": active.deadline.isoformat() if active is not None else None,
            "failures": record.failures_seen,
            "expiries": record.expiries_seen,
            "max_expiries": spec.max_expiries,
            "released": record.releases_seen,
            "evidence": _accepted_evidence(record, evidence.get(spec.task_id)),
        })
    return sorted(rows, key=lambda row: row["task_id"])


def _last_node(record: Any) -> str | None:
    """The node of the task's active lease, else of its last one, else None."""
    last = record.active_lease or (next(reversed(record.lease_history.values())) if record.lease_history else None)
    return last.node_id if last is not None else None


def _accepted_evidence(record: Any, row: dict[str, Any] | None) -> dict[str, Any] | None:
    """The accepted attempt's evidence, or None: the ledger keeps the latest
    row per task, which counts only when it is the accepted lease's."""
    if record.state is not TaskState.COMPLETED or row is None or row.get("lease_id") != record.accepted_attempt_id:
        return None
    evidence = row.get("evidence")
    return evidence if isinstance(evidence, dict) else None
