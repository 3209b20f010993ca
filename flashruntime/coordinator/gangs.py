"""The coordinator's side of multi-node jobs (``parameters.nodes``): the rendezvous port
stamped into every node's task, one node per machine, and the job's end.

A multi-node job is one training run. Its node tasks are placed on distinct machines; a
node lost for good leaves its task queued (no machine that already runs a node of the job
may take it, so it waits for a new one) while torchrun continues on the nodes left. The
job ends with its group: once a node commits the run's metrics (global rank 0 writes them;
the other nodes commit an empty object), the run is over, the node tasks still queued are
cancelled as not needed, and the job SUCCEEDS on the nodes that ran. Nodes that all end
without that commit FAIL the job: an empty commit is no result.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from flashruntime.errors import ExpansionError
from flashruntime.protocol.gang import GANG_KEY
from flashruntime.protocol.v1alpha1 import JobSpec, TaskSpec, TaskState

__all__ = ["NOT_NEEDED_REASON", "NO_RESULT_REASON", "close_gang", "gang_jobs_held", "group_of", "has_result",
           "is_gang", "live_peers", "stamp_rendezvous"]

NOT_NEEDED_REASON = "not needed: the job's group finished its run on the nodes it had"
NO_RESULT_REASON = ("no node committed the run's metrics: global rank 0 writes metrics.json into "
                    "$FLASHML_OUTPUT_DIR on its node, and every node ended without it (see the tasks' logs)")
MAX_METRICS_BYTES = 1024 * 1024


def is_gang(spec: JobSpec) -> bool:
    """Whether ``spec`` is a multi-node job."""
    params = spec.spec.workload.parameters
    return spec.spec.workload.type == "command" and isinstance(params, Mapping) and params.get("nodes") is not None


def stamp_rendezvous(tasks: Iterable[TaskSpec], port: int | None, backend: str) -> None:
    """Put the coordinator's rendezvous port into every node task's gang; ``ExpansionError``
    when this coordinator serves no store, or the job is for a backend without nodes."""
    for task in tasks:
        gang = task.payload.get(GANG_KEY)
        if not isinstance(gang, dict):
            continue
        if backend == "ray":
            raise ExpansionError("a multi-node job (parameters.nodes) runs on worker agents, each node under "
                                 "torchrun; submit it with execution.backend 'leases', or drop parameters.nodes "
                                 "and let Ray place the work")
        if port is None:
            raise ExpansionError("this coordinator serves no rendezvous store, which a multi-node job "
                                 "(parameters.nodes) needs; start it with 'flashruntime serve --rendezvous-port "
                                 "PORT' (or FLASHML_RENDEZVOUS_PORT), or drop parameters.nodes")
        gang["port"] = port


def live_peers(manager: Any, lease: Any, now: datetime) -> list[str]:
    """The lease ids of the other nodes of ``lease``'s job whose leases are live."""
    peers = []
    for record in manager.records(lease.job_id):
        active = record.active_lease
        if (record.state is TaskState.LEASED and active is not None and active.lease_id != lease.lease_id
                and active.deadline > now and isinstance(record.spec.payload.get(GANG_KEY), dict)):
            peers.append(active.lease_id)
    return peers


def group_of(joined: Mapping[str, str], peers: Iterable[str], job_id: str, new_token: str) -> str:
    """The rendezvous id a node joins: the group its live peers joined, else a new one."""
    for peer in peers:
        if peer in joined:
            return joined[peer]
    return f"{job_id}-{new_token}"


def gang_jobs_held(manager: Any, node_id: str, now: datetime) -> list[str]:
    """The multi-node jobs of which ``node_id`` holds a live node task: it takes no second one."""
    held = set()
    for job_id, task_id in manager.live_leases_for_node(node_id, now=now):
        record = manager.store.get(job_id, task_id)
        if record is not None and isinstance(record.spec.payload.get(GANG_KEY), dict):
            held.add(job_id)
    return sorted(held)


def has_result(manager: Any, artifacts: Any, job_id: str) -> bool:
    """Whether a node of ``job_id`` committed the run's metrics: a JSON object with a key."""
    for record in manager.records(job_id):
        if record.state is not TaskState.COMPLETED or not isinstance(record.spec.payload.get(GANG_KEY), dict):
            continue
        path = artifacts.read_path(record.spec.commit_key)
        if path is not None and _holds_metrics(path):
            return True
    return False


def _holds_metrics(path: Path) -> bool:
    """A committed object with at least one key; one too large to read here is metrics by its
    size alone (a node's empty commit is three bytes)."""
    try:
        if path.stat().st_size > MAX_METRICS_BYTES:
            return True
        metrics = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(metrics, dict) and bool(metrics)


def close_gang(manager: Any, job_id: str, now: datetime) -> list[str]:
    """Cancel the node tasks of ``job_id`` still PENDING, its run being over (call inside a
    transaction, once ``has_result``); → the tasks cancelled."""
    cancelled = []
    for record in manager.records(job_id):
        if record.state is TaskState.PENDING and isinstance(record.spec.payload.get(GANG_KEY), dict):
            manager.cancel_task(job_id, record.spec.task_id, now=now, reason=NOT_NEEDED_REASON)
            cancelled.append(record.spec.task_id)
    return cancelled
