"""The coordinator's Ray backend: the tasks of ``ray`` jobs run as Ray tasks.

A ``ray`` job is queued in the lease store like any other, so its tasks have the same states,
events, logs, cancel and first-valid-commit rule; only who claims them differs. Agents never
see them (``BackendPlacement``); this dispatcher, one thread in the coordinator, claims them as
the node ``ray`` while the cluster has room (one CPU per task), and runs each attempt as one
Ray task (``flashruntime.agent.ray_task.run_task_attempt``, ``max_retries=0``). While it
runs, the dispatcher renews the lease, stores the log as it grows, and watches whether the
lease is still live: a cancelled job's Ray tasks are cancelled (the attempt's processes
stopped inside the task), then killed if they do not end.

An attempt ends as an agent's would: the output files are stored under the task's output
prefix and committed (``Coordinator.complete``), or the failure is classified and acted on
(``flashruntime.ray_backend.failures``): a deterministic error fails the task without a retry;
a failed exit spends one of ``max_attempts``; a Ray worker or node lost spends one of
``max_expiries`` and what the dead worker left running is stopped on its node. Every attempt
has a ``TASK_ATTEMPT_STARTED`` event with where it ran (Ray node id, node IP, hostname,
worker pid, GPU ids), and every failure a ``FAILURE_CLASSIFIED`` event with the class, the
recovery decision and that evidence; an accepted attempt's evidence row holds it too.

Should the coordinator die, its leases expire and the sweep requeues the tasks; Ray stops a
dead driver's tasks. Several replicas with a Ray address each dispatch; the lease store's
claims keep any task from running twice at once.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from flashruntime.agent import ray_task
from flashruntime.agent.lease_heartbeat import heartbeat_interval
from flashruntime.agent.attempt_files import last_line, payload_prefix
from flashruntime.coordinator.failures import TASK_MODE, failure_classified
from flashruntime.errors import ArtifactNotFound, FlashRuntimeError, LeaseError
from flashruntime.protocol.task_logs import task_log_key
from flashruntime.protocol.v1alpha1 import CompleteRequest, Event, EventType, Lease, TaskSpec
from flashruntime.ray_backend.cluster import (
    ALIVE,
    ENDED,
    LOST,
    cluster_nodes,
    connect,
    on_node,
    read_stream,
    total_cpus,
)
from flashruntime.ray_backend.failures import classify_ray_error, is_cancellation
from flashruntime.ray_backend.resources import ray_options
from flashruntime.recovery import AttemptVerdict, decide, judge_exit
from flashruntime.recovery.verdict import judge_hang, judge_no_result
from flashruntime.scheduler.policy import NodeView, PlacementPolicy

__all__ = ["BACKEND_KEY", "RAY_NODE_ID", "BackendPlacement", "RayDispatcher", "backend_of"]

log = logging.getLogger("flashruntime.ray")

RAY_NODE_ID = "ray"
# The payload key naming the backend of a task's job; a task without it is the agents'.
BACKEND_KEY = "backend"
SOURCE = "flashruntime.ray"
BEAT_FLOOR_S = 0.5  # the dispatcher renews in process: it may beat more often than an agent over HTTP


def backend_of(task: TaskSpec) -> str:
    backend = task.payload.get(BACKEND_KEY) if isinstance(task.payload, dict) else None
    return backend if isinstance(backend, str) else "leases"


class BackendPlacement(PlacementPolicy):
    """Only the tasks of ``backend``'s jobs, then ``inner``'s gates (None: none)."""

    def __init__(self, backend: str, inner: PlacementPolicy | None = None) -> None:
        self.backend = backend
        self.inner = inner

    def eligible(self, task: TaskSpec, node: NodeView) -> bool:
        return backend_of(task) == self.backend and (self.inner is None or self.inner.eligible(task, node))


@dataclass
class _Flight:
    """One attempt running as a Ray task."""

    lease: Lease
    stream: Any  # the Ray task's ObjectRefGenerator
    next_beat: float
    next_check: float
    where: dict[str, Any] = field(default_factory=dict)
    cancel_since: float | None = None
    killed: bool = False


class RayDispatcher:
    """Runs the tasks of ``ray`` jobs on the cluster at ``address``; ``start`` connects (and
    raises what the connection raised), ``stop`` releases what is running."""

    def __init__(self, coordinator: Any, address: str, *, tick_s: float = 0.2, log_every_s: float = 5.0,
                 check_s: float = 1.0, cancel_grace_s: float = 5.0, idle_claim_s: float = 1.0) -> None:
        self.coordinator = coordinator
        self.address = address
        self.tick_s = tick_s
        self.log_every_s = log_every_s
        self.check_s = check_s
        self.cancel_grace_s = cancel_grace_s
        self.idle_claim_s = idle_claim_s
        self.placement = BackendPlacement("ray")
        self._flights: dict[str, _Flight] = {}
        self._stopping = threading.Event()
        self._wake = threading.Event()
        # (lease id, message) from the threads that read the running attempts' streams.
        self._inbox: queue.SimpleQueue[tuple[str, tuple[str, Any]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._ray: Any = None
        self._capacity = 0
        self._capacity_at = float("-inf")
        self._news = True  # something may be claimable now
        self._next_claim = float("-inf")
        self._remote_attempt: Any = None

    # --- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        self._ray = ray = connect(self.address)
        self._remote_attempt = ray.remote(ray_task.run_task_attempt)
        self._thread = threading.Thread(target=self._loop, name="flashruntime-ray-dispatch", daemon=True)
        self._thread.start()
        log.info("Ray backend: running the tasks of ray jobs on %s", self.address)

    def nodes(self) -> list[dict[str, float]]:
        """The total resources of each live node of the cluster."""
        return cluster_nodes(self._ray)

    def stop(self) -> None:
        """Stop dispatching; give every running attempt's lease back (no budget spent) and
        cancel its Ray task."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        for lease_id, flight in list(self._flights.items()):
            self._cancel(flight, force=False)
            self._call(self.coordinator.manager.release, lease_id, "coordinator stopping", now=self.coordinator.now())
        self._flights.clear()

    def wake(self) -> None:
        """Claim now rather than at the next tick (a ray job was just queued)."""
        self._news = True
        self._wake.set()

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                self._wait_for_news()
                self.step()
            except Exception:  # a database hiccup: the next tick tries again
                log.exception("Ray dispatch step failed")
                self._stopping.wait(self.tick_s)

    def _wait_for_news(self) -> None:
        """Until a running attempt has sent a message, a ray job is queued, or ``tick_s`` passed."""
        self._wake.wait(self.tick_s)
        self._wake.clear()

    # --- one tick --------------------------------------------------------------

    def step(self) -> None:
        self._collect()
        if self._flights:
            self._watch()
        self._claim()

    def _capacity_now(self) -> int:
        now = time.monotonic()
        if now - self._capacity_at > 10.0:
            self._capacity = total_cpus(self._ray)
            self._capacity_at = now
        return self._capacity

    def _claim(self) -> None:
        """Claim while the cluster has room. A claim offers the pending tasks of every job to
        the placement, so an empty one is not repeated for ``idle_claim_s`` unless something
        may have changed: a ray job queued (``wake``) or an attempt ended here."""
        coordinator = self.coordinator
        now = time.monotonic()
        if not self._news and now < self._next_claim:
            return
        self._news = False
        while len(self._flights) < self._capacity_now() and not self._stopping.is_set():
            lease = coordinator.manager.claim(RAY_NODE_ID, now=coordinator.now(), policy=self.placement,
                                              node={"node_id": RAY_NODE_ID})
            if lease is None:
                self._next_claim = now + self.idle_claim_s
                return
            self._launch(lease)

    def _launch(self, lease: Lease) -> None:
        coordinator = self.coordinator
        options, why = ray_options(lease.payload)
        if why is not None:  # refused at submission; a task stored before can still say so
            self._call(coordinator.manager.fail, lease.lease_id, why, now=coordinator.now(), retry=False)
            return
        try:
            inputs = self._inputs(lease.payload)
        except (ArtifactNotFound, FlashRuntimeError, OSError) as exc:
            self._call(coordinator.manager.fail, lease.lease_id, str(exc), now=coordinator.now())
            return
        stream = self._remote_attempt.options(
            **options, num_returns="streaming", max_retries=0, name=f"{lease.job_id}/{lease.task_id}",
        ).remote(lease.model_dump(mode="json"), inputs, self.log_every_s)
        now = time.monotonic()
        self._flights[lease.lease_id] = _Flight(lease, stream, next_beat=now + heartbeat_interval(lease, BEAT_FLOOR_S),
                                                next_check=now + self.check_s)
        read_stream(self._ray, stream, functools.partial(self._post, lease.lease_id),
                    name=f"flashruntime-ray-{lease.lease_id}")

    def _post(self, lease_id: str, message: tuple[str, Any]) -> None:
        if message[0] == ALIVE:
            return  # the task yields it so that a cancel can reach it: nothing to act on
        self._inbox.put((lease_id, message))
        self._wake.set()

    def _inputs(self, payload: dict[str, Any]) -> dict[str, bytes]:
        """The bytes of every ``artifact://`` input, read from this coordinator's store."""
        blobs: dict[str, bytes] = {}
        inputs = payload.get("inputs")
        for name, uri in (inputs.items() if isinstance(inputs, dict) else ()):
            if isinstance(uri, str) and uri.startswith("artifact://"):
                key = uri[len("artifact://"):]
                path = self.coordinator.artifacts.read_path(key)
                if path is None:
                    raise ArtifactNotFound(404, f"input {name!r}: artifact {key!r} does not exist")
                blobs[key] = path.read_bytes()
        return blobs

    def _watch(self) -> None:
        """Renew the leases that are due; a lease no longer live (its job cancelled) cancels
        its Ray task, and one that does not end within the grace is killed."""
        coordinator = self.coordinator
        now = time.monotonic()
        for lease_id, flight in list(self._flights.items()):
            if flight.cancel_since is not None:
                waited = now - flight.cancel_since
                if not flight.killed and waited > self.cancel_grace_s:
                    self._cancel(flight, force=True)
                elif flight.killed and waited > 3 * self.cancel_grace_s:
                    log.warning("lease %s: its Ray task did not end after a kill; no longer followed", lease_id)
                    self._flights.pop(lease_id, None)  # its lease has ended: the room is free again
                continue
            live = True
            if now >= flight.next_beat:
                try:
                    coordinator.manager.heartbeat(lease_id, now=coordinator.now())
                    flight.next_beat = now + heartbeat_interval(flight.lease, BEAT_FLOOR_S)
                except LeaseError:
                    live = False
            elif now >= flight.next_check:
                live = coordinator.manager.lease_is_live(lease_id, coordinator.now())
                flight.next_check = now + self.check_s
            if not live:
                log.info("lease %s is no longer live: cancelling its Ray task", lease_id)
                self._cancel(flight, force=False)

    def _cancel(self, flight: _Flight, *, force: bool) -> None:
        if flight.cancel_since is None:
            flight.cancel_since = time.monotonic()
        try:
            self._ray.cancel(flight.stream, force=force)
        except Exception as exc:  # already finished
            log.debug("cancel of %s: %s", flight.lease.lease_id, exc)
        if force:
            flight.killed = True
            self._sweep_node(flight)

    def _collect(self) -> None:
        """Act on every message the running attempts have sent."""
        while True:
            try:
                lease_id, (kind, body) = self._inbox.get_nowait()
            except queue.Empty:
                return
            flight = self._flights.get(lease_id)
            if flight is not None:
                self._take(lease_id, flight, kind, body)

    def _take(self, lease_id: str, flight: _Flight, kind: str, body: Any) -> None:
        if kind in (ENDED, LOST):
            self._flights.pop(lease_id, None)
            self._news = True
            if kind == LOST:
                self._lost(flight, body)
        elif kind == "started":
            flight.where = body
            self._started(flight)
        elif kind == "log":
            self._store_log(flight.lease, body)
        elif kind == "refused":
            self._flights.pop(lease_id, None)
            self._news = True
            self._call(self.coordinator.manager.fail, lease_id, body, now=self.coordinator.now())
        elif kind == "finished":
            self._flights.pop(lease_id, None)
            self._news = True
            if flight.cancel_since is None:
                self._finished(flight, body)

    # --- outcomes --------------------------------------------------------------

    def _event(self, lease: Lease, type_: EventType, message: str, data: dict[str, Any]) -> Event:
        return Event(job_id=lease.job_id, type=type_, timestamp=self.coordinator.now(), source=SOURCE,
                     message=message, data={"task_id": lease.task_id, "node_id": RAY_NODE_ID,
                                            "lease_id": lease.lease_id, "attempt_number": lease.attempt_number,
                                            **data})

    def _started(self, flight: _Flight) -> None:
        where = flight.where
        lease = flight.lease
        gpus = f", GPUs {','.join(where.get('gpu_ids') or [])}" if where.get("gpu_ids") else ""
        self._record(self._event(
            lease, EventType.TASK_ATTEMPT_STARTED,
            f"attempt {lease.attempt_number} of task {lease.task_id} started on Ray node "
            f"{str(where.get('ray_node_id'))[:12]} ({where.get('hostname')}, {where.get('node_ip')}), "
            f"worker pid {where.get('worker_pid')}{gpus}", {"ray": where}))

    def _record(self, event: Event) -> None:
        self._call(self.coordinator.state.run, functools.partial(self.coordinator.record_event, event))

    def _store_log(self, lease: Lease, data: bytes) -> None:
        try:
            self.coordinator.artifacts.write_bytes(task_log_key(payload_prefix(lease)), data)
        except (FlashRuntimeError, OSError) as exc:  # a log is an aid, never the outcome
            log.warning("log of lease %s not stored: %s", lease.lease_id, exc)

    def _finished(self, flight: _Flight, result: dict[str, Any]) -> None:
        coordinator = self.coordinator
        lease = flight.lease
        self._store_log(lease, result.get("log") or b"")
        exit_code = result.get("exit_code")
        files = dict(result.get("files") or [])
        evidence = result.get("evidence") or {}
        if exit_code == 0 and "metrics.json" in files:
            prefix = payload_prefix(lease)
            try:
                for relative, data in sorted(files.items()):
                    coordinator.artifacts.write_bytes(prefix + relative, data)
            except (FlashRuntimeError, OSError) as exc:
                self._call(coordinator.manager.fail, lease.lease_id, f"output not stored: {exc}", now=coordinator.now())
                return
            request = CompleteRequest(output_sha256=hashlib.sha256(files["metrics.json"]).hexdigest(),
                                      evidence=evidence)
            self._call(coordinator.complete, lease, request)
            return
        log_tail = str(result.get("log_tail") or "")
        now = coordinator.now()
        hung = result.get("hung")
        if isinstance(hung, str) and hung:  # its node's hang watch stopped it
            self._failed(flight, judge_hang(hung, TASK_MODE, at=now), f"hang: {hung[:500]}",
                         evidence, lost=False)
            return
        if exit_code == 0:
            reason = ("exit 0 without out/metrics.json: a task must write metrics.json into $FLASHML_OUTPUT_DIR; "
                      f"its last line: {last_line(log_tail)}")
            verdict = judge_no_result(TASK_MODE, at=now)
        else:
            reason = f"exit {exit_code}: {last_line(log_tail)}"
            verdict = judge_exit(exit_code, log_tail, TASK_MODE, at=now)
        self._failed(flight, verdict, reason, evidence, lost=False)

    def _lost(self, flight: _Flight, exc: BaseException) -> None:
        if flight.cancel_since is not None or is_cancellation(exc):
            return  # cancelled: the lease had already ended
        failure, words = classify_ray_error(exc)
        reason = f"{failure}: {words}"
        verdict = AttemptVerdict(failure, words, decide(failure, TASK_MODE, {"evidence": words},
                                                        at=self.coordinator.now()))
        self._failed(flight, verdict, reason, dict(flight.where), lost=True)
        self._sweep_node(flight)

    def _failed(self, flight: _Flight, verdict: AttemptVerdict, reason: str, evidence: dict[str, Any], *,
                lost: bool) -> None:
        """Record the class and the decision, then act: no retry for a deterministic error, an
        expiry's budget for a lost worker or node, an attempt's budget otherwise."""
        coordinator = self.coordinator
        lease = flight.lease
        retry = verdict.retry
        if not lost:
            coordinator.keep_attempt_log(lease)
        event = failure_classified(lease, verdict, source=SOURCE, at=coordinator.now(), node_id=RAY_NODE_ID,
                                   data={"ray": evidence})

        def act() -> None:
            coordinator.record_event(event)
            now = coordinator.now()
            if lost:
                coordinator.manager.abandon(lease.lease_id, reason, now=now)
            else:
                coordinator.manager.fail(lease.lease_id, reason, now=now, retry=retry)

        self._call(coordinator.state.run, act)

    def _sweep_node(self, flight: _Flight) -> None:
        """Stop, on the node it ran on, what a dead or killed Ray worker left running."""
        node_id = flight.where.get("ray_node_id")
        if not node_id:
            return
        lease = flight.lease
        try:
            on_node(self._ray, ray_task.stop_leftovers, node_id).remote(lease.job_id, lease.task_id, lease.lease_id)
        except Exception as exc:  # the node is gone, and what ran there with it
            log.info("no sweep of lease %s on Ray node %s: %s", lease.lease_id, node_id, exc)

    def _call(self, action: Any, *args: Any, **kwargs: Any) -> Any:
        """``action(*args, **kwargs)``; a lease that ended meanwhile (``LeaseError``) is logged, not raised."""
        try:
            return action(*args, **kwargs)
        except LeaseError as exc:
            log.info("Ray dispatch: %s", exc)
            return None

