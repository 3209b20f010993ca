"""``coordinator_claims``: HTTP claim+complete cycles/s against real ``flashruntime serve``
processes on loopback, at 1 and 4 concurrent clients, on SQLite and on PostgreSQL with one
and two replicas, each beside its comparator in the same run.

HTTP side: ``flashruntime serve`` subprocesses on 127.0.0.1 (data and artifacts under
``benchmarks/.work``; PostgreSQL: a throwaway server started for the run, ``fsync`` on);
each sample submits a fresh ``hyperparameter_search`` job of N tasks and the clients
(threads, each its own ``httpx.Client`` and registered node id) drain it. One cycle =
claim → PUT the task's ``metrics.json`` → complete with its sha256 (the coordinator
accepts a commit only when the ``commit_key`` file was uploaded and its sha256 matches),
answered ``accepted: true``. With two replicas, client k sends cycle i to replica
(k + i) mod 2: every replica serves every client, as behind a load balancer.

Comparators: for SQLite and for one PostgreSQL replica, the same N ``TaskSpec``s on
``LeaseManager(SqliteLeaseStore(<file in the work dir>), on_event=None)`` in this process,
as many threads as clients; cycle = ``claim(node, job_id, policy=IsolationAwarePlacement(),
node=<the view the coordinator builds>)`` → ``complete``: no HTTP, no ledger events, no
artifact. For two PostgreSQL replicas, one replica with the same clients.

cycles/s = N / drain wall time (barrier release → the last accepted commit); the
per-cycle p50 is over the N cycles of a drain, each timed by its client thread. Samples
alternate the row's drain and its comparator's.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.host import filesystem_type
from benchmarks.registry import Scenario
from benchmarks.rows import measured_row, quantile, skipped_rows
from benchmarks.scenarios import _coordinator_http as http
from benchmarks.scenarios import _postgres as postgres
from benchmarks.targets import HTTP_OVER_IN_PROCESS, REPLICAS_OVER_ONE

NAME = "coordinator_claims"
SECTION = "performance"
CLIENTS = 4  # the most clients of a row; every configuration is also measured with one
CLIENT_COUNTS = (1, CLIENTS)
TASKS = 400
SMOKE_TASKS = 40
MIN_SAMPLES = 3
LEASE_SECONDS = 60.0  # no lease expires during a drain
JOB_NAME = "coordinator-claims"  # a DNS-1123 label, as JobSpec requires
METRICS = tuple((f"{database}_{clients}_client{'s' if clients > 1 else ''}_cycles_per_s", "cycles/s")
                for database in ("sqlite", "postgres_1_replica", "postgres_2_replicas") for clients in CLIENT_COUNTS)
METRICS = (*METRICS, ("sqlite_4_clients_per_cycle_p50_ms", "ms"))


def _in_process_name(clients: int) -> str:
    return f"in-process LeaseManager (SqliteLeaseStore file, {clients} thread{'s' if clients > 1 else ''})"


def _metric(database: str, clients: int) -> str:
    return f"{database}_{clients}_client{'s' if clients > 1 else ''}_cycles_per_s"


class _Drain:
    """What one drain measured: per-cycle seconds and the drain's wall time."""

    def __init__(self, tasks: int, cycles: list[float], wall_s: float) -> None:
        if len(cycles) != tasks:
            raise RuntimeError(f"the drain committed {len(cycles)} of {tasks} tasks")
        self.rate = tasks / wall_s
        self.p50_ms = quantile(cycles, 0.5) * 1000.0


def _run_threads(loops: list[Callable[[threading.Barrier], list[tuple[float, float]]]]) -> tuple[list[float], float]:
    """Start one thread per loop, release them together, wait for all. Each loop returns
    ``(start, end)`` perf_counter pairs of its accepted cycles. → (cycle seconds, wall s)."""
    barrier = threading.Barrier(len(loops) + 1)
    results: list[list[tuple[float, float]]] = [[] for _ in loops]
    errors: list[Exception] = []

    def body(index: int) -> None:
        try:
            results[index] = loops[index](barrier)
        except Exception as exc:  # noqa: BLE001 (re-raised below, after the other threads finish)
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=body, args=(i,), name=f"{NAME}-client-{i}") for i in range(len(loops))]
    for thread in threads:
        thread.start()
    try:
        barrier.wait()
        started = time.perf_counter()
    except threading.BrokenBarrierError:
        started = time.perf_counter()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError(f"a client thread failed: {errors[0]!r}") from errors[0]
    pairs = [pair for result in results for pair in result]
    if not pairs:
        raise RuntimeError("no cycle completed")
    return [end - start for start, end in pairs], max(end for _, end in pairs) - started


