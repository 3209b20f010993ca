"""The coordinator's state in one database: jobs, events and attempt evidence (the
ledger), tasks, leases and cordons (the lease store), checkpoint manifests and parts,
and nodes, all on one ``SqliteDatabase`` that shares one transaction.

``InTransaction`` is how the coordinator calls the lease manager and the checkpoint
catalog: each call runs inside that transaction, so a transition, the events its
listener appends, and what the coordinator writes in response (a job's new state, the
attempt's evidence) commit together or not at all. Another SQL backend provides the same
four stores over one connection of its own, and the same ``transaction()``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flashruntime.checkpoint.sqlite_store import SqliteManifestStore
from flashruntime.coordinator.ledger import Ledger
from flashruntime.coordinator.settings import RuntimeSettings
from flashruntime.coordinator.sqlite_node_store import SqliteNodeStore
from flashruntime.coordinator.store_files import import_store_files
from flashruntime.leases.sqlite_store import PAGE_SIZE, SqliteLeaseStore
from flashruntime.sqlite_database import SqliteDatabase

__all__ = ["CoordinatorState", "InTransaction", "open_state"]


@dataclass
class CoordinatorState:
    """The stores of one coordinator, on one database."""

    database: SqliteDatabase
    ledger: Ledger
    leases: SqliteLeaseStore
    manifests: SqliteManifestStore
    nodes: SqliteNodeStore

    def transaction(self) -> AbstractContextManager[object]:
        """The one transaction every store here writes in; re-entrant, only the outermost commits."""
        return self.database.transaction()

    def after_commit(self, callback: Callable[[], object]) -> None:
        """Run ``callback`` once the current transaction has committed (never if it rolls back)."""
        self.database.after_commit(callback)

    def close(self) -> None:
        self.database.close()


def open_state(settings: RuntimeSettings) -> CoordinatorState:
    """Open (creating it if needed) the database at ``settings.ledger_path`` with every
    store's tables, and import ``leases.db`` / ``checkpoints.db`` found beside it."""
    database = SqliteDatabase(Path(settings.ledger_path).expanduser(), page_size=PAGE_SIZE)
    try:
        state = CoordinatorState(database, Ledger(database), SqliteLeaseStore(database),
                                 SqliteManifestStore(database), SqliteNodeStore(database))
        if str(settings.ledger_path) != ":memory:":  # a private database has no directory to import from
            import_store_files(database, {"leases.db": settings.leases_path,
                                          "checkpoints.db": settings.checkpoints_path})
    except BaseException:
        database.close()
        raise
    return state


class InTransaction:
    """``target`` with every public method run inside ``transaction()``.

    An exception of a ``refusals`` class is a refusal the target has already recorded (a
    renewal refused, a checkpoint rejected, both with an event): what was written before it
    commits, then it propagates. Any other exception rolls everything back. Attributes that
    are not methods (a manager's ``store``) pass through unchanged.
    """

    def __init__(self, target: Any, transaction: Callable[[], AbstractContextManager[object]],
                 refusals: tuple[type[BaseException], ...] = ()) -> None:
        self._target = target
        self._transaction = transaction
        self._refusals = refusals

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if name.startswith("_") or not callable(value):
            return value
        transaction, refusals = self._transaction, self._refusals

        @functools.wraps(value)
        def in_transaction(*args: Any, **kwargs: Any) -> Any:
            refused: BaseException | None = None
            with transaction():
                try:
                    return value(*args, **kwargs)
                except refusals as exc:
                    refused = exc
            raise refused  # type: ignore[misc]

        self.__dict__[name] = in_transaction  # found directly from now on, not through __getattr__
        return in_transaction

    def __repr__(self) -> str:
        return f"InTransaction({self._target!r})"
