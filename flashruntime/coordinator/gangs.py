"""The coordinator's side of multi-node jobs (``parameters.nodes``): the rendezvous port
stamped into every node's task, one node per machine, and the job's end.

A multi-node job is one training run. Its node tasks are placed on distinct machines; a
node lost for good leaves its task queued (no machine that already runs a node of the job
may take it, so it waits for a new one) while torchrun continues on the nodes left. The
job ends with its group: once one node's task commits, the group's run is over, the node
tasks still queued are cancelled as not needed, and the job SUCCEEDS on the nodes that ran.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from flashruntime.errors import ExpansionError
from flashruntime.protocol.gang import GANG_KEY
from flashruntime.protocol.v1alpha1 import JobSpec, TaskSpec, TaskState

__all__ = ["NOT_NEEDED_REASON", "close_gang", "gang_jobs_held", "is_gang", "stamp_rendezvous"]

NOT_NEEDED_REASON = "not needed: the job's group finished its run on the nodes it had"


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


def gang_jobs_held(manager: Any, node_id: str, now: datetime) -> list[str]:
    """The multi-node jobs of which ``node_id`` holds a live node task: it takes no second one."""
    held = set()
    for job_id, task_id in manager.live_leases_for_node(node_id, now=now):
        record = manager.store.get(job_id, task_id)
        if record is not None and isinstance(record.spec.payload.get(GANG_KEY), dict):
            held.add(job_id)
    return sorted(held)


def close_gang(manager: Any, job_id: str, now: datetime) -> list[str]:
    """Once a node task of ``job_id`` has COMPLETED, cancel its node tasks still PENDING (call
    inside a transaction); → the tasks cancelled."""
    records = list(manager.records(job_id))
    if not any(record.state is TaskState.COMPLETED for record in records):
        return []
    cancelled = []
    for record in records:
        if record.state is TaskState.PENDING and isinstance(record.spec.payload.get(GANG_KEY), dict):
            manager.cancel_task(job_id, record.spec.task_id, now=now, reason=NOT_NEEDED_REASON)
            cancelled.append(record.spec.task_id)
    return cancelled
