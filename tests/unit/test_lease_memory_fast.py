"""The fused in-memory transitions (``leases._memory_fast``) behave exactly as the
manager's general path over the same store: the same random operations, driven
through both, give the same results, errors, events, records and indexes."""

from __future__ import annotations

import copy
import gc
import inspect
import random
import signal
import threading
import weakref
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from flashruntime.leases import InMemoryLeaseStore, LeaseError, LeaseManager
from flashruntime.leases._models import LeaseIds
from flashruntime.protocol.v1alpha1 import Event, Lease, TaskSpec

T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)
NODES = ("n1", "n2", "n3")
JOBS = ("job-a", "job-b")


class GeneralPathStore(InMemoryLeaseStore):
    """The same store, which the manager drives through its general path (it never fuses a subclass)."""


def fused(manager: LeaseManager) -> bool:
    return manager._fast is not None


def test_the_manager_fuses_only_a_plain_in_memory_store() -> None:
    assert fused(LeaseManager())
    assert fused(LeaseManager(InMemoryLeaseStore()))
    assert not fused(LeaseManager(GeneralPathStore()))
    spied = InMemoryLeaseStore()
    spied.next_pending = spied.next_pending  # type: ignore[method-assign]  # any replacement counts
    assert not fused(LeaseManager(spied))


