"""Migration of the single-document ``lease_tasks`` layout to the current schema.

The old layout kept each record as a few JSON documents (``spec_json``,
``active_lease_json``, ``lease_history_json``) keyed by ``(job_id, task_id)`` or
by ``task_id`` alone. The caller runs this inside its ``BEGIN IMMEDIATE``
transaction, so the conversion is all or nothing. Queue order and in-flight
leases are kept; the budget counters and the release count start at 0.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from flashruntime.leases import _sqlite_sql as sql
from flashruntime.leases._models import epoch, lease_to_json, spec_to_json
from flashruntime.protocol.v1alpha1 import Lease, TaskSpec, TaskState

__all__ = ["migrate_single_document", "single_document_layout"]

_OLD_TABLE = "lease_tasks_single_document"


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [str(row[1]) for row in conn.execute(f"PRAGMA table_info({table})").fetchall()]


def single_document_layout(conn: sqlite3.Connection) -> bool:
    """True when ``lease_tasks`` exists in the single-document layout."""
    return "lease_history_json" in _columns(conn, "lease_tasks")


def _state(raw: object) -> TaskState:
    text = str(raw).strip()
    if text.startswith("TaskState."):
        text = text[len("TaskState.") :]
    return TaskState(text.upper())


def _history(raw: str | None) -> list[Lease]:
    if not raw:
        return []
    document = json.loads(raw)
    items: list[Any] = list(document.values()) if isinstance(document, dict) else list(document)
    return [Lease.model_validate(item) for item in items]


def migrate_single_document(conn: sqlite3.Connection) -> int:
    """Convert the old ``lease_tasks`` in place; returns the number of records moved."""
    columns = _columns(conn, "lease_tasks")
    conn.execute(f"ALTER TABLE lease_tasks RENAME TO {_OLD_TABLE}")
    for (index_name,) in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND sql IS NOT NULL", (_OLD_TABLE,)
    ).fetchall():
        conn.execute(f'DROP INDEX "{index_name}"')  # old index names would collide with nothing, but keep it clean
    for statement in sql.SCHEMA:
        conn.execute(statement)

    order = "ORDER BY seq, rowid" if "seq" in columns else "ORDER BY rowid"
    cursor = conn.execute(f"SELECT * FROM {_OLD_TABLE} {order}")
    names = [description[0] for description in cursor.description]
    moved = 0
    for values in cursor.fetchall():
        row = dict(zip(names, values))
        spec = TaskSpec.model_validate_json(row["spec_json"])
        job_id = str(row["job_id"]) if row.get("job_id") is not None else spec.job_id
        task_id = str(row["task_id"]) if row.get("task_id") is not None else spec.task_id
        state = _state(row["state"])
        history = _history(row.get("lease_history_json"))
        active_json = row.get("active_lease_json")
        active = Lease.model_validate_json(active_json) if active_json and state is TaskState.LEASED else None
        if active is not None and active.lease_id not in {lease.lease_id for lease in history}:
            history.append(active)
        attempts_used = max(int(row.get("attempts_used") or 0), len(history))
        moved += 1
        conn.execute(
            sql.INSERT,
            (
                job_id,
                task_id,
                moved,
                spec_to_json(spec),
                state.value,
                attempts_used,
                0,
                0,
                active.lease_id if active is not None else None,
                active.node_id if active is not None else None,
                epoch(active.deadline) if active is not None else None,
                lease_to_json(active) if active is not None else None,
                row.get("accepted_attempt_id"),
                row.get("accepted_output_sha256"),
                0,
            ),
        )
        for lease in history:
            conn.execute(sql.INSERT_HISTORY, (lease.lease_id, job_id, task_id, lease_to_json(lease)))
    conn.execute(f"DROP TABLE {_OLD_TABLE}")
    return moved
