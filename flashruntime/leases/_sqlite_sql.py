"""Schema and statements of ``SqliteLeaseStore`` (with those it shares with PostgreSQL's,
from ``_sql``).

Every statement on a hot path names its index (``INDEXED BY``), so a missing or
renamed index fails loudly instead of silently turning into a full scan; the
``EXPLAIN QUERY PLAN`` test runs these very strings with bound parameters.
"""

from __future__ import annotations

from flashruntime.leases import _sql
from flashruntime.leases._sql import (
    ALL,
    ALL_JOB,
    COLUMNS,
    CORDON_FOR,
    CORDONS,
    COUNTS_ALL,
    COUNTS_JOB,
    GET,
    HAS_LEASE,
    HISTORY_OWNER,
    INSERT_HISTORY,
    META_TABLE,
    MUTABLE,
    REMOVE_CORDON,
)

__all__ = [
    "ALL", "ALL_HISTORY", "ALL_HISTORY_JOB", "ALL_JOB", "COLUMNS", "CORDONS", "CORDON_FOR", "COUNTS_ALL",
    "COUNTS_JOB", "EXISTS", "EXPIRED", "FIND_LEASE", "GET", "HAS_LEASE", "HISTORY", "HISTORY_OWNER", "INSERT",
    "INSERT_HISTORY", "LEASED", "LEASED_BY_NODE", "META_TABLE", "MUTABLE", "NEXT_PENDING", "NEXT_PENDING_JOB",
    "NEXT_SEQ", "PENDING_PAGE", "PENDING_PAGE_JOB", "PUT_CORDON", "REMOVE_CORDON", "SCHEMA", "SCHEMA_VERSION",
    "UPDATE", "UPGRADES", "update",
]

SCHEMA_VERSION = "3"
# Schema 2 lacks only ``releases_seen``: it is added in place (every record had none).
UPGRADES = {"2": ("ALTER TABLE lease_tasks ADD COLUMN releases_seen INTEGER NOT NULL DEFAULT 0",)}

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
    *_sql.INDEXES,
    "CREATE INDEX IF NOT EXISTS lease_tasks_deadline ON lease_tasks (deadline) WHERE state = 'LEASED'",
    """CREATE TABLE IF NOT EXISTS lease_history (
        lease_id TEXT PRIMARY KEY,
        job_id TEXT NOT NULL,
        task_id TEXT NOT NULL,
        lease_json TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS lease_history_task ON lease_history (job_id, task_id)",
    "CREATE TABLE IF NOT EXISTS lease_cordons (node_id TEXT PRIMARY KEY, until REAL, reason TEXT NOT NULL)",
)

_T_COLUMNS = ", ".join("t." + column.strip() for column in COLUMNS.split(","))

# --- reads -----------------------------------------------------------------------

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

# Listing calls: they read every row they return, and only those.
LEASED = (
    f"SELECT {COLUMNS} FROM lease_tasks INDEXED BY lease_tasks_deadline WHERE state = 'LEASED' ORDER BY seq"
)
ALL_HISTORY = "SELECT job_id, task_id, lease_id, lease_json FROM lease_history ORDER BY rowid"
ALL_HISTORY_JOB = "SELECT job_id, task_id, lease_id, lease_json FROM lease_history WHERE job_id = ? ORDER BY rowid"

# --- writes ----------------------------------------------------------------------

INSERT = (
    f"INSERT INTO lease_tasks (job_id, task_id, seq, {_sql.INSERTED}) "
    f"VALUES ({', '.join('?' * (3 + len(_sql.INSERTED.split(','))))})"
)
update = _sql.partial_updates("?")
UPDATE = update(tuple(range(len(MUTABLE))))

PUT_CORDON = "INSERT OR REPLACE INTO lease_cordons (node_id, until, reason) VALUES (?, ?, ?)"