def test_a_spy_on_the_store_sees_every_save(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replaced store method, on the instance or the class, turns fusing off: it sees what
    the general path gives it."""
    store = InMemoryLeaseStore()
    saved: list[str] = []
    plain_save = store.save
    store.save = lambda record: (saved.append(record.state.value), plain_save(record))  # type: ignore[method-assign]
    manager = LeaseManager(store)
    manager.add_task(TaskSpec(task_id="t", job_id="j", commit_key="j/t"), now=T0)
    lease = manager.claim("n1", now=T0)
    assert lease is not None
    manager.heartbeat(lease.lease_id, now=T0)
    manager.complete(lease.lease_id, "ab" * 32, now=T0)
    assert saved == ["PENDING", "LEASED", "LEASED", "COMPLETED"]

    failing: list[str] = []
    monkeypatch.setattr(InMemoryLeaseStore, "save", lambda self, record: failing.append("save"))
    assert not fused(LeaseManager(InMemoryLeaseStore()))


def test_methods_stay_methods_of_the_class(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fusing binds nothing on the instance: a subclass override, a patch of the class made
    after the manager exists, and a copy all behave as with any other store."""
    seen: list[str] = []

    class Logged(LeaseManager):
        def heartbeat(self, lease_id: str, now: datetime | None = None) -> Lease:
            seen.append(lease_id)
            return super().heartbeat(lease_id, now)

    manager = Logged(InMemoryLeaseStore())
    assert fused(manager)
    manager.add_task(TaskSpec(task_id="t", job_id="j", commit_key="j/t"), now=T0)
    lease = manager.claim("n1", now=T0)
    assert lease is not None and manager.heartbeat(lease.lease_id, now=T0).lease_id == lease.lease_id
    assert seen == [lease.lease_id]

    original = LeaseManager(InMemoryLeaseStore(), on_event=lambda event: None)
    events: list[Event] = []
    duplicate = copy.copy(original)
    duplicate.on_event = events.append
    duplicate.add_task(TaskSpec(task_id="t", job_id="j", commit_key="j/t"), now=T0)
    assert duplicate.claim("n1", now=T0) is not None
    assert [event.type.value for event in events] == ["TASK_CREATED", "LEASE_CLAIMED"]

    monkeypatch.setattr(LeaseManager, "claim", lambda self, *args, **kwargs: "patched")
    assert original.claim("n1", now=T0) == "patched"


def test_the_fused_methods_keep_the_general_methods_signature_and_docs() -> None:
    for name in ("claim", "heartbeat", "complete"):
        method = getattr(LeaseManager, name)
        general = method.__wrapped__
        assert method.__qualname__ == f"LeaseManager.{name}"
        assert method.__doc__ == general.__doc__ and method.__doc__
        # follow_wrapped=False: the wrapper's own parameter list, which restates the general one
        assert inspect.signature(method, follow_wrapped=False) == inspect.signature(general)
        assert list(inspect.signature(general).parameters)[:2] == ["self", "node_id" if name == "claim" else "lease_id"]


def lock_is_free(store: InMemoryLeaseStore) -> bool:
    """Whether another thread can take the store's lock now."""
    taken: list[bool] = []

    def probe() -> None:
        got = store._lock.acquire(blocking=False)
        taken.append(got)
        if got:
            store._lock.release()

    thread = threading.Thread(target=probe)
    thread.start()
    thread.join(timeout=10)
    return taken == [True]


def test_the_lock_is_released_on_every_way_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """Empty queue, a case handed to the general path, a refusal, and an exception raised
    inside the locked section: each leaves the store's lock free for other threads."""
    store = InMemoryLeaseStore()
    manager = LeaseManager(store)
    assert fused(manager)
    assert manager.claim("n1", now=T0) is None and lock_is_free(store)

    manager.add_task(TaskSpec(task_id="t1", job_id="j", commit_key="j/t1"), now=T0)
    manager.cordon("n2", reason="maintenance", now=T0)
    assert manager.claim("n2", now=T0) is None and lock_is_free(store)  # the cordon: the general path
    with pytest.raises(LeaseError):
        manager.heartbeat("ls-000000000000", now=T0)
    assert lock_is_free(store)
    with pytest.raises(LeaseError):
        manager.complete("ls-000000000000", "ab" * 32, now=T0)
    assert lock_is_free(store)

    def broken() -> None:
        raise RuntimeError("compaction failed")

    monkeypatch.setattr(store, "_compact_at", -1)
    monkeypatch.setattr(store, "_compact_expiry", broken)
    with pytest.raises(RuntimeError, match="compaction failed"):
        manager.claim("n1", now=T0)
    assert lock_is_free(store)


class _Tick(Exception):
    """What the test's signal handler raises, as SIGINT's handler raises KeyboardInterrupt."""


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs signal.setitimer (POSIX)")
def test_an_exception_from_a_signal_handler_never_leaves_the_lock_held() -> None:
    """A handler's exception surfaces at the next CALL: after ``lock.acquire()`` returned
    and before a ``try`` it would leak the lock, so the fused methods use ``with``. Hundreds
    of interrupts land inside heartbeats (fused) and empty-queue claims; none leaves it held."""
    store = InMemoryLeaseStore()
    manager = LeaseManager(store)
    assert fused(manager)
    manager.add_task(TaskSpec(task_id="t", job_id="j", commit_key="j/t", lease_seconds=3600.0), now=T0)
    lease = manager.claim("n1", now=T0)
    assert lease is not None
    armed = False

    def handler(signum: int, frame: object) -> None:
        if armed:
            raise _Tick

    previous = signal.signal(signal.SIGALRM, handler)
    interrupts = leaked = 0
    signal.setitimer(signal.ITIMER_REAL, 0.0002, 0.0002)
    try:
        for i in range(2_000_000):  # hang guard; 200 interrupts take well under a second
            try:
                armed = True
                if i % 2:
                    manager.heartbeat(lease.lease_id, now=T0)
                else:
                    manager.claim("n2", now=T0)  # nothing pending: returns None from inside the lock
                armed = False
            except _Tick:
                armed = False
                interrupts += 1
                while store._lock._is_owned():  # type: ignore[attr-defined]
                    leaked += 1
                    store._lock.release()
                if interrupts >= 200:
                    break
    finally:
        armed = False
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
        signal.signal(signal.SIGALRM, previous)
    assert interrupts >= 200
    assert leaked == 0, f"{leaked} of {interrupts} interrupts left the store's lock held"
    assert manager.heartbeat(lease.lease_id, now=T0).lease_id == lease.lease_id


def test_a_dropped_manager_is_freed_at_once() -> None:
    """No reference cycle through the fused transitions: refcounting alone frees a manager."""
    gc.disable()
    try:
        manager = LeaseManager(InMemoryLeaseStore())
        ref = weakref.ref(manager)
        del manager
        assert ref() is None
    finally:
        gc.enable()


@pytest.fixture
def counted_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lease ids from a counter per generator, every seventh draw repeating the previous
    one: both managers see the same ids, clashes included."""
    drawn: dict[int, int] = {}

    def next_id(self: LeaseIds) -> str:
        n = drawn[id(self)] = drawn.get(id(self), 0) + 1
        return f"ls-{(n - 1 if n % 7 == 0 else n):012x}"

    monkeypatch.setattr(LeaseIds, "next", next_id)


def outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    try:
        result = call()
    except (LeaseError, TypeError, ValueError) as error:
        # The chained exceptions too: a fused refusal must not carry a _TakeGeneralPath context.
        chained = (error.__cause__, error.__context__, error.__suppress_context__)
        return ("raised", (type(error).__name__, str(error), *(type(e).__name__ for e in chained[:2]), chained[2]))
    if isinstance(result, Lease):
        return ("lease", result.model_dump())
    return ("value", result)


def event_view(event: Event) -> tuple[Any, ...]:
    return (event.type, event.job_id, event.timestamp, event.source, event.message, event.data)


def store_view(store: InMemoryLeaseStore, now: datetime) -> dict[str, Any]:
    """Every record field and every index the store keeps."""
    records = [
        (
            r.seq, r.spec.job_id, r.spec.task_id, r.state, r.attempts_used, r.failures_seen, r.expiries_seen,
            None if r.active_lease is None else r.active_lease.model_dump(),
            r.accepted_attempt_id, r.accepted_output_sha256,
            {lease_id: lease.model_dump() for lease_id, lease in r.lease_history.items()},
        )
        for r in store.all()
    ]
    entries = {seq: (e.state, e.node_id, e.lease_id, e.deadline) for seq, e in store._entries.items()}
    return {
        "records": records,
        "entries": entries,
        "pending": [r.seq for r in store.pending_page(None, 0, 10**6)],
        "job_pending": {job: [r.seq for r in store.pending_page(job, 0, 10**6)] for job in JOBS},
        "by_lease": sorted((lease_id, r.seq) for lease_id, r in store._by_lease.items()),
        "by_node": {node: sorted(held) for node, held in store._by_node.items()},
        "heap": list(store._expiry),
        "counts": {job: store.counts(job) for job in JOBS},
        "expired": [r.seq for r in store.expired(now)],
        "leased": [r.seq for r in store.leased()],
    }


class Pair:
    """One manager on the fused path and one on the general path, fed the same calls."""

    def __init__(self) -> None:
        self.events: tuple[list[Event], list[Event]] = ([], [])
        self.seen: set[str] = set()  # event types emitted so far
        self.stores = (InMemoryLeaseStore(), GeneralPathStore())
        self.managers = tuple(
            LeaseManager(store, on_event=events.append) for store, events in zip(self.stores, self.events)
        )
        assert fused(self.managers[0]) and not fused(self.managers[1])
        for store in self.stores:
            store._compact_at = 16  # compact the expiry heap often: the fused path must follow it

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[str, Any]:
        fast, general = (outcome(lambda m=m: getattr(m, name)(*args, **kwargs)) for m in self.managers)
        assert fast == general, f"{name}{args}{kwargs}"
        fast_events, general_events = ([event_view(e) for e in events] for events in self.events)
        assert fast_events == general_events, f"{name}{args}{kwargs}"
        self.seen.update(event.type.value for event in self.events[0])
        for events in self.events:
            events.clear()
        return fast

    def same_state(self, now: datetime) -> None:
        fast, general = (store_view(store, now) for store in self.stores)
        assert fast == general


@pytest.mark.parametrize("seed", range(12))
def test_fused_and_general_paths_agree_on_random_operations(seed: int, counted_ids: None) -> None:
    rng = random.Random(seed)
    pair = Pair()
    issued: list[str] = ["ls-ffffffffffff"]  # one id nobody issued
    clock = 0.0
    for step in range(600):
        clock += rng.choice((0.0, 0.0, 0.5, 1.0, 3.0, 20.0))
        if rng.random() < 0.03:
            clock -= rng.uniform(0, 30)  # a caller whose clock is behind
        now = T0 + timedelta(seconds=clock)
        if rng.random() < 0.2:
            now = now.replace(tzinfo=None)  # naive: read as UTC
        roll = rng.random()
        lease_id = issued[-1] if rng.random() < 0.6 else rng.choice(issued)
        if roll < 0.16:
            job = rng.choice(JOBS)
            task = f"t{step:04d}" if rng.random() < 0.95 else "t0000"  # an occasional duplicate
            fields: dict[str, Any] = {
                "lease_seconds": rng.choice((1.0, 5.0, 30.0)),
                "max_attempts": rng.choice((1, 2, 3)),
                "max_expiries": rng.choice((1, 2, 3)),
            }
            if rng.random() < 0.3:
                fields["payload"] = {"shard": step, "cfg": {"lr": [0.1, 0.01]}}
            spec = TaskSpec(task_id=task, job_id=job, commit_key=f"{job}/{task}", **fields)
            pair.call("add_task", spec, now=now)
        elif roll < 0.42:
            node: Any = rng.choice(NODES)
            job_id = rng.choice(JOBS) if rng.random() < 0.15 else None
            if rng.random() < 0.03:
                node = rng.choice(("", 7))
            kind, value = pair.call("claim", node, job_id, now=now)
            if kind == "lease":
                issued.append(value["lease_id"])
        elif roll < 0.62:
            target: Any = lease_id if rng.random() > 0.03 else 42
            pair.call("heartbeat", target, now=now)
        elif roll < 0.80:
            sha: Any = "ab" * 32 if rng.random() > 0.03 else b"x"
            target = lease_id if rng.random() > 0.03 else None
            pair.call("complete", target, sha, now=now)
        elif roll < 0.86:
            pair.call("fail", lease_id, "worker said so", now=now)
        elif roll < 0.89:
            job = rng.choice(JOBS)
            pair.call("cancel_task", job, f"t{rng.randrange(step + 1):04d}", now=now)
        elif roll < 0.93:
            until = None if rng.random() < 0.3 else T0 + timedelta(seconds=clock + rng.choice((-1.0, 2.0, 10.0)))
            pair.call("cordon", rng.choice(NODES), until, "maintenance", now=now)
        elif roll < 0.96:
            pair.call("uncordon", rng.choice(NODES))
        else:
            pair.call("sweep", now=now)
        if step % 25 == 0:
            pair.same_state(T0 + timedelta(seconds=clock))
    pair.same_state(T0 + timedelta(seconds=clock + 100))
    # The sequence went through every kind of outcome, fused and general.
    assert pair.seen >= {
        "TASK_CREATED", "LEASE_CLAIMED", "LEASE_RENEWED", "LEASE_RENEWAL_REFUSED", "TASK_COMMIT_ACCEPTED",
        "TASK_COMMIT_REJECTED", "LEASE_EXPIRED", "TASK_REQUEUED", "TASK_ATTEMPT_FAILED", "NODE_CORDONED",
    }


def test_a_claim_with_a_policy_takes_the_general_path_with_the_same_result(counted_ids: None) -> None:
    from flashruntime.scheduler import FifoPlacement

    pair = Pair()
    for i in range(3):
        pair.call("add_task", TaskSpec(task_id=f"t{i}", job_id="job-a", commit_key=f"job-a/t{i}"), now=T0)
    assert pair.call("claim", "n1", None, T0, FifoPlacement(), {"node_id": "n1"})[0] == "lease"
    pair.same_state(T0)
