"""Schema and statements of ``PostgresLeaseStore`` (with those it shares with SQLite's, from
``_sql``, written with psycopg's placeholders).

The layout is the SQLite store's: one row per task (its spec as JSON text, the mutable
columns), a lease history table, a cordon table. Ids are ``COLLATE "C"``: byte order,
as Python sorts, whatever the database's locale. Each read that a transition acts on has
a ``_LOCKED`` form for use inside a transaction: ``FOR UPDATE`` where one task is named,
``FOR UPDATE SKIP LOCKED`` where the store picks tasks (claims, a policy's choice,
expiries), so concurrent claimers never pick the same task and never wait on each other.
Pages offered to a policy are read without locks.
"""

from __future__ import annotations

from flashruntime.leases import _sql
from flashruntime.leases._sql import COLUMNS, CORDONS, COUNTS_ALL, META_TABLE, MUTABLE, pyformat

__all__ = [
    "ALL", "ALL_HISTORY", "ALL_HISTORY_JOB", "ALL_JOB", "COLUMNS", "CORDONS", "CORDON_FOR", "COUNTS_ALL",
    "COUNTS_JOB", "EXPIRED", "EXPIRED_LOCKED", "FIND_LEASE", "FIND_LEASE_LOCKED", "GET", "GET_LOCKED", "HAS_LEASE",
    "HISTORY", "HISTORY_OF", "HISTORY_OWNER", "INSERT", "INSERT_HISTORY", "LEASED", "LEASED_BY_NODE",
    "LOCK_PENDING", "META_TABLE", "MUTABLE", "NEXT_PENDING", "NEXT_PENDING_JOB", "NEXT_PENDING_JOB_LOCKED",
    "NEXT_PENDING_LOCKED", "PENDING_PAGE", "PENDING_PAGE_JOB", "PUT_CORDON", "REMOVE_CORDON", "SCHEMA",
    "SCHEMA_VERSION", "UPDATE", "update",
]

