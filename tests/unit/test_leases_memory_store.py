"""``InMemoryLeaseStore`` internals: the ordered pending set, and indexes that always
agree with a brute-force recomputation from the records."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

from flashruntime.leases import InMemoryLeaseStore, LeaseError, LeaseManager
from flashruntime.leases._memory import _SeqSet
from flashruntime.protocol.v1alpha1 import TaskSpec, TaskState

T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)


def test_seq_set_matches_a_sorted_list() -> None:
    rng = random.Random(7)
    seqs = _SeqSet()
    model: set[int] = set()
    for step in range(20000):
        value = rng.randrange(3000) if rng.random() < 0.7 else len(model) + 10_000 + step
        if rng.random() < 0.55 and value not in model:
            seqs.add(value)
            model.add(value)
        else:
            assert seqs.discard(value) == (value in model)
            model.discard(value)
        if step % 500 == 0:
            ordered = sorted(model)
            assert list(seqs.after(-1)) == ordered and len(seqs) == len(ordered)
            assert seqs.first() == (ordered[0] if ordered else None)
            key = rng.randrange(4000)
            assert list(seqs.after(key)) == [v for v in ordered if v > key]
    while model:  # draining from the head, as claims do
        head = seqs.first()
        assert head == min(model)
        assert seqs.discard(head)
        model.discard(head)  # type: ignore[arg-type]
    assert seqs.first() is None and list(seqs.after(-1)) == [] and not seqs.discard(1)


def _check_indexes(store: InMemoryLeaseStore, now: datetime) -> None:
    records = store.all()
    pending = [r for r in records if r.state is TaskState.PENDING]
    assert store.next_pending() is (pending[0] if pending else None)
    for job in ("a", "b", "c"):
        job_pending = [r for r in pending if r.spec.job_id == job]
        assert store.next_pending(job) is (job_pending[0] if job_pending else None)
        assert store.pending_page(job, -1, 10_000) == job_pending
        counts: dict[str, int] = {}
        for r in records:
            if r.spec.job_id == job:
                counts[r.state.value] = counts.get(r.state.value, 0) + 1
        assert store.counts(job) == counts
    assert store.pending_page(None, -1, 10_000) == pending
    leased = [r for r in records if r.state is TaskState.LEASED]
    assert store.leased() == leased
    for node in ("n0", "n1", "n2"):
        assert store.leased_by_node(node) == [r for r in leased if r.active_lease.node_id == node]  # type: ignore[union-attr]
    expired = sorted(
        (r for r in leased if r.active_lease.deadline <= now),  # type: ignore[union-attr]
        key=lambda r: (r.active_lease.deadline, r.seq),  # type: ignore[union-attr]
    )
    assert store.expired(now) == expired
    for r in records:
        for lease_id in r.lease_history:
            assert store.find_lease(lease_id) is r


def test_indexes_agree_with_the_records_under_random_transitions() -> None:
    rng = random.Random(11)
    store = InMemoryLeaseStore()
    manager = LeaseManager(store)
    leases = []
    clock = T0
    for i in range(4000):
        clock += timedelta(seconds=rng.choice([0, 0.5, 1, 2]))
        roll = rng.random()
        try:
            if roll < 0.2:
                manager.add_task(
                    TaskSpec(task_id=f"t{i}", job_id=rng.choice("abc"), commit_key="k",
                             lease_seconds=rng.choice([1.0, 3.0, 8.0]), max_attempts=4, max_expiries=4),
                    now=clock,
                )
            elif roll < 0.5:
                lease = manager.claim(f"n{rng.randrange(3)}", job_id=rng.choice([None, "a", "b"]), now=clock)
                if lease is not None:
                    leases.append(lease.lease_id)
            elif leases and roll < 0.65:
                manager.heartbeat(rng.choice(leases), now=clock)
            elif leases and roll < 0.8:
                manager.complete(rng.choice(leases), "0" * 64, now=clock)
            elif leases and roll < 0.9:
                manager.fail(rng.choice(leases), "x", now=clock)
            elif roll < 0.95:
                manager.sweep(now=clock)
            else:
                records = store.all()
                if records:
                    victim = rng.choice(records)
                    manager.cancel_task(victim.spec.job_id, victim.spec.task_id, now=clock)
        except LeaseError:
            pass
        if i % 200 == 0:
            _check_indexes(store, clock)
    _check_indexes(store, clock)
    _check_indexes(store, clock + timedelta(seconds=30))


def test_expiry_heap_stays_bounded_by_live_leases() -> None:
    store = InMemoryLeaseStore()
    manager = LeaseManager(store)
    for i in range(5000):
        manager.add_task(TaskSpec(task_id=f"t{i}", job_id="j", commit_key="k"), now=T0)
    for i in range(5000):
        lease = manager.claim("n", now=T0)
        assert lease is not None
        manager.heartbeat(lease.lease_id, now=T0 + timedelta(seconds=1))  # a new deadline: a new heap entry
        manager.complete(lease.lease_id, "0" * 64, now=T0 + timedelta(seconds=1))
    assert len(store._expiry) <= 2 * 1024 + 2  # outdated entries are compacted away
    assert store.expired(T0 + timedelta(days=1)) == []


def test_a_lease_ended_right_after_its_claim_leaves_no_heap_entry() -> None:
    """The newest push is usually the heap's last leaf: ending that lease drops it at once, and
    the heap stays a valid heap (the sweep still finds the others in deadline order)."""
    store = InMemoryLeaseStore()
    manager = LeaseManager(store)
    for i in range(6):
        manager.add_task(TaskSpec(task_id=f"t{i}", job_id="j", commit_key="k", lease_seconds=50.0 + i), now=T0)
    kept = [manager.claim("n", now=T0) for _ in range(3)]  # deadlines 50, 51, 52 s
    quick = manager.claim("n", now=T0)  # 53 s: pushed last, stays the last leaf
    assert quick is not None and len(store._expiry) == 4
    manager.complete(quick.lease_id, "0" * 64, now=T0)
    assert len(store._expiry) == 3
    manager.fail(kept[0].lease_id, "boom", now=T0)  # the root, not the last leaf: left for compaction
    assert len(store._expiry) == 3
    assert [r.spec.task_id for r in store.expired(T0 + timedelta(seconds=60))] == ["t1", "t2"]
