"""Schema and statements of ``SqliteLeaseStore``.

Every statement on a hot path names its index (``INDEXED BY``), so a missing or
renamed index fails loudly instead of silently turning into a full scan; the
``EXPLAIN QUERY PLAN`` test runs these very strings with bound parameters.
States are SQL literals, never parameters, so the planner can match the
partial indexes' ``WHERE state = ...``.
"""

from __future__ import annotations

SCHEMA_VERSION = "3"
# Schema 2 lacks only ``releases_seen``: it is added in place (every record had none).
UPGRADE_FROM_2 = "ALTER TABLE lease_tasks ADD COLUMN releases_seen INTEGER NOT NULL DEFAULT 0"

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS lease_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS lease_tasks (
        job_id TEXT NOT NULL,
        task_id TEXT NOT NULL,
        seq INTEGER NOT NULL UNIQUE,
        spec_json TEXT NOT NULL,
        state TEXT NOT NULL,
        attempts_used INTEGER NOT NULL DEFAULT 0,
        failures_seen INTEGER NOT NULL DEFAULT 0,
        expiries_seen INTEGER NOT NULL DEFAULT 0,
        active_lease_id TEXT,
        active_node_id TEXT,
        deadline REAL,
        active_lease_json TEXT,
        accepted_attempt_id TEXT,
        accepted_output_sha256 TEXT,
        releases_seen INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (job_id, task_id)
    )""",
    "CREATE INDEX IF NOT EXISTS lease_tasks_pending ON lease_tasks (seq) WHERE state = 'PENDING'",
    "CREATE INDEX IF NOT EXISTS lease_tasks_pending_job ON lease_tasks (job_id, seq) WHERE state = 'PENDING'",
    "CREATE INDEX IF NOT EXISTS lease_tasks_deadline ON lease_tasks (deadline) WHERE state = 'LEASED'",
    "CREATE INDEX IF NOT EXISTS lease_tasks_node ON lease_tasks (active_node_id) WHERE state = 'LEASED'",
    "CREATE INDEX IF NOT EXISTS lease_tasks_job_state ON lease_tasks (job_id, state)",
    """CREATE TABLE IF NOT EXISTS lease_history (
        lease_id TEXT PRIMARY KEY,
        job_id TEXT NOT NULL,
        task_id TEXT NOT NULL,
        lease_json TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS lease_history_task ON lease_history (job_id, task_id)",
    "CREATE TABLE IF NOT EXISTS lease_cordons (node_id TEXT PRIMARY KEY, until REAL, reason TEXT NOT NULL)",
)

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
_T_COLUMNS = ", ".join("t." + column.strip() for column in COLUMNS.split(","))

GET_VERSION = "SELECT value FROM lease_meta WHERE key = 'schema_version'"
PUT_VERSION = "INSERT OR REPLACE INTO lease_meta (key, value) VALUES ('schema_version', ?)"

# --- reads -----------------------------------------------------------------------