SCHEMA_VERSION = "1"

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS lease_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS lease_tasks (
        job_id TEXT COLLATE "C" NOT NULL,
        task_id TEXT COLLATE "C" NOT NULL,
        seq BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
        spec_json TEXT NOT NULL,
        state TEXT NOT NULL,
        attempts_used BIGINT NOT NULL DEFAULT 0,
        failures_seen BIGINT NOT NULL DEFAULT 0,
        expiries_seen BIGINT NOT NULL DEFAULT 0,
        active_lease_id TEXT COLLATE "C",
        active_node_id TEXT COLLATE "C",
        deadline DOUBLE PRECISION,
        active_lease_json TEXT,
        accepted_attempt_id TEXT,
        accepted_output_sha256 TEXT,
        releases_seen BIGINT NOT NULL DEFAULT 0,
        PRIMARY KEY (job_id, task_id)
    )""",
    *_sql.INDEXES,
    "CREATE INDEX IF NOT EXISTS lease_tasks_deadline ON lease_tasks (deadline, seq) WHERE state = 'LEASED'",
    """CREATE TABLE IF NOT EXISTS lease_history (
        lease_id TEXT COLLATE "C" PRIMARY KEY,
        job_id TEXT COLLATE "C" NOT NULL,
        task_id TEXT COLLATE "C" NOT NULL,
        lease_json TEXT NOT NULL,
        position BIGINT GENERATED ALWAYS AS IDENTITY
    )""",
    "CREATE INDEX IF NOT EXISTS lease_history_task ON lease_history (job_id, task_id, position)",
    """CREATE TABLE IF NOT EXISTS lease_cordons (
        node_id TEXT COLLATE "C" PRIMARY KEY,
        until DOUBLE PRECISION,
        reason TEXT NOT NULL
    )""",
)

_LOCK_ONE = " FOR UPDATE"
_LOCK_FREE = " FOR UPDATE SKIP LOCKED"

# --- reads -----------------------------------------------------------------------

GET = pyformat(_sql.GET)
GET_LOCKED = GET + _LOCK_ONE
NEXT_PENDING = f"SELECT {COLUMNS} FROM lease_tasks WHERE state = 'PENDING' ORDER BY seq LIMIT 1"
NEXT_PENDING_LOCKED = NEXT_PENDING + _LOCK_FREE
NEXT_PENDING_JOB = f"SELECT {COLUMNS} FROM lease_tasks WHERE state = 'PENDING' AND job_id = %s ORDER BY seq LIMIT 1"
NEXT_PENDING_JOB_LOCKED = NEXT_PENDING_JOB + _LOCK_FREE
PENDING_PAGE = f"SELECT {COLUMNS} FROM lease_tasks WHERE state = 'PENDING' AND seq > %s ORDER BY seq LIMIT %s"
PENDING_PAGE_JOB = (
    f"SELECT {COLUMNS} FROM lease_tasks WHERE state = 'PENDING' AND job_id = %s AND seq > %s ORDER BY seq LIMIT %s"
)
# The task a claim chose, if it is still PENDING and no other transaction holds it.
LOCK_PENDING = (
    f"SELECT {COLUMNS} FROM lease_tasks WHERE job_id = %s AND task_id = %s AND state = 'PENDING'" + _LOCK_FREE
)
EXPIRED = f"SELECT {COLUMNS} FROM lease_tasks WHERE state = 'LEASED' AND deadline <= %s ORDER BY deadline, seq"
EXPIRED_LOCKED = EXPIRED + _LOCK_FREE
# The task that holds or held a lease (its history rows follow in a second read).
FIND_LEASE = (
    f"SELECT {COLUMNS} FROM lease_tasks "
    "WHERE (job_id, task_id) = (SELECT job_id, task_id FROM lease_history WHERE lease_id = %s)"
)
FIND_LEASE_LOCKED = FIND_LEASE + _LOCK_ONE
LEASED_BY_NODE = f"SELECT {COLUMNS} FROM lease_tasks WHERE state = 'LEASED' AND active_node_id = %s ORDER BY seq"
LEASED = f"SELECT {COLUMNS} FROM lease_tasks WHERE state = 'LEASED' ORDER BY seq"
ALL = _sql.ALL
ALL_JOB = pyformat(_sql.ALL_JOB)

HISTORY = "SELECT lease_id, lease_json FROM lease_history WHERE job_id = %s AND task_id = %s ORDER BY position"
# The histories of several tasks in one read: the keys as two parallel arrays.
HISTORY_OF = (
    "SELECT h.job_id, h.task_id, h.lease_id, h.lease_json "
    "FROM unnest(%s::text[], %s::text[]) AS k (job_id, task_id) "
    "JOIN lease_history AS h ON h.job_id = k.job_id AND h.task_id = k.task_id ORDER BY h.position"
)
ALL_HISTORY = "SELECT job_id, task_id, lease_id, lease_json FROM lease_history ORDER BY position"
ALL_HISTORY_JOB = "SELECT job_id, task_id, lease_id, lease_json FROM lease_history WHERE job_id = %s ORDER BY position"
HISTORY_OWNER = pyformat(_sql.HISTORY_OWNER)
HAS_LEASE = pyformat(_sql.HAS_LEASE)
COUNTS_JOB = pyformat(_sql.COUNTS_JOB)

# --- writes ----------------------------------------------------------------------

# Nothing is inserted for a duplicate key, and no row comes back: the caller raises.
INSERT = (
    f"INSERT INTO lease_tasks (job_id, task_id, {_sql.INSERTED}) "
    f"VALUES ({', '.join(['%s'] * (2 + len(_sql.INSERTED.split(','))))}) "
    "ON CONFLICT (job_id, task_id) DO NOTHING RETURNING seq"
)
update = _sql.partial_updates("%s")
UPDATE = update(tuple(range(len(MUTABLE))))
INSERT_HISTORY = pyformat(_sql.INSERT_HISTORY)

PUT_CORDON = (
    "INSERT INTO lease_cordons (node_id, until, reason) VALUES (%s, %s, %s) "
    "ON CONFLICT (node_id) DO UPDATE SET until = EXCLUDED.until, reason = EXCLUDED.reason"
)
REMOVE_CORDON = pyformat(_sql.REMOVE_CORDON)
CORDON_FOR = pyformat(_sql.CORDON_FOR)
