"""The coordinator's state and operations, without HTTP.

``Coordinator`` wires, from ``RuntimeSettings``, the one database (``state.py``: ledger,
lease store, checkpoint manifests, nodes), the lease manager and checkpoint catalog over
it, the node registry, the artifact store and the metrics; the FastAPI app (``app.py``)
is a thin layer of routes over it. Every transition runs in one database transaction
with the events it emits and what they imply (a job's new state, the accepted attempt's
evidence). Time comes from an injected clock so the sweeper and the tests never depend
on the wall clock.
"""

from __future__ import annotations

import functools
import json
import logging
import secrets
import threading
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, cast

from flashruntime.checkpoint import CheckpointCatalog
from flashruntime.coordinator import attempt_reports
from flashruntime.coordinator.access import LiveLease, owns_job
from flashruntime.coordinator.admission import JobBounds, SubmitterQuota, over_quota
from flashruntime.coordinator.admission_checks import (
    SUBMITTED_BY_KEY,
    require_code_permission,
    require_configured_backend,
    require_finite_parameters,
    require_ray_placement,
    require_readable_inputs,
    submitter_of,
)
from flashruntime.coordinator.artifacts import ArtifactStore, sha256_of
from flashruntime.coordinator.auth import Identity, authenticator_from_env
from flashruntime.coordinator.expansion import expand_tasks, require_task_bound
from flashruntime.coordinator.failures import TASK_MODE, failure_classified, failure_reason
from flashruntime.coordinator.gangs import (
    NO_RESULT_REASON,
    close_gang,
    gang_jobs_held,
    group_of,
    has_result,
    is_gang,
    live_peers,
    stamp_rendezvous,
)
from flashruntime.coordinator.lease_jobs import TERMINAL_JOB_STATES, refreshed
from flashruntime.coordinator.lease_watch import StandingChanges
from flashruntime.coordinator.metrics import Metrics
from flashruntime.coordinator.mlflow_tasks import MlflowTasks
from flashruntime.coordinator.node_grants import node_grants_for
from flashruntime.coordinator.nodes import NodeRegistry
from flashruntime.coordinator.ray_dispatch import BACKEND_KEY, BackendPlacement, RayDispatcher
from flashruntime.coordinator.settings import RuntimeSettings
from flashruntime.coordinator.state import InTransaction, open_state
from flashruntime.coordinator.task_logs import keep_attempt_log, read_log, task_log_path
from flashruntime.errors import (
    CheckpointError,
    ExpansionError,
    FlashRuntimeError,
    LeaseError,
    NoBackend,
)
from flashruntime.leases import LeaseManager
from flashruntime.protocol.task_logs import TASK_LOG_MAX_BYTES
from flashruntime.protocol.v1alpha1 import (
    CompleteRequest,
    Event,
    EventType,
    JobRecord,
    JobSpec,
    JobState,
    Lease,
    StragglerReport,
    SubmittedBy,
    TaskState,
)
from flashruntime.recovery.verdict import judge_exit, judge_hang, judge_no_result
from flashruntime.scheduler import IsolationAwarePlacement

__all__ = ["SUBMITTED_BY_KEY", "Coordinator", "NoBackend"]

SERVICE_SOURCE = "flashruntime.service"
EVENTS_LOGGER = logging.getLogger("flashruntime.events")
log = logging.getLogger("flashruntime.service")
# The backends a coordinator may run. Both queue their tasks in the lease store: agents claim
# the tasks of ``leases`` jobs, the Ray dispatcher those of ``ray`` jobs (FLASHML_RAY_ADDRESS).
BACKENDS = ("leases", "ray")
# Of a hung attempt's reason, what its FAILURE_CLASSIFIED event keeps as evidence.
# How long /readyz waits for the database: less than a prober's usual timeout.
READINESS_TIMEOUT_S = 2.0
DEFAULT_BACKEND = "leases"
_UNFINISHED_JOB_STATES = tuple(state for state in JobState if state not in TERMINAL_JOB_STATES)


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


