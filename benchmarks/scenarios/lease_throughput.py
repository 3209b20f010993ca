"""``lease_throughput``: drain N tasks, one cycle = claim -> heartbeat ->
complete on ``LeaseManager(store, on_event=None)``, one thread, no policy.

Both stores at N = 1k, 10k, 100k (``--smoke``: 1k only). The N tasks are added
before timing; the drain is timed like ``timeit`` (``gc.collect()``, then GC off).
cycles/s = N / drain wall time; the per-cycle median comes from ``perf_counter_ns``
around each cycle. Every drain is a sample; short drains are repeated so that each N
is sampled over the same stretch of time, and the in-memory rounds (~9 s each) are
interleaved with the SQLite ones (~1.5 min each) so that both stores' samples span the
whole run (see ``_store_rows``). The SQLite file lives on the repository's filesystem.

Targets (``benchmarks.targets``), each judged against a floor drained in the same run:
in memory >= 0.5x ``memory_floor`` (the least any in-memory cycle with this API costs,
see ``_MemoryFloor``, drained after each in-memory drain) at every N; on a SQLite file
>= 0.4x ``sqlite_floor`` (the same three single-row committed UPDATEs per cycle under the
same pragmas) at every N; for both, per-cycle median at 100k <= 1.3x the one at 1k.
Informational rows, without targets: GC enabled, ``on_event=list.append``.

The host has slow spells, per vCPU, that the kernel cannot see (``benchmarks.pace``).
Each round is therefore pinned to the CPU on which the reference workload runs fastest
at its start, and the rows' notes name the CPU and its pace, round by round.

As the cycle is defined, all three calls take the same ``now``, so the renewal
leaves the deadline unchanged and ``SqliteLeaseStore`` (which writes only changed
columns) commits no page for it; the floor still pays its three writes. The SQLite
rows say so in their notes.
"""

from __future__ import annotations

import gc
import os
import shutil
import sqlite3
import statistics
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks.host import filesystem_type
from benchmarks.pace import pinned_to_quietest_cpu
from benchmarks.registry import Scenario
from benchmarks.rows import measured_row, skipped_row
from benchmarks.targets import LEASE_FLATNESS, LEASE_MEMORY_OVER_FLOOR, LEASE_SQLITE_OVER_FLOOR

NAME = "lease_throughput"
SECTION = "performance"
SIZES = (1_000, 10_000, 100_000)
SMOKE_SIZES = (1_000,)
FLOOR_MAX_CYCLES = 20_000  # the floor is a rate; beyond this many cycles it only costs time
CYCLES_PER_ROUND = {"memory": 20_000, "sqlite": 5_000}  # cycles drained per N per round (see _store_rows)
MEMORY_ROUNDS = 5
MEMORY_ROUNDS_PER_SQLITE_ROUND = 2
NOW = datetime(2030, 1, 1, tzinfo=timezone.utc)
JOB = "bench-job"
NODE = "bench-node"
SHA = "0" * 64

TARGETS = {"memory": LEASE_MEMORY_OVER_FLOOR, "sqlite": LEASE_SQLITE_OVER_FLOOR}
FLOORS = {"memory": "memory_floor", "sqlite": "sqlite_floor"}
FLATNESS = LEASE_FLATNESS
STORE_LABELS = {"memory": "InMemoryLeaseStore", "sqlite": "SqliteLeaseStore file"}

Drain = tuple[float, float]  # (cycles per second, per-cycle median in microseconds)


def _specs(count: int) -> list[Any]:
    from flashruntime.protocol.v1alpha1 import TaskSpec

    return [TaskSpec(task_id=f"task-{i:06d}", job_id=JOB, commit_key=f"{JOB}/task-{i:06d}") for i in range(count)]


