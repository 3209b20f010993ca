"""A SQL lease store's record history as loaded: what ``save`` needs to write only what
changed. Shared by the SQLite and PostgreSQL stores, which keep the same row layout."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from flashruntime.leases._models import lease_from_json
from flashruntime.protocol.v1alpha1 import Lease

__all__ = ["StoredHistory", "load_history"]


class StoredHistory(dict):  # type: ignore[type-arg]
    """A record's ``lease_history`` as loaded, carrying what ``save`` needs to write only
    what changed: the lease ids already stored, and the stored column values
    (``sql.MUTABLE``) with the active lease they were read as."""

    __slots__ = ("persisted", "stored", "stored_lease")

    def __init__(self) -> None:
        super().__init__()
        self.persisted: set[str] = set()
        self.stored: tuple[Any, ...] | None = None
        self.stored_lease: Lease | None = None


def load_history(stored: tuple[Any, ...], active: Lease | None, active_json: str | None,
                 history_rows: Iterable[tuple[str, str]], payload: Any) -> StoredHistory:
    """The history of ``history_rows`` (``(lease_id, lease_json)``), with the stored mutable
    column values and the active lease decoded from ``active_json``."""
    history = StoredHistory()
    history.stored = stored
    history.stored_lease = active
    for lease_id, lease_json in history_rows:
        # The active lease as first issued (never renewed, or renewed to the same deadline)
        # is stored twice with the same text: decode it once. Leases are never mutated in
        # place, so history and active may share the object, as they do in memory.
        if lease_json == active_json and active is not None:
            history[lease_id] = active
        else:
            history[lease_id] = lease_from_json(lease_json, payload)
    history.persisted.update(history)
    return history