def _http_drain(urls: list[str], tasks: int, node_ids: list[str]) -> _Drain:
    """One job of ``tasks`` drained by one client per node id; client k sends its cycle i to
    ``urls[(k + i) % len(urls)]``."""
    url = urls[0]
    with http.http_client(url) as admin:
        job_id = http.submit(admin, http.job_spec(tasks, LEASE_SECONDS, name=JOB_NAME))

    def loop_for(index: int, node_id: str) -> Callable[[threading.Barrier], list[tuple[float, float]]]:
        def loop(barrier: threading.Barrier) -> list[tuple[float, float]]:
            done: list[tuple[float, float]] = []
            with contextlib.ExitStack() as stack:
                clients = [stack.enter_context(http.http_client(replica)) for replica in urls]
                for client in clients:
                    client.get("/healthz")  # open the keep-alive connections before timing
                barrier.wait()
                clock = time.perf_counter
                cycle = 0
                while True:
                    client = clients[(index + cycle) % len(clients)]
                    cycle += 1
                    start = clock()
                    claimed = client.post("/v1alpha1/leases/claim", json={"node_id": node_id, "job_id": job_id})
                    if claimed.status_code == 204:
                        return done
                    if claimed.status_code != 200:
                        raise RuntimeError(f"claim answered {claimed.status_code}: {claimed.text}")
                    answer = http.upload_and_complete(client, claimed.json())
                    if answer != {"accepted": True}:
                        raise RuntimeError(f"commit not accepted: {answer}")
                    done.append((start, clock()))
        return loop

    cycles, wall_s = _run_threads([loop_for(index, node_id) for index, node_id in enumerate(node_ids)])
    with http.http_client(url) as admin:
        job = admin.get(f"/v1alpha1/jobs/{job_id}").json()
        states = [task["state"] for task in admin.get(f"/v1alpha1/jobs/{job_id}/tasks").json()]
    if job["state"] != "SUCCEEDED" or states.count("COMPLETED") != tasks:
        raise RuntimeError(f"job {job_id} ended {job['state']} with {states.count('COMPLETED')} of {tasks} completed")
    return _Drain(tasks, cycles, wall_s)


