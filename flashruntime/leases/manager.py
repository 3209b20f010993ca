"""``LeaseManager``: the lease state machine.

Pull a task (``claim``), prove liveness (``heartbeat``), lose it when silent
(``sweep``), commit exactly once (``complete``), or give it back early: ``fail``
(the task's fault), ``release`` (its worker is shutting down) or ``abandon`` (its
worker died). Pure: no threads, no I/O of its own, time passed in as ``now``. Each
transition runs inside one store transaction; events are emitted after it commits,
and none are built when ``on_event`` is None.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from flashruntime.errors import LeaseError
from flashruntime.leases._checks import _check_id, _check_spec, _is_str, _node_of, _why_not_live
from flashruntime.leases._events import (
    attempt_failed,
    budget_outcome,
    commit_accepted,
    commit_rejected,
    lease_claimed,
    lease_expired,
    lease_released,
    lease_renewed,
    renewal_refused,
    task_created,
)
from flashruntime.leases._models import (
    _DELTAS,
    UTC,
    LeaseIds,
    coerce_instant,
    coerce_now,
    copy_payload,
    make_event,
    make_lease,
    renewed,
    seconds,
)
from flashruntime.leases._offer import PAGE_SIZE, offer_pending  # noqa: F401  (PAGE_SIZE: re-exported)
from flashruntime.leases.store import InMemoryLeaseStore, LeaseStore, TaskRecord, with_derived_operations
from flashruntime.protocol.lease_rules import MAX_LEASE_SECONDS, bounded_lease_seconds
from flashruntime.protocol.v1alpha1 import Event, EventType, Lease, TaskSpec, TaskState

__all__ = ["MAX_LEASE_SECONDS", "LeaseError", "LeaseManager", "bounded_lease_seconds"]

_PENDING = TaskState.PENDING
_LEASED = TaskState.LEASED
_COMPLETED = TaskState.COMPLETED
_FAILED = TaskState.FAILED
_CANCELLED = TaskState.CANCELLED
_TERMINAL = frozenset((_COMPLETED, _FAILED, _CANCELLED))
# How many choices one claim tries on a store shared by concurrent claimers, each taken by
# another claimer meanwhile, before it answers "nothing now" (the worker asks again).
_CHOICES_PER_CLAIM = 64
_datetime = datetime


class LeaseManager:
    """The lease protocol over a ``LeaseStore`` (default: ``InMemoryLeaseStore()``).

    Thread-safe: every transition runs inside ``store.transaction()`` when the
    store has one, else under a manager-level re-entrant lock. Transactions are
    re-entrant, so a caller may group transitions (``with store.transaction():``
    around many ``add_task`` calls commits once); events are then emitted as each
    transition returns, before the caller's outer transaction commits.
    """

    def __init__(
        self,
        store: LeaseStore | None = None,
        on_event: Callable[[Event], None] | None = None,
    ) -> None:
        if store is None:
            store = InMemoryLeaseStore()
        ops = with_derived_operations(store)  # TypeError naming what a non-store lacks
        self._store = store
        self.on_event = on_event
        self._ids = LeaseIds().next
        # Every store operation bound once: the transitions call them on every cycle.
        self._save = ops.save
        self._get = ops.get
        self._next_pending = ops.next_pending
        self._tx: Any = _reusable(ops.transaction)
        self._find: Callable[[str], TaskRecord | None] = ops.find_lease
        self._has_lease: Callable[[str], bool] = ops.has_lease
        self._expired: Callable[[datetime], list[TaskRecord]] = ops.expired
        self._pending_page: Callable[[str | None, int, int], list[TaskRecord]] = ops.pending_page
        self._leased_by_node: Callable[[str], list[TaskRecord]] = ops.leased_by_node
        self._counts: Callable[[str], dict[str, int]] = ops.counts
        self._put_cordon = ops.put_cordon
        self._remove_cordon = ops.remove_cordon
        self._cordons = ops.cordons
        self._cordon_for = ops.cordon_for
        # A store shared by claimers that run at once (PostgreSQL) locks only the chosen task.
        self._lock_pending: Callable[[str, str], TaskRecord | None] | None = getattr(store, "lock_pending", None)
        self._page_size: int = getattr(store, "pending_page_size", PAGE_SIZE)

    @property
    def store(self) -> LeaseStore:
        return self._store

    # --- transitions --------------------------------------------------------

    def add_task(self, spec: TaskSpec, now: datetime | None = None) -> None:
        """Queue a task (PENDING). A duplicate ``(job_id, task_id)`` raises ``ValueError``."""
        if not isinstance(spec, TaskSpec):
            raise TypeError(f"add_task takes a TaskSpec, got {type(spec).__name__}")
        _check_spec(spec)
        now = coerce_now(now)
        record = TaskRecord(spec)
        with self._tx:
            self._store.add(record)
        on_event = self.on_event
        if on_event is not None:
            on_event(task_created(spec, now))

    def cancel_task(self, job_id: str, task_id: str, now: datetime | None = None, reason: str | None = None) -> None:
        """PENDING or LEASED -> CANCELLED (the active lease stops being live); terminal: no-op.
        ``reason`` goes into the TASK_CANCELLED event (default: the job was cancelled)."""
        now = coerce_now(now)
        on_event = self.on_event
        event = None
        with self._tx:
            record = self._get(job_id, task_id) if _is_str(job_id) and _is_str(task_id) else None
            if record is None:
                raise LeaseError(f"unknown task {task_id!r} of job {job_id!r}")
            if record.state in _TERMINAL:
                return
            lease = record.active_lease
            record.state = _CANCELLED
            record.active_lease = None
            self._save(record)
            if on_event is not None:
                data: dict[str, Any] = {"task_id": task_id}
                if lease is not None:
                    data["node_id"] = lease.node_id
                    data["lease_id"] = lease.lease_id
                if reason is not None:
                    data["reason"] = reason
                message = f"task {task_id} cancelled" + ("" if reason is None else f": {reason}")
                event = make_event(EventType.TASK_CANCELLED, job_id, now, message, data)
        if event is not None:
            on_event(event)  # type: ignore[misc]

    def claim(
        self,
        node_id: str,
        job_id: str | None = None,
        now: datetime | None = None,
        policy: Any = None,
        node: dict[str, Any] | None = None,
    ) -> Lease | None:
        """Sweep, then lease the first PENDING task of the scope (all jobs, or ``job_id``)
        to ``node_id``; ``None`` when the node is cordoned or nothing is eligible."""
        if now is None or now.__class__ is not _datetime or now.tzinfo is not UTC:
            now = coerce_now(now)
        if node_id.__class__ is not str or not node_id:
            _check_id("node_id", node_id)
        if job_id is not None and job_id.__class__ is not str:
            _check_id("job_id", job_id)
        on_event = self.on_event
        events: list[Event] | None = [] if on_event is not None else None
        lease = None
        with self._tx:
            expired = self._expired(now)
            if expired and self._release_expired(expired, now, events):
                swept = True
                record = None
            else:
                swept = False
                cordon = self._cordon_for(node_id)
                if cordon is not None and (cordon[0] is None or cordon[0] > now):
                    record = None
                elif policy is None:
                    record = self._next_pending(job_id)
                else:
                    record = self._select(policy, node_id, node, job_id)
            if record is not None:
                spec = record.spec
                values = spec.__dict__  # plain reads of the validated fields
                lease_seconds = values["lease_seconds"]
                try:  # before any change to the record: a refused claim leaves it as it was
                    deadline = now + (_DELTAS.get(lease_seconds) or seconds(lease_seconds))
                except OverflowError:
                    raise _past_the_last_date(f"task {spec.task_id} (job {spec.job_id}) cannot be leased", now,
                                              lease_seconds) from None
                # The lease's own copy, even of an empty payload: changing a lease's payload never
                # changes its task.
                payload = values["payload"]
                payload = copy_payload(payload) if payload else {}
                attempt = record.attempts_used + 1
                record.attempts_used = attempt
                lease_id = self._ids()
                has_lease = self._has_lease
                while has_lease(lease_id):  # 48 random bits: practically never
                    lease_id = self._ids()
                lease = make_lease(
                    lease_id, values["task_id"], values["job_id"], node_id, attempt, deadline, payload, lease_seconds
                )
                record.state = _LEASED
                record.active_lease = lease
                record.lease_history[lease_id] = lease
                self._save(record)
                if events is not None:
                    events.append(lease_claimed(spec, node_id, lease_id, attempt, deadline, now))
        if events:
            _emit(on_event, events)  # type: ignore[arg-type]
        if swept:
            # The sweep committed as a transition of its own and its events are out; the claim
            # proper runs in a fresh transaction, so a claim that then fails (a raising policy)
            # can neither lose the sweep's events nor, on a store that rolls back, undo it.
            return self.claim(node_id, job_id, now, policy, node)
        return lease

    def heartbeat(self, lease_id: str, now: datetime | None = None) -> Lease:
        """Renew a live lease: a copy with ``deadline = now + lease_seconds`` becomes the active lease."""
        if now is None or now.__class__ is not _datetime or now.tzinfo is not UTC:
            now = coerce_now(now)
        on_event = self.on_event
        renewal = None
        with self._tx:
            record = self._find(lease_id) if lease_id.__class__ is str or _is_str(lease_id) else None
            if record is None:
                raise LeaseError(f"unknown lease id {lease_id!r}")
            active = record.active_lease
            if record.state is _LEASED and active is not None and active.lease_id == lease_id and active.deadline > now:
                lease_seconds = record.spec.lease_seconds
                try:  # before any change to the record: a refused renewal leaves it as it was
                    deadline = now + (_DELTAS.get(lease_seconds) or seconds(lease_seconds))
                except OverflowError:
                    raise _past_the_last_date(
                        f"lease {lease_id} of task {record.spec.task_id} (job {record.spec.job_id}) cannot be renewed",
                        now, lease_seconds,
                    ) from None
                renewal = renewed(active, deadline)
                record.active_lease = renewal
                self._save(record)
            else:
                why = _why_not_live(record, lease_id, now)
        spec = record.spec
        if renewal is None:
            if on_event is not None:
                on_event(renewal_refused(spec, _node_of(record, lease_id), lease_id, why, now))
            raise LeaseError(f"lease {lease_id} of task {spec.task_id} (job {spec.job_id}) is no longer live: {why}")
        if on_event is not None:
            on_event(lease_renewed(spec, renewal.node_id, lease_id, renewal.deadline, now))
        return renewal

    def complete(self, lease_id: str, output_sha256: str, now: datetime | None = None) -> bool:
        """Commit the task's output under a live lease; the first valid commit wins.

        The winner's retry returns True again (no event); any other commit is
        rejected (False, TASK_COMMIT_REJECTED). The hash is recorded, never inspected.
        """
        if now is None or now.__class__ is not _datetime or now.tzinfo is not UTC:
            now = coerce_now(now)
        if output_sha256.__class__ is not str:
            raise TypeError(f"output_sha256 must be a str, got {type(output_sha256).__name__}")
        on_event = self.on_event
        with self._tx:
            record = self._find(lease_id) if lease_id.__class__ is str or _is_str(lease_id) else None
            if record is None:
                raise LeaseError(f"unknown lease id {lease_id!r}")
            state = record.state
            if state is _COMPLETED and record.accepted_attempt_id == lease_id:
                return True  # the winner retrying: idempotent, no event
            active = record.active_lease
            if state is _LEASED and active is not None and active.lease_id == lease_id and active.deadline > now:
                record.state = _COMPLETED
                record.accepted_attempt_id = lease_id
                record.accepted_output_sha256 = output_sha256
                record.active_lease = None
                self._save(record)
                accepted = True
            else:
                accepted = False
                if on_event is not None:
                    why = _why_not_live(record, lease_id, now)
        if on_event is not None:
            spec = record.spec
            if accepted:
                on_event(commit_accepted(spec, _node_of(record, lease_id), lease_id, output_sha256, now))
            else:
                on_event(commit_rejected(spec, _node_of(record, lease_id), lease_id, why, state is _COMPLETED, now))
        return accepted

    def fail(self, lease_id: str, reason: str, now: datetime | None = None, *, retry: bool = True) -> None:
        """A worker-reported failure: spends one of ``max_attempts``, then requeue or exhaust.
        ``retry=False`` (a deterministic error, which a retry would repeat) exhausts the task
        at once, whatever budget is left."""
        now = coerce_now(now)
        if not isinstance(reason, str):
            raise TypeError(f"reason must be a str, got {type(reason).__name__}")
        on_event = self.on_event
        events: list[Event] | None = [] if on_event is not None else None
        with self._tx:
            record, active = self._live(lease_id, now)
            record.failures_seen += 1
            if events is not None:
                events.append(attempt_failed(record.spec, active, reason, now))
            self._release(record, active, False, now, events, final=not retry)
        if events:
            _emit(on_event, events)  # type: ignore[arg-type]

    def release(self, lease_id: str, reason: str = "", now: datetime | None = None) -> None:
        """Give back a live lease whose worker is shutting down (a drain): the task is PENDING
        again at once and spends neither budget; ``releases_seen`` counts it. Emits
        LEASE_RELEASED and TASK_REQUEUED. A lease that is not live raises ``LeaseError``."""
        now = coerce_now(now)
        if not isinstance(reason, str):
            raise TypeError(f"reason must be a str, got {type(reason).__name__}")
        on_event = self.on_event
        events: list[Event] | None = [] if on_event is not None else None
        with self._tx:
            record, active = self._live(lease_id, now)
            record.releases_seen += 1
            record.active_lease = None
            record.state = _PENDING
            self._save(record)
            if events is not None:
                events.extend(lease_released(record.spec, active, reason, record.releases_seen, now))
        if events:
            _emit(on_event, events)  # type: ignore[arg-type]

    def abandon(self, lease_id: str, reason: str = "", now: datetime | None = None) -> TaskState:
        """End a live lease whose worker died, as that worker's restarted self reports: what an
        expiry does, without waiting for the deadline. It spends one of ``max_expiries``, then
        the task is requeued or exhausted; emits LEASE_EXPIRED (``abandoned: true`` in its data)
        and TASK_REQUEUED or TASK_EXHAUSTED. Returns the task's state after it. A lease that is
        not live raises ``LeaseError``."""
        now = coerce_now(now)
        if not isinstance(reason, str):
            raise TypeError(f"reason must be a str, got {type(reason).__name__}")
        on_event = self.on_event
        events: list[Event] | None = [] if on_event is not None else None
        with self._tx:
            record, active = self._live(lease_id, now)
            record.expiries_seen += 1
            if events is not None:
                events.append(lease_expired(record.spec, active, now, abandoned_because=reason))
            self._release(record, active, True, now, events)
            state = record.state
        if events:
            _emit(on_event, events)  # type: ignore[arg-type]
        return state

    def sweep(self, now: datetime | None = None) -> int:
        """Expire every LEASED record whose deadline is at or before ``now``, in
        ``(deadline, seq)`` order; each spends one of ``max_expiries``. Returns the count."""
        now = coerce_now(now)
        on_event = self.on_event
        events: list[Event] | None = [] if on_event is not None else None
        with self._tx:
            expired = self._expired(now)
            count = self._release_expired(expired, now, events) if expired else 0
        if events:
            _emit(on_event, events)  # type: ignore[arg-type]
        return count

    # --- cordons ------------------------------------------------------------

    def cordon(self, node_id: str, until: datetime | None = None, reason: str = "", now: datetime | None = None) -> None:
        """Stop leasing to ``node_id`` until ``until`` (None = until ``uncordon``); replaces any
        previous cordon of the node. Leases the node already holds are unaffected."""
        now = coerce_now(now)
        _check_id("node_id", node_id)
        if not isinstance(reason, str):
            raise TypeError(f"reason must be a str, got {type(reason).__name__}")
        if until is not None:
            until = coerce_instant(until, "until")
            if until <= now:
                raise ValueError(
                    f"cordon of {node_id} until {until.isoformat()} is not after now ({now.isoformat()}); "
                    "pass a later time, or until=None for an indefinite cordon"
                )
        with self._tx:
            self._put_cordon(node_id, until, reason)
        on_event = self.on_event
        if on_event is not None:
            until_text = until.isoformat() if until is not None else None
            on_event(
                make_event(
                    EventType.NODE_CORDONED,
                    "",
                    now,
                    f"node {node_id} cordoned " + (f"until {until_text}" if until_text else "until uncordoned")
                    + (f": {reason}" if reason else ""),
                    {"node_id": node_id, "until": until_text, "reason": reason},
                )
            )

    def uncordon(self, node_id: str, *, now: datetime | None = None) -> bool:
        """Remove the node's cordon; True if one was in effect at ``now``. A lapsed cordon is
        removed too, but it no longer kept the node from claiming, so that is False."""
        if not _is_str(node_id):
            return False
        now = coerce_now(now)
        with self._tx:
            cordon = self._cordon_for(node_id)
            if cordon is None:
                return False
            self._remove_cordon(node_id)
            until = cordon[0]
            return until is None or until > now

    def cordoned(self, now: datetime | None = None) -> dict[str, tuple[datetime | None, str]]:
        """Cordons in effect at ``now`` (node id -> (until, reason)); lapsed ones are dropped."""
        now = coerce_now(now)
        with self._tx:
            active: dict[str, tuple[datetime | None, str]] = {}
            for node_id, (until, reason) in self._cordons().items():
                if until is None or until > now:
                    active[node_id] = (until, reason)
                else:
                    self._remove_cordon(node_id)
            return active

    # --- queries ------------------------------------------------------------

    def lease_is_live(self, lease_id: str, now: datetime | None = None) -> bool:
        """LEASED, this is the active lease, and its deadline is strictly after ``now``."""
        now = coerce_now(now)
        record = self._find(lease_id) if _is_str(lease_id) else None
        if record is None:
            return False
        active = record.active_lease
        return record.state is _LEASED and active is not None and active.lease_id == lease_id and active.deadline > now

    def job_state(self, job_id: str) -> dict[str, int]:
        """Counts of the job's records by ``TaskState`` value; zero counts omitted."""
        counts = self._counts(job_id)
        return {state.value: counts[state.value] for state in TaskState if counts.get(state.value)}

    def records(self, job_id: str | None = None) -> list[TaskRecord]:
        """All records (of one job) in insertion order."""
        return self._store.all(job_id)

    def lease_info(self, lease_id: str) -> Lease | None:
        """Any lease ever issued, as first issued."""
        record = self._find(lease_id) if _is_str(lease_id) else None
        return None if record is None else record.lease_history.get(lease_id)

    def lease_standing(self, lease_id: str, now: datetime | None = None) -> tuple[str, str | None] | None:
        """``("live", None)`` while ``lease_id`` is its task's live lease; ``("cancelled", why)``
        once its task was cancelled while it was; ``("ended", why)`` when it ended otherwise;
        None for an id never issued. A read: nothing changes."""
        now = coerce_now(now)
        record = self._find(lease_id) if _is_str(lease_id) else None
        if record is None:
            return None
        active = record.active_lease
        if record.state is _LEASED and active is not None and active.lease_id == lease_id and active.deadline > now:
            return "live", None
        why = _why_not_live(record, lease_id, now)
        return ("cancelled" if record.state is _CANCELLED else "ended"), why

    def live_leases_for_node(self, node_id: str, now: datetime | None = None) -> set[tuple[str, str]]:
        """``(job_id, task_id)`` of the tasks whose live active lease belongs to ``node_id``."""
        now = coerce_now(now)
        if not _is_str(node_id):
            return set()
        out: set[tuple[str, str]] = set()
        for record in self._leased_by_node(node_id):
            active = record.active_lease
            if record.state is _LEASED and active is not None and active.node_id == node_id and active.deadline > now:
                out.add((record.spec.job_id, record.spec.task_id))
        return out

    # --- internals ----------------------------------------------------------

    def _live(self, lease_id: str, now: datetime) -> tuple[TaskRecord, Lease]:
        """(record, active lease) when ``lease_id`` is the task's live lease, inside the
        caller's transaction; else ``LeaseError`` saying why, with nothing changed."""
        record = self._find(lease_id) if _is_str(lease_id) else None
        if record is None:
            raise LeaseError(f"unknown lease id {lease_id!r}")
        active = record.active_lease
        if not (
            record.state is _LEASED and active is not None and active.lease_id == lease_id and active.deadline > now
        ):
            why = _why_not_live(record, lease_id, now)
            spec = record.spec
            raise LeaseError(f"lease {lease_id} of task {spec.task_id} (job {spec.job_id}) is no longer live: {why}")
        return record, active

    def _release(
        self,
        record: TaskRecord,
        lease: Lease,
        expiry: bool,
        now: datetime,
        events: list[Event] | None,
        *,
        final: bool = False,
    ) -> None:
        """The release rule shared by ``fail`` and ``sweep``: clear the lease, then
        FAILED if the cause's budget is spent (or ``final``), else PENDING."""
        spec = record.spec
        if expiry:
            used, budget = record.expiries_seen, spec.max_expiries
        else:
            used, budget = record.failures_seen, spec.max_attempts
        exhausted = final or used >= budget
        record.active_lease = None
        record.state = _FAILED if exhausted else _PENDING
        self._save(record)
        if events is not None:
            events.append(budget_outcome(spec, lease, expiry, exhausted, used, budget, now))

    def _release_expired(self, expired: list[TaskRecord], now: datetime, events: list[Event] | None) -> int:
        count = 0
        for record in expired:
            lease = record.active_lease
            if record.state is not _LEASED or lease is None or lease.deadline > now:
                continue  # a store may be conservative; the manager decides
            record.expiries_seen += 1
            if events is not None:
                events.append(lease_expired(record.spec, lease, now))
            self._release(record, lease, True, now, events)
            count += 1
        return count

    def _select(self, policy: Any, node_id: str, node: dict[str, Any] | None, job_id: str | None) -> TaskRecord | None:
        """offer pending specs to the policy, then re-locate its choice.

        On a store with ``lock_pending`` the pages are read without locks and only the choice
        is locked; a choice another claimer took (or is taking) meanwhile is left out and the
        rest offered again, so claimers running at once each get a task while any is free."""
        view = node if node is not None else {"node_id": node_id}
        lock_pending = self._lock_pending
        excluded: set[tuple[str, str]] = set()
        for _ in range(_CHOICES_PER_CLAIM):
            chosen = offer_pending(policy, view, lambda after, limit: self._page_without(job_id, after, limit, excluded),
                                   self._page_size)
            if chosen is None:
                return None
            chosen_job = getattr(chosen, "job_id", None)
            chosen_task = getattr(chosen, "task_id", None)
            if not _is_str(chosen_job) or not _is_str(chosen_task):
                return None
            if job_id is not None and chosen_job != job_id:
                return None
            if lock_pending is None:
                record = self._get(chosen_job, chosen_task)
                if record is None or record.state is not _PENDING:
                    return None  # a foreign or stale spec
                return record
            record = lock_pending(chosen_job, chosen_task)
            if record is not None:
                return record
            if (chosen_job, chosen_task) in excluded:
                return None  # a policy that keeps choosing what it was not offered
            excluded.add((chosen_job, chosen_task))
        return None  # every choice was taken meanwhile: the caller asks again

    def _page_without(self, job_id: str | None, after: int, limit: int,
                      excluded: set[tuple[str, str]]) -> list[TaskRecord]:
        """A page of ``limit`` pending records after ``after`` without those in ``excluded``
        (read ``limit + len(excluded)`` so that a full page still means more may follow)."""
        if not excluded:
            return self._pending_page(job_id, after, limit)
        page = self._pending_page(job_id, after, limit + len(excluded))
        kept = [record for record in page if (record.spec.job_id, record.spec.task_id) not in excluded]
        return kept[:limit] if len(page) == limit + len(excluded) else kept


