"""What the two lease stores' SQL share: the columns a record is read from, the builder of
the partial ``UPDATE`` a transition writes, and the statements that read the same in
either dialect. Statements here take ``?`` placeholders; ``pyformat`` writes one for
psycopg. States are SQL literals, never parameters, so the planner can match the partial
indexes' ``WHERE state = ...``.
"""

from __future__ import annotations

from collections.abc import Callable

META_TABLE = "lease_meta"

# What a record is read from: the key, seq, spec, then MUTABLE in UPDATE order.
MUTABLE = (
    "state",
    "attempts_used",
    "failures_seen",
    "expiries_seen",
    "active_lease_id",
    "active_node_id",
    "deadline",
    "active_lease_json",
    "accepted_attempt_id",
    "accepted_output_sha256",
    "releases_seen",
)
COLUMNS = "job_id, task_id, seq, spec_json, " + ", ".join(MUTABLE)
# The columns of a new row after its key (and, in SQLite, its seq): ``spec_json``, then MUTABLE.
INSERTED = "spec_json, " + ", ".join(MUTABLE)

INDEXES = (
    "CREATE INDEX IF NOT EXISTS lease_tasks_pending ON lease_tasks (seq) WHERE state = 'PENDING'",
    "CREATE INDEX IF NOT EXISTS lease_tasks_pending_job ON lease_tasks (job_id, seq) WHERE state = 'PENDING'",
    "CREATE INDEX IF NOT EXISTS lease_tasks_node ON lease_tasks (active_node_id) WHERE state = 'LEASED'",
    "CREATE INDEX IF NOT EXISTS lease_tasks_job_state ON lease_tasks (job_id, state)",
)

GET = f"SELECT {COLUMNS} FROM lease_tasks WHERE job_id = ? AND task_id = ?"
ALL = f"SELECT {COLUMNS} FROM lease_tasks ORDER BY seq"
ALL_JOB = f"SELECT {COLUMNS} FROM lease_tasks WHERE job_id = ? ORDER BY seq"
HISTORY_OWNER = "SELECT job_id, task_id FROM lease_history WHERE lease_id = ?"
HAS_LEASE = "SELECT 1 FROM lease_history WHERE lease_id = ?"
COUNTS_ALL = "SELECT state, COUNT(*) FROM lease_tasks GROUP BY state"
COUNTS_JOB = "SELECT state, COUNT(*) FROM lease_tasks WHERE job_id = ? GROUP BY state"
INSERT_HISTORY = (
    "INSERT INTO lease_history (lease_id, job_id, task_id, lease_json) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (lease_id) DO NOTHING"
)
REMOVE_CORDON = "DELETE FROM lease_cordons WHERE node_id = ?"
CORDONS = "SELECT node_id, until, reason FROM lease_cordons ORDER BY node_id"
CORDON_FOR = "SELECT until, reason FROM lease_cordons WHERE node_id = ?"


def pyformat(statement: str) -> str:
    """``statement`` with psycopg's ``%s`` for each ``?`` (none of these statements has a
    ``?`` or ``%`` of its own)."""
    return statement.replace("?", "%s")


def partial_updates(placeholder: str) -> Callable[[tuple[int, ...]], str]:
    """``update(changed)``: the ``UPDATE`` of only the ``MUTABLE`` columns at ``changed``, by
    key, written with ``placeholder``. An index whose columns are not assigned is not
    touched, so a commit writes fewer pages; and each kind of transition has one statement
    text, which a driver prepares once. Each text is built once and kept."""
    made: dict[tuple[int, ...], str] = {}

    def update(changed: tuple[int, ...]) -> str:
        statement = made.get(changed)
        if statement is None:
            assignments = ", ".join(f"{MUTABLE[i]} = {placeholder}" for i in changed)
            statement = made[changed] = (
                f"UPDATE lease_tasks SET {assignments} WHERE job_id = {placeholder} AND task_id = {placeholder}"
            )
        return statement

    return update