def _remove_db(path: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def _timed_cycles(cycle: Callable[[int], None], count: int, gc_enabled: bool) -> Drain:
    """Run ``cycle(i)`` for i < count, timed like timeit: collect, then GC off unless asked."""
    per_cycle = [0] * count
    clock = time.perf_counter_ns
    gc.collect()
    was_enabled = gc.isenabled()
    if not gc_enabled:
        gc.disable()
    try:
        start = previous = clock()
        for i in range(count):
            cycle(i)
            now = clock()
            per_cycle[i] = now - previous
            previous = now
    finally:
        if was_enabled:
            gc.enable()
    elapsed_s = (previous - start) / 1e9
    return count / elapsed_s, statistics.median(per_cycle) / 1000.0


def _drain(kind: str, specs: Sequence[Any], work_dir: Path, *, gc_enabled: bool = False, events: bool = False) -> Drain:
    from flashruntime.leases import InMemoryLeaseStore, LeaseManager, SqliteLeaseStore

    path = work_dir / f"drain-{os.getpid()}-{time.monotonic_ns()}.db"
    store: Any = InMemoryLeaseStore() if kind == "memory" else SqliteLeaseStore(path)
    received: list[Any] = []
    manager = LeaseManager(store, on_event=received.append if events else None)
    try:
        with store.transaction():  # setup, untimed: one commit for all N tasks
            for spec in specs:
                manager.add_task(spec, now=NOW)
        received.clear()
        claim, heartbeat, complete = manager.claim, manager.heartbeat, manager.complete

        def cycle(_: int) -> None:
            lease_id = claim(NODE, now=NOW).lease_id  # type: ignore[union-attr]
            heartbeat(lease_id, now=NOW)
            complete(lease_id, SHA, now=NOW)

        result = _timed_cycles(cycle, len(specs), gc_enabled)
        done = manager.job_state(JOB)
        if done != {"COMPLETED": len(specs)}:
            raise RuntimeError(f"the drain did not complete every task: {done}")
        if events and len(received) != 3 * len(specs):
            raise RuntimeError(f"expected {3 * len(specs)} events, got {len(received)}")
        return result
    finally:
        if kind == "sqlite":
            store.close()
            _remove_db(path)


def _memory_floor(specs: Sequence[Any]) -> Drain:
    """The least an in-memory claim -> heartbeat -> complete cycle with this API costs: one
    re-entrant lock per call, a FIFO of records, a lease-id dict, the liveness test, and the
    same ``Lease`` builders and lease ids the manager uses. Nothing else: no sweep, no
    cordons, no per-node, per-job or expiry indexes, no counts, no argument checks. Its
    timing is the host's speed on this workload at that moment, not a design to adopt."""
    from flashruntime.leases._models import LeaseIds, make_lease, renewed, seconds
    from flashruntime.leases.store import TaskRecord
    from flashruntime.protocol.v1alpha1 import TaskState

    leased, completed = TaskState.LEASED, TaskState.COMPLETED
    lock = threading.RLock()
    queue = deque(TaskRecord(spec) for spec in specs)
    by_lease: dict[str, Any] = {}
    next_id = LeaseIds().next

    def claim(node_id: str, now: datetime) -> Any:
        with lock:
            record = queue.popleft()
            spec = record.spec
            attempt = record.attempts_used = record.attempts_used + 1
            lease_id = next_id()
            lease = make_lease(lease_id, spec.task_id, spec.job_id, node_id, attempt,
                               now + seconds(spec.lease_seconds), spec.payload, spec.lease_seconds)
            record.state = leased
            record.active_lease = lease
            record.lease_history[lease_id] = lease
            by_lease[lease_id] = record
        return lease

    def heartbeat(lease_id: str, now: datetime) -> Any:
        with lock:
            record = by_lease[lease_id]
            active = record.active_lease
            if record.state is not leased or active is None or active.lease_id != lease_id or active.deadline <= now:
                raise RuntimeError(f"memory_floor: lease {lease_id} is not live")
            renewal = record.active_lease = renewed(active, now + seconds(record.spec.lease_seconds))
        return renewal

    def complete(lease_id: str, output_sha256: str, now: datetime) -> bool:
        with lock:
            record = by_lease[lease_id]
            active = record.active_lease
            if record.state is not leased or active is None or active.lease_id != lease_id or active.deadline <= now:
                raise RuntimeError(f"memory_floor: lease {lease_id} is not live")
            record.state = completed
            record.accepted_attempt_id = lease_id
            record.accepted_output_sha256 = output_sha256
            record.active_lease = None
        return True

    def cycle(_: int) -> None:
        lease_id = claim(NODE, now=NOW).lease_id
        heartbeat(lease_id, now=NOW)
        complete(lease_id, SHA, now=NOW)

    result = _timed_cycles(cycle, len(specs), gc_enabled=False)
    if queue:
        raise RuntimeError(f"the memory_floor drain left {len(queue)} tasks")
    return result


def _sqlite_floor(specs: Sequence[Any], work_dir: Path) -> Drain:
    """Three single-row committed UPDATEs per cycle (lease, renew, commit) on the same
    schema, under the same pragmas: what any SQLite-backed lease cycle must pay."""
    from flashruntime.leases import LeaseManager, SqliteLeaseStore

    path = work_dir / f"floor-{os.getpid()}-{time.monotonic_ns()}.db"
    store = SqliteLeaseStore(path)
    manager = LeaseManager(store)
    with store.transaction():
        for spec in specs:
            manager.add_task(spec, now=NOW)
    store.close()
    conn = sqlite3.connect(str(path), timeout=5.0, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA busy_timeout = 5000")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        keys = [(spec.job_id, spec.task_id) for spec in specs[:FLOOR_MAX_CYCLES]]
        deadline = NOW.timestamp() + 60.0
        lease_json = '{"lease_id":"ls-000000000000","deadline":"2030-01-01T00:01:00+00:00"}'
        execute = conn.execute

        def cycle(i: int) -> None:
            job_id, task_id = keys[i]
            lease_id = f"ls-{i:012x}"
            execute("BEGIN IMMEDIATE")
            execute(
                "UPDATE lease_tasks SET state = 'LEASED', attempts_used = attempts_used + 1, active_lease_id = ?, "
                "active_node_id = ?, deadline = ?, active_lease_json = ? WHERE job_id = ? AND task_id = ?",
                (lease_id, NODE, deadline, lease_json, job_id, task_id),
            )
            execute("COMMIT")
            execute("BEGIN IMMEDIATE")
            execute(
                "UPDATE lease_tasks SET deadline = ?, active_lease_json = ? WHERE job_id = ? AND task_id = ?",
                (deadline, lease_json, job_id, task_id),
            )
            execute("COMMIT")
            execute("BEGIN IMMEDIATE")
            execute(
                "UPDATE lease_tasks SET state = 'COMPLETED', active_lease_id = NULL, active_node_id = NULL, "
                "deadline = NULL, active_lease_json = NULL, accepted_attempt_id = ?, accepted_output_sha256 = ? "
                "WHERE job_id = ? AND task_id = ?",
                (lease_id, SHA, job_id, task_id),
            )
            execute("COMMIT")

        return _timed_cycles(cycle, len(keys), gc_enabled=False)
    finally:
        conn.close()
        _remove_db(path)


WORK_DIR = Path(__file__).resolve().parents[1] / ".work"  # the benchmarks' git-ignored scratch space


def _work_dir() -> Path:
    """A scratch directory on the repository's filesystem (never tmpfs), removed after the run."""
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{NAME}-", dir=WORK_DIR))


@dataclass
class _Samples:
    """Every drain of one store, by N: its rate and per-cycle median, and its floor's."""

    rates: dict[int, list[float]] = field(default_factory=dict)
    medians: dict[int, list[float]] = field(default_factory=dict)
    floor_rates: dict[int, list[float]] = field(default_factory=dict)
    floor_medians: dict[int, list[float]] = field(default_factory=dict)
    pins: list[str] = field(default_factory=list)


def _rounds(repeats: int, full: bool) -> dict[str, int]:
    """How many rounds each store runs: on SQLite ``repeats``; in memory, where a round
    takes ~9 s against ~1.5 min, ``MEMORY_ROUNDS_PER_SQLITE_ROUND`` as many (at least
    ``MEMORY_ROUNDS``), so that its drains span the whole run (see ``_schedule``)."""
    if not full:
        return {"memory": repeats, "sqlite": repeats}
    return {"memory": max(MEMORY_ROUNDS, MEMORY_ROUNDS_PER_SQLITE_ROUND * repeats), "sqlite": repeats}


def _schedule(rounds: dict[str, int]) -> list[str]:
    """The order of the rounds: each store's rounds evenly spaced over the run, memory first
    on a tie. A slow spell of the host then meets a few drains of every row, not all of one."""
    slots = [((i + 0.5) / count, order, kind) for order, (kind, count) in enumerate(rounds.items()) for i in range(count)]
    return [kind for _, _, kind in sorted(slots)]


def _sample_round(
    kind: str, sizes: Sequence[int], specs: dict[int, list[Any]], work_dir: Path, samples: _Samples, full: bool
) -> None:
    """One round of one store, pinned to the quieter vCPU: every N drained about
    ``CYCLES_PER_ROUND[kind]`` cycles' worth (in memory 20 drains of 1k, 2 of 10k, 1 of
    100k; on SQLite 5 drains of 1k, 1 of each larger N; a smoke run one drain per N), each
    drain followed by its store's floor, so that load drift hits every figure alike."""
    with pinned_to_quietest_cpu() as (cpu, pace_ms):
        samples.pins.append(f"{cpu} {pace_ms:g} ms")
        for n in sizes:
            for _ in range(max(1, CYCLES_PER_ROUND[kind] // n) if full else 1):
                rate, median = _drain(kind, specs[n], work_dir)
                samples.rates.setdefault(n, []).append(rate)
                samples.medians.setdefault(n, []).append(median)
                floor_rate, floor_median = (
                    _sqlite_floor(specs[n], work_dir) if kind == "sqlite" else _memory_floor(specs[n])
                )
                samples.floor_rates.setdefault(n, []).append(floor_rate)
                samples.floor_medians.setdefault(n, []).append(floor_median)


def _store_rows(
    kind: str,
    sizes: Sequence[int],
    repeats: int,
    specs: dict[int, list[Any]],
    work_dir: Path,
    fs_note: str,
    samples: _Samples,
) -> list[dict[str, Any]]:
    """The rows of one store from its samples, every drain one sample: the row's median is
    the typical drain, its min and max the spread. Then the informational variants.

    A shared host has slow spells (seconds to minutes during which every cycle costs up to
    2x more, on one vCPU or both); each round runs pinned to the quieter vCPU. A 100k drain
    spans many of them, but a 1k drain (~10 ms in memory, ~0.5 s on SQLite) catches one or
    none, so one small drain per round would let a spell decide its row and the flatness
    ratio: hence the many drains of the small N per round (``_sample_round``), and rounds
    spread over the whole run (``_schedule``)."""
    label = STORE_LABELS[kind]
    rates, medians, floor_rates, floor_medians = (
        samples.rates, samples.medians, samples.floor_rates, samples.floor_medians
    )
    pinning = ("each round pinned to the CPU whose reference workload ran fastest at its start "
               f"(benchmarks.pace): {', '.join(samples.pins)}")
    rows: list[dict[str, Any]] = []
    for n in sizes:
        notes = [(f"{label}, N={n}, claim -> heartbeat -> complete, on_event=None, GC disabled, "
                 f"{len(rates[n])} drains (median of the drains) in {len(samples.pins)} rounds spread over the run, "
                 "interleaved with the other store's"), pinning]
        if kind == "sqlite":
            notes.append(fs_note)
            notes.append("same now for the three calls: the renewal changes no column, so it writes no page")
            if n > FLOOR_MAX_CYCLES:
                notes.append(f"sqlite_floor timed over the first {FLOOR_MAX_CYCLES} of the {n} rows")
        if kind == "memory":
            notes.append("memory_floor: the least an in-memory cycle with this API costs (a lock per call, a FIFO, "
                         "a lease-id dict, the same Lease builders; no sweep, cordons, indexes or checks), drained "
                         "after each InMemoryLeaseStore drain")
        floor = FLOORS[kind]
        rows.append(
            measured_row(
                NAME, SECTION, f"cycles_per_s_{kind}_n{n}", "cycles/s", rates[n],
                comparator=(floor, floor_rates[n]), target=TARGETS[kind], notes=notes,
            )
        )
        rows.append(
            measured_row(
                NAME, SECTION, f"per_cycle_median_us_{kind}_n{n}", "us", medians[n],
                comparator=(floor, floor_medians[n]), notes=notes,
            )
        )
    if 1_000 in medians and 100_000 in medians:
        rows.append(
            measured_row(
                NAME, SECTION, f"per_cycle_median_flatness_{kind}", "us", medians[100_000],
                comparator=(f"{label} per-cycle median at N=1000", medians[1_000]),
                target=FLATNESS,
                notes=[f"{label}: ratio = per-cycle median at N=100000 / at N=1000"],
            )
        )
    else:
        rows.append(
            skipped_row(
                NAME, SECTION, f"per_cycle_median_flatness_{kind}", "us",
                "smoke run measures N=1000 only; flatness needs N=100000", target=FLATNESS,
            )
        )
    info_size = sizes[min(1, len(sizes) - 1)]  # 10k in a full run, 1k in a smoke run
    variants = (
        ("gc_enabled", {"gc_enabled": True}, "GC enabled during the drain"),
        ("on_event_append", {"events": True}, "on_event=list.append"),
    )
    for variant, options, what in variants:
        samples = [_drain(kind, specs[info_size], work_dir, **options)[0] for _ in range(repeats)]  # type: ignore[arg-type]
        rows.append(
            measured_row(
                NAME, SECTION, f"cycles_per_s_{kind}_n{info_size}_{variant}", "cycles/s", samples,
                notes=[f"informational, no target: {label}, N={info_size}, {what}"],
            )
        )
    return rows


def run(repeats: int, smoke: bool) -> list[dict[str, Any]]:
    sizes = SMOKE_SIZES if smoke else SIZES
    repeats = 1 if smoke else max(1, repeats)
    full = repeats > 1  # a smoke run stays one drain per row
    work_dir = _work_dir()
    fs_note = f"SQLite files on {filesystem_type(work_dir)} under benchmarks/.work"
    try:
        specs = {n: _specs(n) for n in sizes}
        samples = {kind: _Samples() for kind in STORE_LABELS}
        rounds = _rounds(repeats, full)
        for kind in _schedule(rounds):
            _sample_round(kind, sizes, specs, work_dir, samples[kind], full)
        return [
            row
            for kind in STORE_LABELS
            for row in _store_rows(kind, sizes, repeats, specs, work_dir, fs_note, samples[kind])
        ]
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


SCENARIO = Scenario(
    name=NAME,
    hypothesis=(
        "Leases cost the same per cycle at any queue size: claim -> heartbeat -> complete drains at >= 0.5x the "
        "bare in-memory floor of the same API, and >= 0.4x three committed single-row updates on a SQLite file, "
        "with the per-cycle median at N=100k within 1.3x of N=1k"
    ),
    section=SECTION,
    run=run,
)
