"""The coordinator's state in one database: jobs, events and attempt evidence (the
ledger), tasks, leases and cordons (the lease store), checkpoint manifests and parts,
and nodes, all on one database (a SQLite file, or PostgreSQL) that shares one
transaction per thread.

``InTransaction`` is how the coordinator calls the lease manager and the checkpoint
catalog: each call runs inside that transaction, so a transition, the events its
listener appends, and what the coordinator writes in response (a job's new state, the
attempt's evidence) commit together or not at all. On PostgreSQL, where transactions of
several threads and replicas run at once, one that loses a race (a deadlock, a
serialization failure) is rolled back and run again as a whole (``run_in_transaction``).
"""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from flashruntime.checkpoint.store import ManifestStore
from flashruntime.coordinator.ledger import Ledger
from flashruntime.coordinator.node_store import NodeStore
from flashruntime.coordinator.settings import RuntimeSettings
from flashruntime.db.postgres_errors import is_retryable
from flashruntime.db.url import DatabaseURL
from flashruntime.errors import StoreError
from flashruntime.leases.store import LeaseStore

__all__ = ["DATABASE_URL_SOURCE", "TRANSACTION_ATTEMPTS", "CoordinatorState", "InTransaction", "StateDatabase",
           "SweeperLock", "open_state", "run_in_transaction"]

log = logging.getLogger("flashruntime.service")

T = TypeVar("T")
# How often a transaction that lost a race is run in all, and the pause before the first
# rerun (doubled for each next one, up to the cap, and jittered so that the two transactions
# that deadlocked do not meet again in step).
TRANSACTION_ATTEMPTS = 5
_FIRST_PAUSE_S = 0.01
_PAUSE_CAP_S = 0.2

# Where a coordinator's database URL comes from, for messages that say what to correct.
DATABASE_URL_SOURCE = "the database URL (--database-url or FLASHML_DATABASE_URL)"


class StateDatabase(Protocol):
    """What the coordinator needs of its database (``SqliteDatabase``, ``PostgresDatabase``)."""

    def transaction(self) -> AbstractContextManager[object]: ...

    def after_commit(self, callback: Callable[[], object]) -> None: ...

    def close(self) -> None: ...


class SweeperLock(Protocol):
    """Who runs the expiry sweep among the processes sharing a database (``SessionLock``)."""

    def hold(self) -> bool: ...

    def release(self) -> None: ...


@dataclass
class CoordinatorState:
    """The stores of one coordinator, on one database; ``url`` names it (password masked
    when shown). ``sweeper`` is None where every process on the database sweeps (SQLite,
    whose writers take turns), else the lock that picks the one replica that sweeps.
    ``imported``: the rows copied from each older store file when this opened it."""

    database: StateDatabase
    ledger: Ledger
    leases: LeaseStore
    manifests: ManifestStore
    nodes: NodeStore
    url: DatabaseURL
    sweeper: SweeperLock | None = None
    imported: dict[str, int] = field(default_factory=dict)

    def transaction(self) -> AbstractContextManager[object]:
        """The one transaction every store here writes in; re-entrant, only the outermost commits."""
        return self.database.transaction()

    def after_commit(self, callback: Callable[[], object]) -> None:
        """Run ``callback`` once the current transaction has committed (never if it rolls back)."""
        self.database.after_commit(callback)

    def ping(self, timeout_s: float) -> None:
        """``StoreError`` when the database does not answer within ``timeout_s`` (PostgreSQL: a
        server that is down or unreachable); a SQLite file, opened for good, always answers."""
        ping = getattr(self.database, "ping", None)
        if ping is not None:
            ping(timeout_s)

    def sweep_turn(self) -> bool:
        """Whether this process should run the expiry sweep now: always on SQLite; on
        PostgreSQL only while it holds the sweeper lock, which one replica at a time holds
        and another takes at its next sweep once the holder is gone."""
        return self.sweeper is None or self.sweeper.hold()

    def run(self, work: Callable[[], T]) -> T:
        """``work()`` inside ``transaction()``, run again when it loses a race (``run_in_transaction``)."""
        return run_in_transaction(self.database, work)

    def close(self) -> None:
        if self.sweeper is not None:
            self.sweeper.release()
        self.database.close()