GET = f"SELECT {COLUMNS} FROM lease_tasks WHERE job_id = ? AND task_id = ?"
EXISTS = "SELECT 1 FROM lease_tasks WHERE job_id = ? AND task_id = ?"
NEXT_SEQ = "SELECT COALESCE(MAX(seq), 0) + 1 FROM lease_tasks"
NEXT_PENDING = (
    f"SELECT {COLUMNS} FROM lease_tasks INDEXED BY lease_tasks_pending "
    "WHERE state = 'PENDING' ORDER BY seq LIMIT 1"
)
NEXT_PENDING_JOB = (
    f"SELECT {COLUMNS} FROM lease_tasks INDEXED BY lease_tasks_pending_job "
    "WHERE state = 'PENDING' AND job_id = ? ORDER BY seq LIMIT 1"
)
PENDING_PAGE = (
    f"SELECT {COLUMNS} FROM lease_tasks INDEXED BY lease_tasks_pending "
    "WHERE state = 'PENDING' AND seq > ? ORDER BY seq LIMIT ?"
)
PENDING_PAGE_JOB = (
    f"SELECT {COLUMNS} FROM lease_tasks INDEXED BY lease_tasks_pending_job "
    "WHERE state = 'PENDING' AND job_id = ? AND seq > ? ORDER BY seq LIMIT ?"
)
EXPIRED = (
    f"SELECT {COLUMNS} FROM lease_tasks INDEXED BY lease_tasks_deadline "
    "WHERE state = 'LEASED' AND deadline <= ? ORDER BY deadline, seq"
)
# The task holding a lease, with its whole lease history in the same read (one row per lease).
FIND_LEASE = (
    f"SELECT {_T_COLUMNS}, k.lease_id, k.lease_json FROM lease_history AS h "
    "JOIN lease_tasks AS t ON t.job_id = h.job_id AND t.task_id = h.task_id "
    "JOIN lease_history AS k ON k.job_id = t.job_id AND k.task_id = t.task_id "
    "WHERE h.lease_id = ? ORDER BY k.rowid"
)
LEASED_BY_NODE = (
    f"SELECT {COLUMNS} FROM lease_tasks INDEXED BY lease_tasks_node "
    "WHERE state = 'LEASED' AND active_node_id = ? ORDER BY seq"
)
HISTORY = "SELECT lease_id, lease_json FROM lease_history WHERE job_id = ? AND task_id = ? ORDER BY rowid"
HISTORY_OWNER = "SELECT job_id, task_id FROM lease_history WHERE lease_id = ?"
HAS_LEASE = "SELECT 1 FROM lease_history WHERE lease_id = ?"
COUNTS_JOB = "SELECT state, COUNT(*) FROM lease_tasks WHERE job_id = ? GROUP BY state"

# Listing calls: they read every row they return, and only those.
ALL = f"SELECT {COLUMNS} FROM lease_tasks ORDER BY seq"
ALL_JOB = f"SELECT {COLUMNS} FROM lease_tasks WHERE job_id = ? ORDER BY seq"
LEASED = (
    f"SELECT {COLUMNS} FROM lease_tasks INDEXED BY lease_tasks_deadline WHERE state = 'LEASED' ORDER BY seq"
)
ALL_HISTORY = "SELECT job_id, task_id, lease_id, lease_json FROM lease_history ORDER BY rowid"
ALL_HISTORY_JOB = "SELECT job_id, task_id, lease_id, lease_json FROM lease_history WHERE job_id = ? ORDER BY rowid"
COUNTS_ALL = "SELECT state, COUNT(*) FROM lease_tasks GROUP BY state"

# --- writes ----------------------------------------------------------------------

INSERT = (
    "INSERT INTO lease_tasks (job_id, task_id, seq, spec_json, state, attempts_used, failures_seen, "
    "expiries_seen, active_lease_id, active_node_id, deadline, active_lease_json, accepted_attempt_id, "
    "accepted_output_sha256, releases_seen) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_UPDATES: dict[tuple[int, ...], str] = {}


def update(changed: tuple[int, ...]) -> str:
    """``UPDATE`` of only the ``MUTABLE`` columns at ``changed``: an index whose columns
    are not assigned is not touched, so the commit writes fewer pages."""
    statement = _UPDATES.get(changed)
    if statement is None:
        assignments = ", ".join(f"{MUTABLE[i]} = ?" for i in changed)
        statement = _UPDATES[changed] = f"UPDATE lease_tasks SET {assignments} WHERE job_id = ? AND task_id = ?"
    return statement


UPDATE = update(tuple(range(len(MUTABLE))))
INSERT_HISTORY = (
    "INSERT INTO lease_history (lease_id, job_id, task_id, lease_json) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (lease_id) DO NOTHING"
)

PUT_CORDON = "INSERT OR REPLACE INTO lease_cordons (node_id, until, reason) VALUES (?, ?, ?)"
REMOVE_CORDON = "DELETE FROM lease_cordons WHERE node_id = ?"
CORDONS = "SELECT node_id, until, reason FROM lease_cordons ORDER BY node_id"
CORDON_FOR = "SELECT until, reason FROM lease_cordons WHERE node_id = ?"
