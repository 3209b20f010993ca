"""``coordinator_claims``: HTTP claim+complete cycles/s against a real
``flashruntime serve`` on loopback with concurrent clients, against the in-process
``LeaseManager`` doing the same cycle with the same concurrency.

HTTP side: one ``flashruntime serve`` subprocess on 127.0.0.1 for the run (its one
database file and artifacts under ``benchmarks/.work``); each sample submits a fresh
``hyperparameter_search`` job of N tasks and ``CLIENTS`` threads drain it, each with its
own ``httpx.Client`` and its own registered node id. One cycle = claim → PUT the task's
``metrics.json`` → complete with its sha256 (the coordinator accepts a commit only when
the ``commit_key`` file was uploaded and its sha256 matches), answered ``accepted: true``.

Comparator: the same N ``TaskSpec``s (``expand_tasks`` of the same job spec) on
``LeaseManager(SqliteLeaseStore(<file in the work dir>), on_event=None)`` in this
process, ``CLIENTS`` threads sharing it; cycle = ``claim(node, job_id, policy=
IsolationAwarePlacement(), node=<the view the coordinator builds>)`` → ``complete``.
No HTTP, no ledger events, no artifact: the ratio is what HTTP plus the service cost.

cycles/s = N / drain wall time (barrier release → the last accepted commit); the
per-cycle p50 is over the N cycles of a drain, each timed by its client thread. Samples
alternate HTTP drain, comparator drain. No target is set for this scenario: rows carry none.
"""

from __future__ import annotations

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

NAME = "coordinator_claims"
SECTION = "performance"
CLIENTS = 4
TASKS = 400
SMOKE_TASKS = 40
MIN_SAMPLES = 3
LEASE_SECONDS = 60.0  # no lease expires during a drain
JOB_NAME = "coordinator-claims"  # a DNS-1123 label, as JobSpec requires
COMPARATOR = f"in-process LeaseManager (SqliteLeaseStore file, {CLIENTS} threads)"
METRICS = (("cycles_per_s", "cycles/s"), ("per_cycle_p50_ms", "ms"))


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


def _http_drain(url: str, tasks: int, node_ids: list[str]) -> _Drain:
    with http.http_client(url) as admin:
        job_id = http.submit(admin, http.job_spec(tasks, LEASE_SECONDS, name=JOB_NAME))

    def loop_for(node_id: str) -> Callable[[threading.Barrier], list[tuple[float, float]]]:
        def loop(barrier: threading.Barrier) -> list[tuple[float, float]]:
            done: list[tuple[float, float]] = []
            with http.http_client(url) as client:
                client.get("/healthz")  # open the keep-alive connection before timing
                barrier.wait()
                clock = time.perf_counter
                while True:
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

    cycles, wall_s = _run_threads([loop_for(node_id) for node_id in node_ids])
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


def run(repeats: int, smoke: bool) -> list[dict[str, Any]]:
    missing = http.service_missing()
    if missing:
        return skipped_rows(NAME, SECTION, METRICS, missing)
    from flashruntime.coordinator.settings import RuntimeSettings

    samples = 1 if smoke else max(repeats, MIN_SAMPLES)
    tasks = SMOKE_TASKS if smoke else TASKS
    node_ids = [f"bench-client-{i}" for i in range(CLIENTS)]
    work_dir = http.make_work_dir(NAME)
    try:
        fs = filesystem_type(work_dir)
        http_drains: list[_Drain] = []
        local_drains: list[_Drain] = []
        with http.serving(work_dir / "coordinator") as server:
            with http.http_client(server.url) as admin:
                for node_id in node_ids:
                    http.register(admin, node_id)
            for sample in range(samples):
                http_drains.append(_http_drain(server.url, tasks, node_ids))
                local_drains.append(_in_process_drain(work_dir, sample, tasks, node_ids))
        sweep_s = RuntimeSettings.from_env({}).sweep_interval_s
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)

    http_rates = [d.rate for d in http_drains]
    local_rates = [d.rate for d in local_drains]
    http_p50 = [d.p50_ms for d in http_drains]
    local_p50 = [d.p50_ms for d in local_drains]
    common = [
        (f"HTTP: `flashruntime serve` subprocess on 127.0.0.1, default sweep interval {sweep_s:g} s (no lease "
         f"expires: lease_seconds {LEASE_SECONDS:g}), one database file + artifacts on {fs} under benchmarks/.work; "
         f"{CLIENTS} concurrent client threads, each its own httpx.Client (keep-alive) and its own registered node id"),
        (f"N={tasks} tasks per drain (one fresh hyperparameter_search job per sample), {samples} sample(s), each "
         "sample = one HTTP drain then one in-process drain; every task committed and accepted, job SUCCEEDED"),
        ("one HTTP cycle = POST /v1alpha1/leases/claim → PUT the task's metrics.json artifact (small JSON; the "
         "coordinator accepts a commit only after that upload with a matching sha256) → "
         "POST /v1alpha1/attempts/{id}/complete answered accepted=true"),
        (f"comparator: the same {tasks} TaskSpecs (expand_tasks of the same spec) on LeaseManager(SqliteLeaseStore "
         f"file in the same work dir, on_event=None), {CLIENTS} threads sharing it; cycle = claim(node, job_id, "
         "IsolationAwarePlacement, the coordinator's node view) → complete(lease, sha256): no HTTP, no ledger "
         "events, no artifact"),
        f"coordinator, clients and comparator share this host's {os.cpu_count()} CPUs",
    ]
    return [
        measured_row(
            NAME, SECTION, "cycles_per_s", "cycles/s", http_rates, comparator=(COMPARATOR, local_rates),
            ratio=_median_ratio(local_rates, http_rates),
            notes=[*common,
                   "cycles/s = N / drain wall time (barrier release → the last accepted commit)",
                   ("ratio = comparator cycles/s ÷ HTTP cycles/s (how many times faster the in-process manager "
                    "drains; > 1 is the cost of HTTP + the service)")],
        ),
        measured_row(
            NAME, SECTION, "per_cycle_p50_ms", "ms", http_p50, comparator=(COMPARATOR, local_p50),
            notes=[*common,
                   ("per-cycle p50 over the N cycles of each drain (perf_counter in the client thread around the "
                    "whole cycle); the row's samples are the drains' p50s"),
                   "ratio = HTTP per-cycle p50 ÷ in-process per-cycle p50 (> 1 is the cost of HTTP + the service)"],
        ),
    ]


def _median_ratio(numerator: list[float], denominator: list[float]) -> float | None:
    """median(numerator) / median(denominator), None when the denominator is 0."""
    import statistics

    bottom = statistics.median(denominator)
    return statistics.median(numerator) / bottom if bottom else None


SCENARIO = Scenario(
    name=NAME,
    hypothesis=(
        f"a coordinator on loopback serves claim → upload → complete cycles to {CLIENTS} concurrent clients; what "
        "HTTP and the service cost shows as the factor against the in-process LeaseManager doing the same cycle"
    ),
    section=SECTION,
    run=run,
)