def run_in_transaction(database: StateDatabase, work: Callable[[], T], *, attempts: int = TRANSACTION_ATTEMPTS,
                       sleep: Callable[[float], object] = time.sleep,
                       jitter: Callable[[], float] = random.random) -> T:
    """``work()`` inside ``database.transaction()``; its result, or what it raised.

    When the transaction is this thread's outermost and the database reports that it lost a
    race (PostgreSQL's deadlock or serialization failure, ``is_retryable``), it has been rolled
    back whole: its writes, the events appended inside it and its ``after_commit`` callbacks are
    gone, so ``work()`` runs again in a new one after a short jittered pause, up to ``attempts``
    times in all (the last failure propagates). ``work`` must therefore keep what it changes
    outside the database idempotent, or start it afresh on each call. Inside an enclosing
    transaction nothing is rerun here: the failure propagates to the outermost, which reruns
    the whole. A database that cannot tell whether this thread is in a transaction (SQLite,
    whose writers queue for one lock and never deadlock) is never rerun."""
    in_transaction = getattr(database, "in_transaction", None)
    may_rerun = callable(in_transaction) and not in_transaction()
    attempt = 1
    while True:
        try:
            with database.transaction():
                return work()
        except StoreError as exc:
            if not may_rerun or attempt >= attempts or not is_retryable(exc):
                raise
            pause = min(_PAUSE_CAP_S, _FIRST_PAUSE_S * 2 ** (attempt - 1)) * (0.5 + jitter())
            log.debug("transaction rolled back (%s); running it again in %.3f s (attempt %d of %d)", exc, pause,
                      attempt + 1, attempts)
            sleep(pause)
            attempt += 1


def open_state(settings: RuntimeSettings) -> CoordinatorState:
    """Open (creating their tables if needed) the four stores on ``settings.database``: the
    SQLite file (importing ``leases.db`` / ``checkpoints.db`` found beside it), or the
    PostgreSQL database. A database that cannot be opened raises ``StoreError`` saying why
    (the server's address, never the password); a newer schema raises ``RuntimeError``.

    The four stores make or migrate their tables in one transaction, so a migration that
    fails leaves every store as it was; each older file is then imported in a transaction
    of its own (``store_files``)."""
    url = settings.database
    if url.kind == "postgresql":
        return _open_postgres(url)
    return _open_sqlite(url, settings)


def _open_sqlite(url: DatabaseURL, settings: RuntimeSettings) -> CoordinatorState:
    from flashruntime.checkpoint.sqlite_store import SqliteManifestStore
    from flashruntime.coordinator.sqlite_node_store import SqliteNodeStore
    from flashruntime.coordinator.store_files import import_store_files
    from flashruntime.db.sqlite import SqliteDatabase
    from flashruntime.leases.sqlite_store import PAGE_SIZE, SqliteLeaseStore

    assert url.path is not None  # a SQLite URL always names its file
    memory = str(url.path) == ":memory:"
    database = SqliteDatabase(url.path, page_size=PAGE_SIZE)
    try:
        with database.transaction():
            state = CoordinatorState(database, Ledger(database), SqliteLeaseStore(database),
                                     SqliteManifestStore(database), SqliteNodeStore(database), url)
        if not memory:  # a private database has no directory to import from
            state.imported = import_store_files(database, {"leases.db": settings.leases_path,
                                                           "checkpoints.db": settings.checkpoints_path})
    except BaseException:
        database.close()
        raise
    return state


def _open_postgres(url: DatabaseURL) -> CoordinatorState:
    from flashruntime.checkpoint.postgres_store import PostgresManifestStore
    from flashruntime.coordinator.postgres_node_store import PostgresNodeStore
    from flashruntime.db.postgres import PostgresDatabase
    from flashruntime.leases.postgres_store import PostgresLeaseStore

    database = PostgresDatabase(url.url, source=DATABASE_URL_SOURCE)
    try:
        with database.transaction():
            state = CoordinatorState(database, Ledger(database), PostgresLeaseStore(database),
                                     PostgresManifestStore(database), PostgresNodeStore(database), url)
        # Advisory locks are per database; a deployment is a database and a schema, so two
        # coordinators in two schemas of one database each have their own sweeper.
        name, schema = database.fetchone("SELECT current_database(), current_schema()") or ("", "")
        state.sweeper = database.session_lock(f"expiry sweeper of {name}.{schema}")
        return state
    except BaseException:
        database.close()
        raise


class InTransaction:
    """``target`` with every public method run inside a transaction by ``run`` (a
    ``CoordinatorState.run``: rerun whole when it loses a race).

    An exception of a ``refusals`` class is a refusal the target has already recorded (a
    renewal refused, a checkpoint rejected, both with an event): what was written before it
    commits, then it propagates. Any other exception rolls everything back. Attributes that
    are not methods (a manager's ``store``) pass through unchanged.
    """

    def __init__(self, target: Any, run: Callable[[Callable[[], Any]], Any],
                 refusals: tuple[type[BaseException], ...] = ()) -> None:
        self._target = target
        self._run = run
        self._refusals = refusals

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if name.startswith("_") or not callable(value):
            return value
        run, refusals = self._run, self._refusals

        @functools.wraps(value)
        def in_transaction(*args: Any, **kwargs: Any) -> Any:
            def attempt() -> tuple[Any, BaseException | None]:
                try:
                    return value(*args, **kwargs), None
                except refusals as exc:
                    return None, exc  # returned, not raised: what was written before it commits

            result, refused = run(attempt)
            if refused is not None:
                raise refused
            return result

        self.__dict__[name] = in_transaction  # found directly from now on, not through __getattr__
        return in_transaction

    def __repr__(self) -> str:
        return f"InTransaction({self._target!r})"