# --- helpers -------------------------------------------------------------------


def _emit(on_event: Callable[[Event], None], events: Sequence[Event]) -> None:
    for event in events:
        on_event(event)


class _PerCall:
    """A store's transaction whose ``transaction()`` makes a fresh context manager on each
    call, as one re-entrant context the manager can enter for every transition."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self._factory = factory
        self._local = threading.local()

    def __enter__(self) -> Any:
        stack = self._local.__dict__.setdefault("stack", [])
        context = self._factory()
        value = context.__enter__()
        stack.append(context)
        return value

    def __exit__(self, *exc: Any) -> Any:
        return self._local.stack.pop().__exit__(*exc)


def _reusable(transaction: Callable[[], Any]) -> Any:
    """The store's own context manager when ``transaction()`` keeps returning the same
    (re-entrant) object, as every store here does; else one asking for a fresh one each time."""
    first = transaction()
    return first if first is transaction() else _PerCall(transaction)


def _past_the_last_date(what: str, now: datetime, lease_seconds: float) -> ValueError:
    """The refusal of a claim or renewal whose deadline no ``datetime`` can hold."""
    return ValueError(
        f"{what} at {now.isoformat()}: now + lease_seconds ({lease_seconds:g} s) is past the last date a "
        "datetime can hold"
    )