class Coordinator:
    """Everything ``create_app`` wires, and the procedures the routes call."""

    def __init__(self, settings: RuntimeSettings, *, clock: Callable[[], datetime] = _utc_now) -> None:
        self.settings = settings
        self.now = clock
        Path(settings.artifacts_dir).mkdir(parents=True, exist_ok=True)
        self.authenticator = authenticator_from_env()  # before the database: a bad token setting opens nothing
        self.node_grants = node_grants_for(self.authenticator, join_code_set=settings.join_code is not None)
        self.mlflow = MlflowTasks(settings.mlflow_uri, settings.mlflow_experiment) if settings.mlflow_uri else None
        self.state = state = open_state(settings)
        self.ledger = state.ledger
        self.metrics = Metrics()
        self.standing_changes = StandingChanges()  # wakes the workers' lease watches on a cancel
        # Every call of the manager and the catalog is one transaction of the database, events
        # included: the listener (record_event) appends them through the same connection.
        self.manager = cast(LeaseManager, InTransaction(
            LeaseManager(state.leases, on_event=self.record_event), state.run, refusals=(LeaseError,)))
        self.catalog = cast(CheckpointCatalog, InTransaction(
            CheckpointCatalog(on_event=self.record_event, store=state.manifests), state.run,
            refusals=(CheckpointError,)))
        self.nodes = NodeRegistry(state.nodes, clock=lambda: self.now().timestamp())
        self.artifacts = ArtifactStore(settings.artifacts_dir, settings.max_artifact_mb * 1024 * 1024,
                                       min_free_bytes=settings.min_free_bytes)
        # Agents claim only the tasks of lease jobs; a ray job's are the Ray dispatcher's.
        self.placement = BackendPlacement("leases", IsolationAwarePlacement())
        self.ray: RayDispatcher | None = None
        # Per thread: the lease ids whose TASK_COMMIT_ACCEPTED this thread's manager.complete
        # emitted, i.e. the commits this call made (the manager emits it for the transition only).
        self._committing = threading.local()
        self._sweeping: bool | None = None  # whether the last sweep_once swept (None: none yet)

    @property
    def backends(self) -> tuple[str, ...]:
        """The backends this coordinator runs: ``leases``, and ``ray`` when a Ray address is set."""
        return BACKENDS if self.settings.ray_address else ("leases",)

    @property
    def default_backend(self) -> str:
        """What a job that names no backend gets: ``ray`` when a Ray address is set."""
        return "ray" if self.settings.ray_address else DEFAULT_BACKEND

    def start_backends(self) -> None:
        """Connect to the Ray cluster and start dispatching ``ray`` jobs, when a Ray address is set."""
        if self.settings.ray_address and self.ray is None:
            dispatcher = RayDispatcher(self, self.settings.ray_address)
            dispatcher.start()
            self.ray = dispatcher

    def close(self) -> None:
        if self.mlflow is not None:
            self.mlflow.close()  # what is queued is logged first: it reads the artifacts, not the database
        if self.ray is not None:
            self.ray.stop()
            self.ray = None
        self.state.close()

    # --- events ---------------------------------------------------------------

    def record_event(self, event: Event) -> None:
        """Ledger append, in the transaction of the transition that emitted the event; a task
        that ends settles its job's state in the same transaction. Once it commits: one JSON
        log line, and lease expiries counted for /metrics."""
        self.ledger.append_event(event)
        kind = event.type
        if kind is EventType.TASK_COMMIT_ACCEPTED:
            made = getattr(self._committing, "made", None)
            if made is not None:
                made.add(event.data.get("lease_id"))
            self._settle(event.job_id)
        elif kind is EventType.TASK_EXHAUSTED:
            self._settle(event.job_id)
        self.state.after_commit(functools.partial(self._observe, event))

    def _observe(self, event: Event) -> None:
        """What follows a stored event: the expiry counter and the JSON log line."""
        if event.type is EventType.LEASE_EXPIRED:
            self.metrics.count_expiries()
        if EVENTS_LOGGER.isEnabledFor(logging.INFO):
            EVENTS_LOGGER.info(json.dumps(event.model_dump(mode="json"), sort_keys=True))

    def _service_event(self, job_id: str, type_: EventType, message: str, data: dict[str, Any]) -> Event:
        return Event(job_id=job_id, type=type_, timestamp=self.now(), source=SERVICE_SOURCE, message=message,
                     data=data)

    # --- jobs -----------------------------------------------------------------

    def submit(self, spec: JobSpec, identity: Identity | None = None) -> JobRecord:
        """Accept a job, all or nothing: expand it into tasks (``ExpansionError`` → nothing
        stored), then queue every task in one lease-store transaction and, inside it, record
        the job RUNNING with its two service events and the TASK_CREATED events in one ledger
        transaction. A task the lease store refuses rolls the queue back before the ledger is
        written (``ExpansionError``), and a failed ledger write rolls the queue back too; only
        a failure of the lease store's final COMMIT could leave a job without its tasks.

        ``identity`` is the submitter (None or ``Identity(None, False)``: open mode). The job
        records it, and every task's payload carries it under ``submitted_by`` so a worker can
        check the grant itself. A job whose tasks would run commands (``argv``) from a
        submitter without the code-execution permission raises ``CodeExecutionNotPermitted``;
        one whose inputs name an artifact its submitter may not read raises ``AuthFailure``
        (403): a node reads its tasks' inputs, so a job must not fetch what its submitter cannot.

        Bounds before storage: a job over the coordinator's ``JobBounds`` raises ``TooManyTasks``
        (counted from the spec, before any task is built) or ``JobTooLarge`` (its payload bytes,
        added up while it expands); a submitter over its ``SubmitterQuota`` raises
        ``SubmitterOverQuota``, checked before the expansion and again inside the transaction
        that queues the job, so two submits at once cannot both pass it. The expansion runs
        before that transaction, so the database is held only for the inserts of a job the
        bounds have already sized, and the lease routes never wait behind an unbounded one."""
        identity = identity or Identity(None, False)
        if spec.spec.workload.type == "command":
            require_code_permission(identity)  # before expansion: its errors describe the command
        spec = _with_backend(spec, spec.spec.execution.backend or self.default_backend)
        backend = spec.spec.execution.backend
        require_configured_backend(backend, self.backends)
        bounds = JobBounds.from_settings(self.settings)
        require_task_bound(spec, bounds)  # before anything walks the parameters: a count is cheap to refuse
        require_finite_parameters(spec)
        submitted_by, stamp = submitter_of(identity)
        self._require_quota(submitted_by, 0)  # a submitter already at its quota is refused before any expansion
        job_id = secrets.token_hex(6)
        tasks = expand_tasks(job_id, spec, bounds)
        stamp_rendezvous(tasks, self.settings.rendezvous_port, backend)
        if any("argv" in task.payload for task in tasks):
            require_code_permission(identity)
        require_readable_inputs(identity, tasks, self.job_owned_by(identity))
        for task in tasks:
            task.payload[SUBMITTED_BY_KEY] = dict(stamp)
        if backend == "ray":
            require_ray_placement(tasks, self.ray.nodes() if self.ray is not None else None)
            for task in tasks:
                task.payload[BACKEND_KEY] = "ray"
        now = self.now()
        record = JobRecord(job_id=job_id, spec=spec, state=JobState.RUNNING, backend=backend,
                           deployment_profile=self.settings.profile, created_at=now, artifacts=[],
                           submitted_by=submitted_by)
        where = f" on the Ray cluster at {self.settings.ray_address}" if backend == "ray" else ""
        events = [
            self._service_event(job_id, EventType.JOB_ACCEPTED, f"job {spec.metadata.name} accepted as {job_id}",
                                {"name": spec.metadata.name}),
            self._service_event(job_id, EventType.BACKEND_SELECTED,
                                f"backend: {backend} ({len(tasks)} independent tasks{where})",
                                {"backend": backend, "tasks": len(tasks)}),
        ]

        def queue_and_record() -> list[Event]:
            self._require_quota(submitted_by, len(tasks))
            created: list[Event] = []
            # The same store, but TASK_CREATED events collected here: they follow the job's own
            # into the ledger in one write, once every task is queued.
            queue = LeaseManager(self.state.leases, on_event=created.append)
            for task in tasks:
                try:
                    queue.add_task(task, now=now)
                except ValueError as exc:
                    raise ExpansionError(
                        f"task {task.task_id!r} of workload.type {spec.spec.workload.type!r} cannot be queued: "
                        f"{exc}; fix the task its expansion builds"
                    ) from exc
            self.ledger.add_job(record, [*events, *created])
            return created

        created = self.state.run(queue_and_record)
        for event in (*events, *created):
            self._observe(event)
        if backend == "ray" and self.ray is not None:
            self.ray.wake()
        return record

    def _require_quota(self, submitted_by: SubmittedBy | None, new_tasks: int) -> None:
        """``SubmitterOverQuota`` when one more job of ``new_tasks`` tasks would put its
        submitter over the quota. Open mode has no identities, so its callers share one quota:
        a client address names no one (one machine, many users; one user, many addresses)."""
        quota = SubmitterQuota.from_settings(self.settings)
        mine = [record for record in self.ledger.jobs_in(_UNFINISHED_JOB_STATES)
                if record.submitted_by == submitted_by and record.backend in BACKENDS]
        pending = sum(self.manager.store.counts(record.job_id).get(TaskState.PENDING.value, 0) for record in mine)
        who = (f"submitter {submitted_by.name!r}" if submitted_by is not None
               else "the open coordinator's callers (together)")
        refusal = over_quota(who, len(mine), pending, new_tasks, quota)
        if refusal is not None:
            raise refusal

    def refresh(self, record: JobRecord) -> JobRecord:
        """The record with its derived state (from its tasks in the lease store, for either
        backend); persisted when it changed. A task's end settles its job at once (``_settle``);
        this catches up the rest."""
        if record.backend not in BACKENDS or record.state in TERMINAL_JOB_STATES:
            return record
        if refreshed(record, self.manager.job_state(record.job_id), self.now(), self._gang_result(record))[0] is record:
            return record  # the common case: unchanged, so nothing to re-read or write

        def store() -> JobRecord:
            # Re-read under the job's lock: a cancel, or another replica, may have moved it meanwhile.
            current = self.ledger.get_job(record.job_id, lock=True) or record
            return self._store_derived(current)

        return self.state.run(store)

    def _settle(self, job_id: str) -> None:
        """Inside the transaction of a task's end: store the job's derived state when it
        changed. While a task of the job is PENDING the job is running, whatever else is true,
        so the tasks are counted only at the job's tail."""
        if self.state.leases.next_pending(job_id) is not None:
            return
        # Locked: of two tasks ending at once, the second to take the job reads it after the
        # first has committed, so one of them sees every task ended and the job is settled once.
        record = self.ledger.get_job(job_id, lock=True)
        if record is not None and record.backend in BACKENDS and record.state not in TERMINAL_JOB_STATES:
            self._store_derived(record)

    def _store_derived(self, current: JobRecord) -> JobRecord:
        """``current`` with its derived state, stored with its JOB_SUCCEEDED / JOB_FAILED in one
        write when it changed, so a terminal (frozen) record never lacks its event. Call inside
        a transaction."""
        result = self._gang_result(current)
        updated, event = refreshed(current, self.manager.job_state(current.job_id), self.now(), result)
        if updated is not current and updated.state is JobState.FAILED and updated.error is None:
            error = NO_RESULT_REASON if result is False else failure_reason(self.ledger.events_for(current.job_id))
            updated = updated.model_copy(update={"error": error})
        if updated is not current:
            self.ledger.upsert_job(updated, events=() if event is None else (event,))
            if event is not None:
                self.state.after_commit(functools.partial(self._observe, event))
        return updated

    def _gang_result(self, record: JobRecord) -> bool | None:
        """For a multi-node job, whether a node committed the run's metrics; None for any other."""
        return has_result(self.manager, self.artifacts, record.job_id) if is_gang(record.spec) else None

    def job(self, job_id: str) -> JobRecord | None:
        record = self.ledger.get_job(job_id)
        return None if record is None else self.refresh(record)

    def jobs(self, identity: Identity | None = None) -> list[JobRecord]:
        """Every job, newest first; for a submitter, only the jobs it submitted."""
        identity = identity or Identity(None, False)
        return [self.refresh(record) for record in self.ledger.list_jobs()
                if owns_job(identity, record.submitted_by)]

    def job_owned_by(self, identity: Identity) -> Callable[[str], bool]:
        """``job_id -> bool``: whether ``identity`` may see that job (unknown jobs: False)."""

        def owned(job_id: str) -> bool:
            record = self.ledger.get_job(job_id)
            return record is not None and owns_job(identity, record.submitted_by)

        return owned

    def live_leases(self, identity: Identity) -> list[LiveLease]:
        """The acting node's live leases with the artifact keys of their inputs; none for
        an identity that is not a node."""
        if identity.node_id is None:
            return []
        now = self.now()
        leases = []
        for job_id, task_id in sorted(self.manager.live_leases_for_node(identity.node_id, now=now)):
            record = self.manager.store.get(job_id, task_id)
            inputs = record.spec.payload.get("inputs") if record is not None else None
            keys = frozenset(
                uri[len("artifact://"):] for uri in (inputs.values() if isinstance(inputs, dict) else ())
                if isinstance(uri, str) and uri.startswith("artifact://")
            )
            leases.append(LiveLease(job_id, task_id, keys))
        return leases

    def cancel(self, job_id: str) -> JobRecord | None:
        """Cancel every task of a job and mark it CANCELLED (the Ray dispatcher then stops the
        running Ray tasks of a ``ray`` job); a terminal job is unchanged."""
        record = self.job(job_id)
        if record is None or record.state in TERMINAL_JOB_STATES:
            return record
        now = self.now()

        def cancel_all() -> JobRecord:  # every task and the job's own record, or none of it
            for task in self.manager.records(job_id):
                self.manager.cancel_task(job_id, task.spec.task_id, now=now)  # a task already ended stays as it is
            # The job's row after its tasks', the order in which a task's end settles its job, so
            # the two never wait for each other in a cycle.
            current = self.ledger.get_job(job_id, lock=True) or record
            if current.state in TERMINAL_JOB_STATES:
                return current
            cancelled = current.model_copy(update={"state": JobState.CANCELLED, "finished_at": now})
            self.ledger.upsert_job(cancelled)
            return cancelled

        cancelled = self.state.run(cancel_all)
        self.standing_changes.notify()
        return cancelled

    def keep_attempt_log(self, lease: Lease) -> None:
        """Keep the log of ``lease``'s failed attempt (see ``task_logs.keep_attempt_log``)."""
        try:
            keep_attempt_log(self.artifacts, lease.job_id, lease.task_id, lease.payload, lease.attempt_number)
        except (FlashRuntimeError, OSError) as exc:
            log.warning("the log of attempt %s of task %s was not kept: %s", lease.attempt_number, lease.task_id,
                        exc)

    # --- leases ---------------------------------------------------------------

    def lease(self, lease_id: str) -> Lease | None:
        return self.manager.lease_info(lease_id)

    def fail_attempt(self, lease: Lease, reason: str, exit_code: int | None, *, hung: bool = False) -> None:
        """A worker's failed attempt. With its ``exit_code`` the failure is judged by the recovery
        policy from that and the task's log (``judge_exit``, as for a local run and on Ray): a
        deterministic error is not retried, and a ``FAILURE_CLASSIFIED`` event says why, in the
        transaction of the failure. One the worker's hang watch stopped (``hung``) is a ``hang``,
        its reason the evidence. Without either (the command never ran), the task's budget decides."""
        if exit_code is None and not hung:
            self.manager.fail(lease.lease_id, reason, now=self.now())
            return
        if hung:
            verdict = judge_hang(reason, TASK_MODE, at=self.now())
        elif exit_code == 0:
            verdict = judge_no_result(TASK_MODE, at=self.now())
        else:
            path = task_log_path(self.artifacts, lease.job_id, lease.task_id, lease.payload)
            log_tail = read_log(path, TASK_LOG_MAX_BYTES)[0] if path is not None else ""
            verdict = judge_exit(exit_code, log_tail, TASK_MODE, at=self.now())
        event = failure_classified(lease, verdict, source=SERVICE_SOURCE, at=self.now())

        def fail() -> None:
            # One transaction: a stale lease's LeaseError rolls the event back with it. The event
            # first, so a job this failure ends records it as the reason.
            self.record_event(event)
            self.manager.fail(lease.lease_id, reason, now=self.now(), retry=verdict.retry)

        self.state.run(fail)
        self.keep_attempt_log(lease)  # only once the fail was accepted: a stale one keeps nothing
        if hung:
            attempt_reports.count_hang_against_node(self, lease)

    def record_stragglers(self, lease: Lease, reports: Iterable[StragglerReport]) -> None:
        """Ranks a worker found straggling, recorded for the job and against its node."""
        attempt_reports.record_stragglers(self, lease, reports)

    def complete(self, lease: Lease, request: CompleteRequest) -> dict[str, Any]:
        """Commit ``request`` under ``lease`` (the caller may act on it): a repeat of the accepted
        commit is accepted again; a lease no longer live is rejected; the output must be uploaded with
        the claimed sha256, else the attempt fails; then the first valid commit wins."""
        now = self.now()
        record = self.manager.store.get(lease.job_id, lease.task_id)
        if record is not None and record.state is TaskState.COMPLETED and record.accepted_attempt_id == lease.lease_id:
            return {"accepted": True}
        if not self.manager.lease_is_live(lease.lease_id, now):
            self.manager.complete(lease.lease_id, request.output_sha256, now=now)  # records the rejection
            self.metrics.count_commit("rejected")
            return {"accepted": False, "detail": "lease is no longer live"}
        problem = self._output_problem(record.spec.commit_key if record is not None else "", request.output_sha256)
        if problem is not None:
            try:
                self.manager.fail(lease.lease_id, problem, now=now)
            except LeaseError:  # expired between the two checks: the sweep owns it now
                pass
            self.metrics.count_commit("invalid_output")
            return {"accepted": False, "detail": problem}

        def commit() -> tuple[bool, set[str]]:
            # The commit, its TASK_COMMIT_ACCEPTED, the job's state when this was its last task,
            # the node's accepted count and the attempt's evidence: one transaction. ``made`` starts
            # empty on every run, so a run rolled back and run again counts its commit once.
            self._committing.made = made = set()
            accepted = self.manager.complete(lease.lease_id, request.output_sha256, now=now)
            if accepted and lease.lease_id in made:
                self.nodes.count_accepted(lease.node_id)
                claimed_at = lease.deadline.timestamp() - lease.lease_seconds  # the lease as first issued
                self.ledger.record_evidence(
                    lease.lease_id, lease.job_id, lease.task_id, lease.node_id,
                    request.evidence, max(0.0, now.timestamp() - claimed_at),
                )
            return accepted, made

        try:
            accepted, made = self.state.run(commit)
        finally:
            self._committing.made = None
        if not accepted:
            self.metrics.count_commit("rejected")
            return {"accepted": False, "detail": "lease is no longer live"}
        if lease.lease_id not in made:
            # A duplicate of this same commit, racing it past the checks above: the manager
            # answered as to the winner's retry, so it is counted and recorded once.
            return {"accepted": True}
        self.metrics.count_commit("accepted")
        if record is not None and "gang" in record.spec.payload:
            self.close_gang(lease.job_id)  # the run is over when this commit holds its metrics
        if self.settings.tensorboard_dir:
            attempt_reports.write_tensorboard(self, lease, record.spec.commit_key if record is not None else "", now)
        if self.mlflow is not None:
            attempt_reports.log_mlflow(self, lease, record.spec.commit_key if record is not None else "", now)
        return {"accepted": True}

    def _output_problem(self, commit_key: str, output_sha256: str) -> str | None:
        """Why the committed output is not acceptable, or None: the file at the task's
        commit key must exist on this coordinator with exactly the claimed sha256."""
        path = self.artifacts.read_path(commit_key) if commit_key else None
        if path is None:
            return f"output {commit_key!r} was not uploaded before complete (PUT /v1alpha1/artifacts/{commit_key})"
        actual = sha256_of(path)
        if actual != output_sha256:
            return f"output {commit_key!r} has sha256 {actual}, not the claimed {output_sha256}"
        return None

    def readiness_problem(self) -> str | None:
        """Why this coordinator cannot serve now, or None: the database does not answer within
        ``READINESS_TIMEOUT_S``, or its tables do not (missing, or not readable)."""
        try:
            self.state.ping(READINESS_TIMEOUT_S)
            self.manager.store.counts()  # type: ignore[attr-defined]
            self.ledger.get_job("")
        except Exception as exc:  # any failure to read is "not ready"; the probe says which
            return f"{type(exc).__name__}: {exc}"
        return None

    # --- background -----------------------------------------------------------

    def sweep_once(self) -> int:
        """Expire overdue leases, then refresh every non-terminal job; the number
        expired. Where replicas share the database, only the one whose turn it is sweeps
        (``CoordinatorState.sweep_turn``); the others do nothing and return 0."""
        turn = self.state.sweep_turn()
        if self.state.sweeper is not None and turn != self._sweeping:
            if turn:
                log.info("this coordinator runs the expiry sweep of %s", self.state.url)
            elif self._sweeping is not None:
                log.warning("another coordinator runs the expiry sweep of %s now", self.state.url)
            self._sweeping = turn
        if not turn:
            return 0
        expired = self.manager.sweep(now=self.now())
        for record in self.ledger.list_jobs():
            if record.backend in BACKENDS and record.state not in TERMINAL_JOB_STATES:
                if is_gang(record.spec):
                    self.close_gang(record.job_id)  # a node requeued after its group finished
                self.refresh(record)
        return expired

    def close_gang(self, job_id: str) -> None:
        """A multi-node job whose run is over (a node committed its metrics): its node tasks
        still queued are cancelled as not needed and the job settled (``gangs.close_gang``)."""
        if not has_result(self.manager, self.artifacts, job_id):
            return
        now = self.now()

        def close() -> None:
            if close_gang(self.manager, job_id, now):
                self._settle(job_id)

        self.state.run(close)

    def join_gang(self, lease: Lease) -> Lease:
        """``lease`` as its node is given it: for a multi-node job's node, with the rendezvous id
        of its group (``gang.rdzv_id``), the group its live peers joined, else a new one (the
        job's previous group, if any, has ended and closed its rendezvous). Recorded as
        GANG_JOINED, under the job's lock, so nodes claiming at once join one group."""
        gang = lease.payload.get("gang")
        if not isinstance(gang, dict):
            return lease
        now = self.now()

        def assign() -> str:
            self.ledger.get_job(lease.job_id, lock=True)
            joined = {str(e.data.get("lease_id")): str(e.data.get("rdzv_id"))
                      for e in self.ledger.events_for(lease.job_id) if e.type is EventType.GANG_JOINED}
            peers = live_peers(self.manager, lease, now)
            rdzv_id = group_of(joined, peers, lease.job_id, secrets.token_hex(8))
            message = (f"node {lease.node_id} joined the group of {len(peers)} other node(s) running"
                       if peers else f"node {lease.node_id} starts a group")
            self.record_event(self._service_event(lease.job_id, EventType.GANG_JOINED, message, {
                "task_id": lease.task_id, "lease_id": lease.lease_id, "node_id": lease.node_id,
                "rdzv_id": rdzv_id, "peers": len(peers)}))
            return rdzv_id

        rdzv_id = self.state.run(assign)
        return lease.model_copy(update={"payload": {**lease.payload, "gang": {**gang, "rdzv_id": rdzv_id}}})

    def gang_jobs_held(self, node_id: str) -> list[str]:
        """The multi-node jobs ``node_id`` runs a node of (the claim view's ``gang_jobs``)."""
        return gang_jobs_held(self.manager, node_id, self.now())


def _with_backend(spec: JobSpec, backend: str) -> JobSpec:
    """``spec`` naming ``backend``: the job stored says what ran it, so a resubmission runs alike."""
    if spec.spec.execution.backend == backend:
        return spec
    execution = spec.spec.execution.model_copy(update={"backend": backend})
    return spec.model_copy(update={"spec": spec.spec.model_copy(update={"execution": execution})})
