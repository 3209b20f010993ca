"""kill -9 durability of ``SqliteLeaseStore``.

A forked child process drives adds, claims, heartbeats, failures, commits and sweeps on
one SQLite file and writes an acknowledgement line after each call returns. The
test SIGKILLs it at a random instant, reopens the file with a fresh store and
checks: every acknowledged transition is present; no task has two accepted
attempts; counters never go backwards; no record is both terminal and holding a
live lease; the file is intact. 32 kills, each on a later fake clock.
"""

from __future__ import annotations

import os
import random
import select
import signal
import sqlite3
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from flashruntime.leases import LeaseManager, SqliteLeaseStore
from flashruntime.leases._sqlite_sql import SCHEMA_VERSION
from flashruntime.protocol.v1alpha1 import TaskState

KILLS = 32
TERMINAL = {TaskState.COMPLETED, TaskState.FAILED, TaskState.CANCELLED}

def _drive(path: str, ack_path: str, seed: int, round_no: int, ready_fd: int) -> None:
    """The child: random transitions on the file, an acknowledgement line after each returns."""
    from flashruntime.leases import LeaseError
    from flashruntime.protocol.v1alpha1 import TaskSpec

    rng = random.Random(seed)
    manager = LeaseManager(SqliteLeaseStore(path))
    acks = open(ack_path, "a", buffering=1)  # one write() per line; the kernel keeps it across SIGKILL
    clock = datetime(2030, 1, 1, tzinfo=timezone.utc) + timedelta(hours=round_no)
    held: list = []
    serial = 0

    def add() -> None:
        nonlocal serial
        serial += 1
        task_id = f"r{round_no}-t{serial}"
        spec = TaskSpec(
            task_id=task_id,
            job_id=f"job-{serial % 3}",
            commit_key=task_id,
            lease_seconds=rng.choice([2.0, 5.0, 30.0]),
            max_attempts=3,
            max_expiries=4,
        )
        manager.add_task(spec, now=clock)
        acks.write(f"ADD {spec.job_id} {task_id}\n")

    for _ in range(3):  # work to do from the first instant
        add()
    os.write(ready_fd, b"r")
    while True:
        clock += timedelta(milliseconds=rng.randint(0, 1500))
        roll = rng.random()
        if roll < 0.12:
            add()
        elif roll < 0.45:
            lease = manager.claim(f"node-{rng.randint(0, 3)}", now=clock)
            if lease is not None:
                held.append(lease)
                acks.write(f"CLAIM {lease.job_id} {lease.task_id} {lease.lease_id} {lease.attempt_number}\n")
        elif held and roll < 0.6:
            lease = rng.choice(held)
            try:
                renewed = manager.heartbeat(lease.lease_id, now=clock)
            except LeaseError:
                held.remove(lease)
            else:
                acks.write(f"RENEW {lease.job_id} {lease.task_id} {lease.lease_id} {renewed.deadline.isoformat()}\n")
        elif held and roll < 0.7:
            lease = held.pop(rng.randrange(len(held)))
            try:
                manager.fail(lease.lease_id, "injected", now=clock)
            except LeaseError:
                pass
            else:
                acks.write(f"FAIL {lease.job_id} {lease.task_id} {lease.lease_id}\n")
        elif held and roll < 0.95:
            lease = held.pop(rng.randrange(len(held)))
            sha = lease.lease_id[3:].ljust(64, "0")
            if manager.complete(lease.lease_id, sha, now=clock):
                acks.write(f"COMMIT {lease.job_id} {lease.task_id} {lease.lease_id} {sha}\n")
        else:
            manager.sweep(now=clock)


def _run_child_until_killed(db: Path, ack_path: Path, seed: int, round_no: int, delay: float) -> None:
    """Fork a child driving transitions, SIGKILL it ``delay`` seconds after it is ready."""
    err_path = ack_path.with_suffix(".err")
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child never returns
        try:
            os.close(read_fd)
            _drive(str(db), str(ack_path), seed, round_no, write_fd)
        except BaseException:
            import traceback

            err_path.write_text(traceback.format_exc())
        finally:
            os._exit(1)
    os.close(write_fd)
    try:
        ready, _, _ = select.select([read_fd], [], [], 60)
        started = bool(ready) and os.read(read_fd, 1) == b"r"
        if started:
            time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
    finally:
        os.close(read_fd)
        _, status = os.waitpid(pid, 0)
    detail = err_path.read_text() if err_path.exists() else ""
    assert started, f"round {round_no}: the child did not start\n{detail}"
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (
        f"round {round_no}: the child ended on its own\n{detail}"
    )


@dataclass
class Snapshot:
    state: TaskState
    attempts_used: int
    failures_seen: int
    expiries_seen: int
    accepted_attempt_id: str | None