def _node_views(node_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The claim node view the coordinator builds from the same registrations."""
    from flashruntime.coordinator.nodes import NodeRegistry
    from flashruntime.protocol.v1alpha1 import NodeRegistration

    registry = NodeRegistry()
    for node_id in node_ids:
        registry.register(NodeRegistration.model_validate(http.registration(node_id)))
    return {node_id: registry.claim_view(node_id) for node_id in node_ids}  # type: ignore[misc]


def _in_process_drain(work_dir: Path, sample: int, tasks: int, node_ids: list[str]) -> _Drain:
    from flashruntime.coordinator.expansion import expand_tasks
    from flashruntime.leases import LeaseManager, SqliteLeaseStore
    from flashruntime.protocol.v1alpha1 import JobSpec
    from flashruntime.scheduler import IsolationAwarePlacement

    job_id = f"{sample:012x}"
    specs = expand_tasks(job_id, JobSpec.model_validate(http.job_spec(tasks, LEASE_SECONDS, name=JOB_NAME)))
    path = work_dir / f"in-process-{sample}" / "leases.db"
    store = SqliteLeaseStore(path)
    manager = LeaseManager(store, on_event=None)
    placement = IsolationAwarePlacement()
    views = _node_views(node_ids)
    try:
        with store.transaction():  # setup, untimed, as the coordinator's submit does it
            for spec in specs:
                manager.add_task(spec)

        def loop_for(node_id: str) -> Callable[[threading.Barrier], list[tuple[float, float]]]:
            def loop(barrier: threading.Barrier) -> list[tuple[float, float]]:
                done: list[tuple[float, float]] = []
                view = views[node_id]
                barrier.wait()
                clock = time.perf_counter
                while True:
                    start = clock()
                    lease = manager.claim(node_id, job_id=job_id, policy=placement, node=view)
                    if lease is None:
                        return done
                    lease_json = {"task_id": lease.task_id, "lease_id": lease.lease_id}
                    sha = hashlib.sha256(http.metrics_payload(lease_json)).hexdigest()
                    if not manager.complete(lease.lease_id, sha):
                        raise RuntimeError(f"in-process commit of {lease.lease_id} refused")
                    done.append((start, clock()))
            return loop

        cycles, wall_s = _run_threads([loop_for(node_id) for node_id in node_ids])
        counts = manager.job_state(job_id)
        if counts != {"COMPLETED": tasks}:
            raise RuntimeError(f"in-process drain ended with {counts}")
        return _Drain(tasks, cycles, wall_s)
    finally:
        store.close()


def _serve_many(stack: contextlib.ExitStack, data_dir: Path, count: int, database_url: str | None) -> list[str]:
    """``count`` healthy serve processes on one database (and one artifacts directory) → their URLs."""
    return [stack.enter_context(http.serving(data_dir, database_url=database_url)).url for _ in range(count)]


def _register(url: str, node_ids: list[str]) -> None:
    with http.http_client(url) as admin:
        for node_id in node_ids:
            http.register(admin, node_id)


def run(repeats: int, smoke: bool) -> list[dict[str, Any]]:
    missing = http.service_missing()
    if missing:
        return skipped_rows(NAME, SECTION, METRICS, missing)
    from flashruntime.coordinator.settings import RuntimeSettings

    samples = 1 if smoke else max(repeats, MIN_SAMPLES)
    tasks = SMOKE_TASKS if smoke else TASKS
    all_nodes = [f"bench-client-{i}" for i in range(CLIENTS)]
    work_dir = http.make_work_dir(NAME)
    drains: dict[tuple[str, int], list[_Drain]] = {}  # (configuration, clients) -> its drains

    pg_missing = postgres.postgres_missing()
    try:
        fs = filesystem_type(work_dir)
        with contextlib.ExitStack() as stack:
            (url,) = _serve_many(stack, work_dir / "sqlite", 1, None)
            _register(url, all_nodes)
            drain_number = 0
            for clients in CLIENT_COUNTS:  # alternate HTTP and in-process, sample by sample
                node_ids = all_nodes[:clients]
                for _ in range(samples):
                    drains.setdefault(("sqlite", clients), []).append(_http_drain([url], tasks, node_ids))
                    drains.setdefault(("in_process", clients), []).append(
                        _in_process_drain(work_dir, drain_number, tasks, node_ids))
                    drain_number += 1
        if pg_missing is None:
            with postgres.postgres_database() as database_url, contextlib.ExitStack() as stack:
                urls = _serve_many(stack, work_dir / "postgres", 2, database_url)
                _register(urls[0], all_nodes)
                for clients in CLIENT_COUNTS:  # alternate one replica and two, sample by sample
                    node_ids = all_nodes[:clients]
                    for _ in range(samples):
                        drains.setdefault(("postgres_1_replica", clients), []).append(
                            _http_drain(urls[:1], tasks, node_ids))
                        drains.setdefault(("postgres_2_replicas", clients), []).append(
                            _http_drain(urls, tasks, node_ids))
        sweep_s = RuntimeSettings.from_env({}).sweep_interval_s
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)

    def rates(configuration: str, clients: int) -> list[float]:
        return [drain.rate for drain in drains[(configuration, clients)]]

    common = [
        (f"HTTP: `flashruntime serve` subprocesses on 127.0.0.1, default sweep interval {sweep_s:g} s (no lease "
         f"expires: lease_seconds {LEASE_SECONDS:g}), artifacts on {fs} under benchmarks/.work; SQLite: one database "
         "file there; PostgreSQL: a throwaway local server (fsync on) started for the run, two replicas sharing it and "
         "one artifacts directory"),
        (f"N={tasks} tasks per drain (one fresh hyperparameter_search job per sample), {samples} sample(s) per row; "
         "every task committed and accepted, job SUCCEEDED"),
        ("one HTTP cycle = POST /v1alpha1/leases/claim → PUT the task's metrics.json artifact (small JSON; the "
         "coordinator accepts a commit only after that upload with a matching sha256) → "
         "POST /v1alpha1/attempts/{id}/complete answered accepted=true; each client thread has its own httpx.Client "
         "(keep-alive) per replica and its own registered node id"),
        (f"in-process comparator: the same {tasks} TaskSpecs (expand_tasks of the same spec) on "
         "LeaseManager(SqliteLeaseStore file in the same work dir, on_event=None), one thread per client; cycle = "
         "claim(node, job_id, IsolationAwarePlacement, the coordinator's node view) → complete(lease, sha256): no "
         "HTTP, no ledger events, no artifact"),
        f"servers, clients and comparator share this host's {os.cpu_count()} CPUs",
        "cycles/s = N / drain wall time (barrier release → the last accepted commit)",
    ]
    rows = []
    for clients in CLIENT_COUNTS:
        in_process = (_in_process_name(clients), rates("in_process", clients))
        target = HTTP_OVER_IN_PROCESS if clients == CLIENTS else None
        rows.append(measured_row(
            NAME, SECTION, _metric("sqlite", clients), "cycles/s", rates("sqlite", clients), comparator=in_process,
            ratio=_median_ratio(rates("sqlite", clients), in_process[1]), target=target,
            notes=[*common, f"{clients} client(s) on one coordinator on SQLite",
                   "ratio = HTTP cycles/s ÷ in-process cycles/s (the share of the in-process rate served over HTTP)"]))
    for clients in CLIENT_COUNTS:
        metric_one, metric_two = _metric("postgres_1_replica", clients), _metric("postgres_2_replicas", clients)
        if pg_missing is not None:
            rows += skipped_rows(NAME, SECTION, ((metric_one, "cycles/s"), (metric_two, "cycles/s")), pg_missing)
            continue
        in_process = (_in_process_name(clients), rates("in_process", clients))
        one = rates("postgres_1_replica", clients)
        rows.append(measured_row(
            NAME, SECTION, metric_one, "cycles/s", one, comparator=in_process,
            ratio=_median_ratio(one, in_process[1]),
            notes=[*common, f"{clients} client(s) on one coordinator on PostgreSQL",
                   "ratio = HTTP cycles/s ÷ in-process (SQLite) cycles/s"]))
        two = rates("postgres_2_replicas", clients)
        rows.append(measured_row(
            NAME, SECTION, metric_two, "cycles/s", two,
            comparator=(f"one replica on PostgreSQL, {clients} client(s)", one), ratio=_median_ratio(two, one),
            target=REPLICAS_OVER_ONE if clients == CLIENTS else None,
            notes=[*common, f"{clients} client(s), each sending its cycles to the two replicas in turn",
                   "ratio = two replicas' cycles/s ÷ one replica's, samples alternating"]))
    p50 = [drain.p50_ms for drain in drains[("sqlite", CLIENTS)]]
    rows.append(measured_row(
        NAME, SECTION, "sqlite_4_clients_per_cycle_p50_ms", "ms", p50,
        comparator=(_in_process_name(CLIENTS), [drain.p50_ms for drain in drains[("in_process", CLIENTS)]]),
        notes=[*common, ("per-cycle p50 over the N cycles of each drain (perf_counter in the client thread around the "
                         "whole cycle); the row's samples are the drains' p50s"),
               "ratio = HTTP per-cycle p50 ÷ in-process per-cycle p50 (> 1 is the cost of HTTP + the service)"]))
    return rows


def _median_ratio(numerator: list[float], denominator: list[float]) -> float | None:
    """median(numerator) / median(denominator), None when the denominator is 0."""
    import statistics

    bottom = statistics.median(denominator)
    return statistics.median(numerator) / bottom if bottom else None


SCENARIO = Scenario(
    name=NAME,
    hypothesis=(
        "a coordinator on loopback serves claim → upload → complete cycles to 1 and 4 concurrent clients at a fair "
        "share of what the in-process LeaseManager does with the same cycle; on PostgreSQL a second replica adds "
        "throughput"
    ),
    section=SECTION,
    run=run,
)
