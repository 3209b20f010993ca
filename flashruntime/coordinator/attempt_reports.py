"""What a coordinator records of an attempt besides its outcome: the stragglers its worker
saw and the hangs it had, both kept against the node too (a node whose attempts hang
repeatedly is cordoned), and a committed task's metrics as TensorBoard event files and
MLflow runs. Plain functions over the coordinator."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flashruntime.errors import BadArtifactKey, FlashRuntimeError
from flashruntime.protocol.v1alpha1 import EventType, JobRecord, Lease, StragglerReport
from flashruntime.recipes.command import command_task_id
from flashruntime.trackers.mlflow_runs import TaskRecord

if TYPE_CHECKING:
    from flashruntime.coordinator.core import Coordinator

__all__ = ["count_hang_against_node", "log_mlflow", "record_stragglers", "task_params", "write_tensorboard"]

log = logging.getLogger("flashruntime.service")


def record_stragglers(coordinator: Coordinator, lease: Lease, reports: Iterable[StragglerReport]) -> None:
    """Ranks a worker found straggling: a ``STRAGGLER_DETECTED`` event of the job, and the
    same recorded against the node (node-scoped), so a slow machine shows in its history."""
    events = []
    for report in reports:
        where = f" on {report.host}" if report.host else ""
        at = f" at step {report.step}" if report.step is not None else ""
        message = (f"{lease.lease_id} on node {lease.node_id}: rank {report.rank}{where} is a straggler: it "
                   f"computes {report.ratio:.1f}x as long as the other ranks' median ({report.median_s:.3f} s "
                   f"against {report.others_s:.3f} s per step{at}); every all-reduce waits for it")
        data = {"task_id": lease.task_id, "lease_id": lease.lease_id, "node_id": lease.node_id,
                **report.model_dump(mode="json")}
        events.append(coordinator._service_event(lease.job_id, EventType.STRAGGLER_DETECTED, message, data))
        events.append(coordinator._service_event("", EventType.STRAGGLER_DETECTED, message,
                                          {**data, "job_id": lease.job_id}))

    def record() -> None:
        for event in events:
            coordinator.record_event(event)

    coordinator.state.run(record)

def count_hang_against_node(coordinator: Coordinator, lease: Lease) -> None:
    """A hang is recorded against its node (a node-scoped ``HANG_DETECTED``); the node whose
    attempts hung ``hang_cordon_after`` times within ``hang_cordon_window_s`` (of any job) is
    cordoned for that long, so the tasks it would take go to machines that make progress."""
    now, node_id = coordinator.now(), lease.node_id
    recorded = coordinator._service_event("", EventType.HANG_DETECTED,
                                   f"node {node_id}: attempt {lease.lease_id} of {lease.job_id}/{lease.task_id} "
                                   "hung", {"node_id": node_id, "job_id": lease.job_id, "task_id": lease.task_id,
                                            "lease_id": lease.lease_id})
    coordinator.state.run(lambda: coordinator.record_event(recorded))
    after, window_s = coordinator.settings.hang_cordon_after, coordinator.settings.hang_cordon_window_s
    if after == 0 or node_id in coordinator.manager.cordoned(now):
        return
    since = now - timedelta(seconds=window_s)
    hangs = [event for event in coordinator.ledger.events_for("") if event.type is EventType.HANG_DETECTED
             and event.data.get("node_id") == node_id and event.timestamp >= since]
    if len(hangs) >= after:
        reason = (f"{len(hangs)} attempts hung within {window_s:g} s (the last: {lease.job_id}/{lease.task_id}); "
                  f"uncordon it early with DELETE /v1alpha1/nodes/{node_id}/cordon")
        coordinator.manager.cordon(node_id, until=now + timedelta(seconds=window_s), reason=reason, now=now)


def task_params(job: JobRecord | None, lease: Lease) -> dict[str, Any] | None:
    """The parameter set a task ran with: its payload's (a search's trial), else, for a command
    job, its entry of the job's ``task_params``."""
    params = lease.payload.get("params")
    if params is None and job is not None and job.spec.spec.workload.type == "command":
        sets = job.spec.spec.workload.parameters.get("task_params")
        if isinstance(sets, list):
            params = {command_task_id(index): values for index, values in enumerate(sets)}.get(lease.task_id)
    return params if isinstance(params, dict) else None


def write_tensorboard(coordinator: Coordinator, lease: Lease, commit_key: str, now: datetime) -> None:
    """A committed task's metrics as TensorBoard event files, from the files its worker
    uploaded beside its result (``metrics.jsonl``, ``metrics.json``), so agents need no
    tracker. A tracker that cannot be written is logged: never the commit's failure."""
    from flashruntime.trackers.tensorboard_events import write_task_events

    directory = commit_key.rpartition("/")[0]
    steps = coordinator.artifacts.read_path(f"{directory}/metrics.jsonl") if directory else None
    final_path = coordinator.artifacts.read_path(commit_key) if commit_key else None
    job = coordinator.job(lease.job_id)
    name = f"{job.spec.metadata.name}-{lease.job_id}" if job is not None else lease.job_id
    params = task_params(job, lease)
    try:
        final = json.loads(final_path.read_text(encoding="utf-8")) if final_path is not None else None
        write_task_events(coordinator.settings.tensorboard_dir or "", name, lease.task_id, steps,
                          final if isinstance(final, dict) else None, params, now.timestamp())
    except (FlashRuntimeError, OSError, ValueError) as exc:
        log.warning("TensorBoard events of %s/%s not written: %s", lease.job_id, lease.task_id, exc)


def log_mlflow(coordinator: Coordinator, lease: Lease, commit_key: str, now: datetime) -> None:
    """Queue a committed task for its MLflow run (``coordinator.mlflow``), from the files its
    worker uploaded under the task's directory: ``metrics.jsonl``, ``metrics.json`` and the rest
    as artifacts. When it was the job's last task, its parent run ends with the job."""
    if coordinator.mlflow is None:
        return
    directory = commit_key.rpartition("/")[0]
    files: list[tuple[str, Path]] = []
    if directory:
        try:
            listed = coordinator.artifacts.list(f"{directory}/")
        except (BadArtifactKey, OSError) as exc:
            log.warning("MLflow: the files of %s/%s cannot be listed: %s", lease.job_id, lease.task_id, exc)
            listed = []
        for key, _size in listed:
            path = coordinator.artifacts.read_path(key)
            if path is not None:
                files.append((key[len(directory) + 1:], path))
    job = coordinator.job(lease.job_id)
    params = task_params(job, lease)
    task = TaskRecord(
        job_id=lease.job_id, job_name=job.spec.metadata.name if job is not None else "job", task_id=lease.task_id,
        params=params,
        steps_file=coordinator.artifacts.read_path(f"{directory}/metrics.jsonl") if directory else None,
        final_file=coordinator.artifacts.read_path(commit_key) if commit_key else None, files=tuple(files),
        started_at=lease.deadline.timestamp() - lease.lease_seconds if lease.lease_seconds else None,
        ended_at=now.timestamp(), job_started_at=job.created_at.timestamp() if job is not None else None,
        tags={"flashruntime.lease_id": lease.lease_id, "flashruntime.node_id": lease.node_id,
              "flashruntime.attempt": str(lease.attempt_number)})
    coordinator.mlflow.log(task, str(job.state) if job is not None and job.state.terminal else None)