def _acknowledged(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    text = path.read_text()
    complete = text if text.endswith("\n") else text[: text.rfind("\n") + 1]  # a torn last line was not acked
    return [line.split(" ") for line in complete.splitlines() if line]


def _check_invariants(db: Path, acks: list[list[str]], previous: dict[tuple[str, str], Snapshot]) -> None:
    store = SqliteLeaseStore(db)
    try:
        manager = LeaseManager(store)
        records = {(r.spec.job_id, r.spec.task_id): r for r in store.all()}
        committed: dict[tuple[str, str], set[str]] = defaultdict(set)
        for ack in acks:
            kind, key = ack[0], (ack[1], ack[2])
            assert key in records, f"acknowledged {kind} of {key} lost"
            record = records[key]
            if kind == "CLAIM":
                lease_id, attempt = ack[3], int(ack[4])
                assert lease_id in record.lease_history, f"acknowledged claim {lease_id} lost"
                assert record.lease_history[lease_id].attempt_number == attempt
                assert record.attempts_used >= attempt
            elif kind == "RENEW":
                lease_id, deadline = ack[3], datetime.fromisoformat(ack[4])
                active = record.active_lease
                if record.state is TaskState.LEASED and active is not None and active.lease_id == lease_id:
                    assert active.deadline >= deadline, "an acknowledged renewal was lost"
            elif kind == "FAIL":
                assert record.failures_seen >= 1
            elif kind == "COMMIT":
                committed[key].add(ack[3])
                assert record.state is TaskState.COMPLETED, f"acknowledged commit of {key} lost"
                assert record.accepted_attempt_id == ack[3] and record.accepted_output_sha256 == ack[4]
        assert all(len(winners) == 1 for winners in committed.values()), "a task has two accepted attempts"

        for key, record in records.items():
            history = record.lease_history
            assert record.attempts_used == len(history)
            assert record.failures_seen + record.expiries_seen <= record.attempts_used
            assert record.failures_seen <= record.spec.max_attempts
            assert record.expiries_seen <= record.spec.max_expiries
            if record.state in TERMINAL:
                assert record.active_lease is None, f"terminal {key} holds a lease"
                for lease_id in history:
                    assert not manager.lease_is_live(lease_id, now=datetime(2000, 1, 1, tzinfo=timezone.utc))
            if record.state is TaskState.LEASED:
                assert record.active_lease is not None and record.active_lease.lease_id in history
            if record.state is TaskState.COMPLETED:
                assert record.accepted_attempt_id in history and record.accepted_output_sha256
            else:
                assert record.accepted_attempt_id is None
            before = previous.get(key)
            if before is not None:
                assert record.attempts_used >= before.attempts_used, "attempts_used went backwards"
                assert record.failures_seen >= before.failures_seen, "failures_seen went backwards"
                assert record.expiries_seen >= before.expiries_seen, "expiries_seen went backwards"
                if before.state in TERMINAL:
                    assert record.state is before.state and record.accepted_attempt_id == before.accepted_attempt_id
            previous[key] = Snapshot(
                record.state,
                record.attempts_used,
                record.failures_seen,
                record.expiries_seen,
                record.accepted_attempt_id,
            )
    finally:
        store.close()

    raw = sqlite3.connect(db)
    try:
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert raw.execute("SELECT value FROM lease_meta WHERE key = 'schema_version'").fetchone()[0] == SCHEMA_VERSION
        assert raw.execute(
            "SELECT COUNT(*) FROM lease_tasks WHERE state != 'LEASED' "
            "AND (deadline IS NOT NULL OR active_lease_id IS NOT NULL)"
        ).fetchone() == (0,)
        assert raw.execute(
            "SELECT COUNT(*) FROM lease_tasks WHERE state = 'LEASED' AND (deadline IS NULL OR active_lease_id IS NULL)"
        ).fetchone() == (0,)
        history_rows = raw.execute("SELECT COUNT(*) FROM lease_history").fetchone()[0]
        assert history_rows == raw.execute("SELECT COALESCE(SUM(attempts_used), 0) FROM lease_tasks").fetchone()[0]
    finally:
        raw.close()


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork") or not hasattr(signal, "SIGKILL"), reason="needs fork and SIGKILL")
def test_sigkill_at_random_instants_loses_no_acknowledged_transition(tmp_path: Path) -> None:
    db = tmp_path / "leases.db"
    ack_path = tmp_path / "acks.log"
    rng = random.Random(20300101)
    SqliteLeaseStore(db).close()  # the schema exists before the first child
    previous: dict[tuple[str, str], Snapshot] = {}
    progress: list[int] = []
    for round_no in range(KILLS):
        _run_child_until_killed(db, ack_path, rng.randrange(2**32), round_no, rng.uniform(0.01, 0.3))
        acks = _acknowledged(ack_path)
        progress.append(len(acks))
        _check_invariants(db, acks, previous)
    assert progress[-1] > 3 * KILLS, "the children acknowledged too little work for the kills to mean anything"
    kinds = {ack[0] for ack in _acknowledged(ack_path)}
    assert {"ADD", "CLAIM", "RENEW", "COMMIT", "FAIL"} <= kinds
    assert any(snapshot.expiries_seen for snapshot in previous.values())
