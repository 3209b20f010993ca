"""``PostgresLeaseStore``: lease state in PostgreSQL, shared by every coordinator replica.

The SQLite store's layout and contract on a server: each call reads the rows it touches
and returns fresh ``TaskRecord`` objects; nothing is cached. Inside a transaction the
reads a transition acts on lock their rows (``FOR UPDATE``), and the reads that pick
tasks — ``next_pending``, ``expired``, and ``lock_pending`` for a placement policy's
choice from unlocked ``pending_page`` reads — skip rows another transaction has locked
(``SKIP LOCKED``): two replicas claiming at once never hand out the same task, and
neither waits for the other. Given a ``PostgresDatabase`` instead of a URL,
the store shares its transactions, so other stores' writes made inside one commit with
the transition.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from flashruntime.leases import _postgres_sql as sql
from flashruntime.leases._models import (
    coerce_now,
    epoch,
    from_epoch,
    lease_from_json,
    lease_to_json,
    spec_from_json,
    spec_to_json,
)
from flashruntime.leases._stored_history import StoredHistory, load_history
from flashruntime.leases.store import LeaseStore, TaskRecord
from flashruntime.db.postgres import PostgresDatabase
from flashruntime.protocol.v1alpha1 import Lease, TaskState

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["SCHEMA_VERSION", "PostgresLeaseStore", "stored_schema_version"]

SCHEMA_VERSION = sql.SCHEMA_VERSION

_STATES = {state.value: state for state in TaskState}
_ALL_COLUMNS = tuple(range(len(sql.MUTABLE)))
_ACTIVE_JSON = sql.MUTABLE.index("active_lease_json")
_LEASED = TaskState.LEASED
_record_new = TaskRecord.__new__


def stored_schema_version(database: PostgresDatabase) -> str | None:
    """The lease store's schema version recorded in ``database``, or None where it has no
    lease tables yet. Reads only."""
    return database.recorded_version(sql.META_TABLE)


def _storable(value: str) -> bool:
    """Whether PostgreSQL's ``text`` can hold ``value`` (it cannot hold NUL): nothing stored
    has such a key, so a lookup by one finds nothing."""
    return "\x00" not in value


class PostgresLeaseStore(LeaseStore):
    """A ``LeaseStore`` in PostgreSQL; implements every optional operation.

    ``database`` is a URL (the store opens and owns a ``PostgresDatabase``) or a
    ``PostgresDatabase`` whose pool and transactions the store shares (its owner closes
    it). The constructor creates the schema, or checks the stored schema version and
    refuses one it does not read (``RuntimeError`` naming the database).
    """

    def __init__(self, database: str | PostgresDatabase, **options: Any) -> None:
        if isinstance(database, PostgresDatabase):
            db, self._owns_db = database, False
        else:
            db, self._owns_db = PostgresDatabase(database, **options), True
        self.database = db
        self.where = db.where
        self._txn = db.transaction()
        try:
            db.ensure_schema(meta_table=sql.META_TABLE, version=sql.SCHEMA_VERSION, statements=sql.SCHEMA,
                             what="lease")
        except BaseException:
            if self._owns_db:
                db.close()
            raise

    # --- lifecycle ----------------------------------------------------------

    def close(self) -> None:
        """Close the pool this store opened; one on a shared database is its owner's to close."""
        if self._owns_db:
            self.database.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PostgresLeaseStore({self.where!r})"

    # --- transactions -------------------------------------------------------

    def transaction(self) -> Any:
        """The database's transaction: ``BEGIN`` ... ``COMMIT`` on this thread's connection,
        re-entrant; what any store on the same ``PostgresDatabase`` writes inside it commits
        together with the transition. Other threads and processes run theirs at the same time."""
        return self._txn

    # --- required methods ---------------------------------------------------

    def add(self, record: TaskRecord) -> None:
        spec = record.spec
        if not (_storable(spec.job_id) and _storable(spec.task_id)):
            raise ValueError(f"task {spec.task_id!r} of job {spec.job_id!r}: ids cannot contain NUL characters")
        lease = record.active_lease
        leased = record.state is _LEASED and lease is not None
        with self._txn, self.database.connection() as conn:
            row = conn.execute(
                sql.INSERT,
                (
                    spec.job_id,
                    spec.task_id,
                    spec_to_json(spec),
                    record.state.value,
                    record.attempts_used,
                    record.failures_seen,
                    record.expiries_seen,
                    lease.lease_id if lease is not None else None,
                    lease.node_id if lease is not None else None,
                    epoch(lease.deadline) if leased else None,  # type: ignore[union-attr]
                    lease_to_json(lease) if lease is not None else None,
                    record.accepted_attempt_id,
                    record.accepted_output_sha256,
                    record.releases_seen,
                ),
            ).fetchone()
            if row is None:
                raise ValueError(
                    f"duplicate task: job {spec.job_id!r} already has task {spec.task_id!r}; "
                    "task ids must be unique within a job"
                )
            self._insert_history(conn, record, record.lease_history.items())
            record.seq = int(row[0])

    def save(self, record: TaskRecord) -> None:
        spec = record.spec
        state = record.state
        lease = record.active_lease
        history = record.lease_history
        loaded = history if history.__class__ is StoredHistory else None
        stored = None if loaded is None else loaded.stored
        if lease is None:
            lease_id = node_id = deadline = lease_json = None
        else:
            lease_id = lease.lease_id
            node_id = lease.node_id
            if not _storable(node_id):
                raise ValueError(f"node id {node_id!r} cannot contain NUL characters")
            deadline = epoch(lease.deadline) if state is _LEASED else None
            stored_lease = None if stored is None else loaded.stored_lease  # type: ignore[union-attr]
            if stored_lease is not None and (lease is stored_lease or lease.__dict__ == stored_lease.__dict__):
                lease_json = stored[_ACTIVE_JSON]  # unchanged since it was read: no need to encode it
            else:
                lease_json = lease_to_json(lease)
        values = (
            state.value,
            record.attempts_used,
            record.failures_seen,
            record.expiries_seen,
            lease_id,
            node_id,
            deadline,
            lease_json,
            record.accepted_attempt_id,
            record.accepted_output_sha256,
            record.releases_seen,
        )
        if stored is None:
            changed: tuple[int, ...] | None = None
        elif values == stored:
            changed = ()
        else:
            changed = tuple([i for i in _ALL_COLUMNS if values[i] != stored[i]])
        with self._txn, self.database.connection() as conn:
            if changed is None:
                cursor = conn.execute(sql.UPDATE, (*values, spec.job_id, spec.task_id))
                if cursor.rowcount != 1:
                    raise ValueError(
                        f"task {spec.task_id!r} of job {spec.job_id!r} is not in this store; add() it first"
                    )
            elif changed:
                conn.execute(sql.update(changed), (*[values[i] for i in changed], spec.job_id, spec.task_id))
            if loaded is None:
                self._insert_history(conn, record, history.items(), lease, lease_json)
            else:
                persisted = loaded.persisted
                fresh = [(key, value) for key, value in history.items() if key not in persisted]
                if fresh:
                    self._insert_history(conn, record, fresh, lease, lease_json)
                    persisted.update(key for key, _ in fresh)
                loaded.stored = values
                loaded.stored_lease = lease

    def get(self, job_id: str, task_id: str) -> TaskRecord | None:
        if not (_storable(job_id) and _storable(task_id)):
            return None
        db = self.database
        with db.connection() as conn:
            statement = sql.GET_LOCKED if db.in_transaction() else sql.GET
            row = conn.execute(statement, (job_id, task_id)).fetchone()
            return None if row is None else self._records(conn, [row])[0]

    def next_pending(self, job_id: str | None = None) -> TaskRecord | None:
        db = self.database
        locked = db.in_transaction()
        with db.connection() as conn:
            if job_id is None:
                row = conn.execute(sql.NEXT_PENDING_LOCKED if locked else sql.NEXT_PENDING).fetchone()
            elif _storable(job_id):
                row = conn.execute(sql.NEXT_PENDING_JOB_LOCKED if locked else sql.NEXT_PENDING_JOB,
                                   (job_id,)).fetchone()
            else:
                row = None
            return None if row is None else self._records(conn, [row])[0]

    def leased(self) -> list[TaskRecord]:
        with self.database.connection() as conn:
            return self._records(conn, conn.execute(sql.LEASED).fetchall())

    def all(self, job_id: str | None = None) -> list[TaskRecord]:
        if job_id is not None and not _storable(job_id):
            return []
        with self.database.connection() as conn:
            # Rows first, then histories: a history only grows, so it holds every lease the rows name.
            if job_id is None:
                rows = conn.execute(sql.ALL).fetchall()
                history_rows = conn.execute(sql.ALL_HISTORY).fetchall()
            else:
                rows = conn.execute(sql.ALL_JOB, (job_id,)).fetchall()
                history_rows = conn.execute(sql.ALL_HISTORY_JOB, (job_id,)).fetchall()
        histories: dict[tuple[str, str], list[tuple[str, str]]] = {}
        for hist_job, hist_task, lease_id, lease_json in history_rows:
            histories.setdefault((hist_job, hist_task), []).append((lease_id, lease_json))
        return [self._record(row, histories.get((row[0], row[1]), ())) for row in rows]

    records = all

    # --- optional operations ------------------------------------------------

    # Pages offered to a placement policy per read: a claim usually takes the first eligible
    # task, and every row read is a round of decoding in the driver.
    pending_page_size = 32

    def pending_page(self, job_id: str | None, after_seq: int, limit: int) -> list[TaskRecord]:
        """Up to ``limit`` PENDING records after ``after_seq``, in ``seq`` order, read without
        locks: a claim locks only the task it chose (``lock_pending``), so claimers running at
        once never hide the rest of the queue from one another."""
        if limit <= 0 or (job_id is not None and not _storable(job_id)):
            return []
        with self.database.connection() as conn:
            if job_id is None:
                rows = conn.execute(sql.PENDING_PAGE, (after_seq, limit)).fetchall()
            else:
                rows = conn.execute(sql.PENDING_PAGE_JOB, (job_id, after_seq, limit)).fetchall()
            return self._records(conn, rows)

    def lock_pending(self, job_id: str, task_id: str) -> TaskRecord | None:
        """Inside a transaction: the record of ``(job_id, task_id)``, locked until the
        transaction ends, when it is still PENDING and no other transaction holds it; else None
        (another claimer took it, or is taking it)."""
        if not (_storable(job_id) and _storable(task_id)):
            return None
        with self.database.connection() as conn:
            row = conn.execute(sql.LOCK_PENDING, (job_id, task_id)).fetchone()
            return None if row is None else self._records(conn, [row])[0]

    def expired(self, now: datetime) -> list[TaskRecord]:
        """LEASED records whose deadline is at or before ``now``, in ``(deadline, seq)`` order;
        inside a transaction, those no other transaction has locked (they are locked until it ends)."""
        db = self.database
        with db.connection() as conn:
            statement = sql.EXPIRED_LOCKED if db.in_transaction() else sql.EXPIRED
            rows = conn.execute(statement, (epoch(coerce_now(now)),)).fetchall()
            return self._records(conn, rows) if rows else []

    def find_lease(self, lease_id: str) -> TaskRecord | None:
        if not _storable(lease_id):
            return None
        db = self.database
        with db.connection() as conn:
            statement = sql.FIND_LEASE_LOCKED if db.in_transaction() else sql.FIND_LEASE
            row = conn.execute(statement, (lease_id,)).fetchone()
            return None if row is None else self._records(conn, [row])[0]

    def has_lease(self, lease_id: str) -> bool:
        """Whether a lease with this id was ever issued here (a primary-key probe of
        ``lease_history``; the manager asks it for every fresh lease id)."""
        if not _storable(lease_id):
            return False
        return self.database.fetchone(sql.HAS_LEASE, (lease_id,)) is not None

    def leased_by_node(self, node_id: str) -> list[TaskRecord]:
        if not _storable(node_id):
            return []
        with self.database.connection() as conn:
            return self._records(conn, conn.execute(sql.LEASED_BY_NODE, (node_id,)).fetchall())

    def counts(self, job_id: str | None = None) -> dict[str, int]:
        if job_id is None:
            rows = self.database.fetchall(sql.COUNTS_ALL)
        elif _storable(job_id):
            rows = self.database.fetchall(sql.COUNTS_JOB, (job_id,))
        else:
            rows = []
        return {str(state): int(n) for state, n in rows if n}

    def put_cordon(self, node_id: str, until: datetime | None, reason: str) -> None:
        if not (_storable(node_id) and _storable(reason)):
            raise ValueError(f"cordon of {node_id!r}: the node id and reason cannot contain NUL characters")
        with self._txn:
            self.database.execute(sql.PUT_CORDON,
                                  (node_id, None if until is None else epoch(coerce_now(until)), reason))

    def remove_cordon(self, node_id: str) -> bool:
        if not _storable(node_id):
            return False
        with self._txn:
            return self.database.execute(sql.REMOVE_CORDON, (node_id,)) > 0

    def cordons(self) -> dict[str, tuple[datetime | None, str]]:
        rows = self.database.fetchall(sql.CORDONS)
        return {node_id: (None if until is None else from_epoch(until), reason) for node_id, until, reason in rows}

    def cordon_for(self, node_id: str) -> tuple[datetime | None, str] | None:
        if not _storable(node_id):
            return None
        row = self.database.fetchone(sql.CORDON_FOR, (node_id,))
        if row is None:
            return None
        until, reason = row
        return (None if until is None else from_epoch(until), reason)

    # --- rows <-> records ---------------------------------------------------

    def _records(self, conn: Any, rows: list[tuple[Any, ...]]) -> list[TaskRecord]:
        """Fresh records from rows of ``sql.COLUMNS``, their lease histories read on ``conn``
        (after the rows, so they hold every lease the rows name) in one statement."""
        # A record never claimed has no history: only the others are looked up.
        keyed = [(row[0], row[1]) for row in rows if row[5] or row[11] is not None]
        histories: dict[tuple[str, str], list[tuple[str, str]]] = {}
        if len(keyed) == 1:
            histories[keyed[0]] = conn.execute(sql.HISTORY, keyed[0]).fetchall()
        elif keyed:
            jobs, tasks = [key[0] for key in keyed], [key[1] for key in keyed]
            for hist_job, hist_task, lease_id, lease_json in conn.execute(sql.HISTORY_OF, (jobs, tasks)).fetchall():
                histories.setdefault((hist_job, hist_task), []).append((lease_id, lease_json))
        return [self._record(row, histories.get((row[0], row[1]), ())) for row in rows]

    def _record(self, row: tuple[Any, ...], history_rows: Iterable[tuple[str, str]]) -> TaskRecord:
        """A fresh record from a row of ``sql.COLUMNS`` and its lease history."""
        _, _, seq, spec_json, state, attempts_used, failures_seen, expiries_seen = row[:8]
        spec = spec_from_json(spec_json)
        payload = spec.payload
        record = _record_new(TaskRecord)
        record.spec = spec
        record.state = _STATES[state]
        record.attempts_used = attempts_used
        record.failures_seen = failures_seen
        record.expiries_seen = expiries_seen
        active_json = row[11]
        active = None if active_json is None else lease_from_json(active_json, payload)
        record.active_lease = active
        record.accepted_attempt_id = row[12]
        record.accepted_output_sha256 = row[13]
        record.releases_seen = row[14]
        record.seq = seq
        record.lease_history = load_history(tuple(row[4:]), active, active_json, history_rows, payload)
        return record

    def _insert_history(
        self,
        conn: Any,
        record: TaskRecord,
        items: Iterable[tuple[str, Lease]],
        active: Lease | None = None,
        active_json: str | None = None,
    ) -> None:
        spec = record.spec
        for lease_id, lease in items:
            lease_json = active_json if lease is active and active_json is not None else lease_to_json(lease)
            cursor = conn.execute(sql.INSERT_HISTORY, (lease_id, spec.job_id, spec.task_id, lease_json))
            if cursor.rowcount == 0:
                owner = conn.execute(sql.HISTORY_OWNER, (lease_id,)).fetchone()
                if owner is not None and tuple(owner) != (spec.job_id, spec.task_id):
                    raise ValueError(
                        f"lease id {lease_id!r} already belongs to task {owner[1]!r} of job {owner[0]!r}; "
                        "lease ids must be unique"
                    )
