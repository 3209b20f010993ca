"""Running one lease: child process tree, outputs, finish (what it runs, and with what
environment, is ``agent.task_command``'s; its heartbeats ``agent.lease_heartbeat``'s; its log's
upload ``agent.log_shipper``'s).

The child starts as the local launcher starts one (its own process group, the attempt's unique
``FLASHML_OUTPUT_DIR=<out dir>`` in its environment) and is watched and stopped by the
launcher's own handle, whose sweep also reaches ranks that left the group. Lease heartbeats
run on a thread from claim until the outcome is reported; a 410 or 403 abandons the lease.
The child's log goes to the coordinator as ``task.log`` under the task's output prefix: while
it runs, every ``log_upload_s`` when it grew, and once more before the outcome is reported.
An agent that stops gives the lease back (``release``): stopping is not the task's failure.
Each attempt is in the work directory's journal from before its child starts until its
outcome is reported, so a restart after ``kill -9`` can stop what it left running.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flashruntime.agent.attempt_files import (
    REASON_LIMIT,
    is_regular_file,
    last_log_line,
    output_files,
    payload_prefix,
    sha256_file,
    start_child,
)
from flashruntime.agent.checkpoint_handoff import hand_over, restore
from flashruntime.agent.gang_command import gang_of
from flashruntime.agent.inputs import (
    LeaseDirs,
    TaskInterrupted,
    TaskRefused,
    lease_dirs,
    prepare_inputs,
    task_cwd,
    write_spec,
)
from flashruntime.agent.lease_heartbeat import LOST_STATUSES, LeaseHeartbeat, heartbeat_interval
from flashruntime.agent.lease_watch import CancelWatch
from flashruntime.agent.log_shipper import TaskLogShipper, read_task_log  # noqa: F401  (importable here too)
from flashruntime.agent.sandbox import Confinement
from flashruntime.agent.state import AttemptEntry, AttemptJournal
from flashruntime.agent.task_command import RUNNERS, build_command, child_env, code_grant_problem  # noqa: F401  (importable here too)
from flashruntime.client import CoordinatorClient, is_transient
from flashruntime.errors import CheckpointError, CoordinatorHTTPError, CoordinatorUnavailable, InvalidSubmission
from flashruntime.launchers.containment import AttemptContainer
from flashruntime.launchers.local import (
    LocalLaunchHandle,
    open_container,
    proc_available,
)
from flashruntime.monitor import ResourceSampler, evidence_from_telemetry
from flashruntime.monitor.hang_watch import HangVerdict, HangWatch, task_hang_setting
from flashruntime.monitor.hangs import FLOOR_S
from flashruntime.monitor.preemption import Notice
from flashruntime.monitor.straggler_watch import StragglerWatch
from flashruntime.protocol.task_logs import TASK_LOG_NAME, task_log_key
from flashruntime.protocol.task_metrics import TASK_METRICS_NAME, task_metrics_key
from flashruntime.protocol.v1alpha1 import CompleteRequest, Lease, StragglerReport
from flashruntime.rank_files import RANKS_DIR, preempted_paths
from flashruntime.recovery.preemption import PreemptSettings
from flashruntime.signing import PublicKey

logger = logging.getLogger("flashruntime.worker")

SHUTDOWN_REASON = "agent shutdown"
DRAIN_REASON = "agent draining: the lease arrived after the drain began"
# A coordinator older than the release route answers it so; the lease is then failed, as before.
_NO_RELEASE_ROUTE = (404, 405)
STRAGGLER_REPORT_FIELDS = tuple(StragglerReport.model_fields)


@dataclass(frozen=True)
class WorkerTiming:
    """Periods and clocks of the agent; the documented values by default, shortened by tests."""

    node_heartbeat_s: float = 5.0
    term_grace_s: float = 10.0  # SIGTERM, then SIGKILL after this long
    min_lease_heartbeat_s: float = 1.0  # lease heartbeats every max(this, lease_seconds / 3)
    sampler_period_s: float = 2.0
    child_poll_s: float = 0.1
    max_backoff_s: float = 60.0
    finish_attempts: int = 3  # tries of complete/fail/upload while the coordinator is unreachable
    log_upload_s: float = 10.0  # a running task's log goes up at most this often, when it grew
    clock: Callable[[], float] = time.monotonic
    # Waits up to the given seconds; None = an interruptible wait that a stop request ends early.
    sleep: Callable[[float], object] | None = None
    rng: random.Random = field(default_factory=random.Random)


class Outcome(enum.Enum):
    COMPLETED = "completed"  # complete was sent (accepted or not)
    FAILED = "failed"  # fail was sent with a reason
    ABANDONED = "abandoned"  # the lease was lost (410/403) or the coordinator stayed unreachable
    CANCELLED = "cancelled"  # its job was cancelled on the coordinator; the task was stopped
    SHUTDOWN = "shutdown"  # the agent is stopping; the lease was released (no budget spent)

    @property
    def counts(self) -> bool:
        """Whether the task counts toward ``max_tasks`` (it completed or failed)."""
        return self in (Outcome.COMPLETED, Outcome.FAILED)


class _LeaseLost(Exception):
    """The coordinator no longer recognises this lease as ours."""


class _StragglersToCoordinator:
    """The straggler watch's episodes, each sent once with the lease's next heartbeat (the
    coordinator records them against the job and the node)."""

    def __init__(self, heartbeat: LeaseHeartbeat) -> None:
        self._heartbeat = heartbeat
        self._sent = 0

    def __call__(self, _attempt_id: str, changes: dict[str, Any]) -> None:
        episodes = changes.get("stragglers") or []
        for episode in episodes[self._sent:]:
            self._heartbeat.report_straggler({key: episode[key] for key in STRAGGLER_REPORT_FIELDS})
        self._sent = len(episodes)


class LeaseRunner:
    """Runs one claimed lease to an ``Outcome``."""

    def __init__(
        self,
        client: CoordinatorClient,
        *,
        work_root: Path,
        runner: str,
        datasets: Mapping[str, str],
        timing: WorkerTiming,
        stopping: threading.Event,
        require_code_grant: bool = False,
        journal: AttemptJournal | None = None,
        confinement: Confinement | None = None,
        trusted_submitter_keys: Mapping[str, PublicKey] | None = None,
        hang_timeout_s: float | None = None,
        preempt: PreemptSettings | None = None,
        node_addr: str | None = None,
    ) -> None:
        self._client = client
        self._node_addr = node_addr
        # What a stop does to a running task: the notice forwarded to its ranks, their grace to
        # save and leave, the checkpoint handed over. None (or no signal): the task is stopped.
        self._preempt = preempt
        self._hang_timeout_s = hang_timeout_s  # see monitor.hang_watch.hang_setting: None is the default rule
        self._trusted_submitter_keys = trusted_submitter_keys
        self._confinement = confinement
        self._journal = journal
        self._require_code_grant = require_code_grant
        self._work_root = work_root
        self._runner = runner
        self._datasets = dict(datasets)
        self._timing = timing
        self._stopping = stopping

    def _sleep(self, seconds: float) -> None:
        (self._timing.sleep or self._stopping.wait)(seconds)

    def run(self, lease: Lease) -> Outcome:
        heartbeat = LeaseHeartbeat(self._client, lease.lease_id,
                                   heartbeat_interval(lease, self._timing.min_lease_heartbeat_s))
        heartbeat.start()
        watch = CancelWatch(self._client, heartbeat).start()
        try:
            return self._run(lease, heartbeat)
        except _LeaseLost:
            if heartbeat.cancelled is not None:
                logger.info("lease %s (%s/%s) cancelled: its task was stopped", lease.lease_id, lease.job_id,
                            lease.task_id)
                return Outcome.CANCELLED
            logger.warning("lease %s abandoned: no longer held by this agent", lease.lease_id)
            return Outcome.ABANDONED
        finally:
            watch.stop()
            heartbeat.stop()
            self._forget(lease)

    def give_back(self, lease: Lease, reason: str) -> Outcome:
        """Release a lease this agent will not run (it arrived while the agent was stopping)."""
        try:
            return self._release(lease, reason)
        except _LeaseLost:
            return Outcome.ABANDONED

    def _record(self, lease: Lease, dirs: LeaseDirs, pid: int | None = None, *,
                container: AttemptContainer | None = None) -> None:
        if self._journal is not None:
            cgroup = None if container is None or container.path is None else os.fsdecode(container.path)
            self._journal.add(AttemptEntry(lease.lease_id, lease.job_id, lease.task_id, lease.node_id,
                                           os.fsdecode(dirs.out), pid, cgroup))

    def _forget(self, lease: Lease) -> None:
        """Out of the journal once the outcome is reported and every process has been stopped."""
        if self._journal is None:
            return
        try:
            self._journal.forget(lease.lease_id)
        except OSError as exc:  # a restart sweeps an attempt already gone and reports a lease already ended
            logger.warning("lease %s: cannot update %s: %s", lease.lease_id, self._journal.path, exc)

    def _interrupted(self, heartbeat: LeaseHeartbeat) -> bool:
        return heartbeat.lost.is_set() or self._stopping.is_set()

    def _run(self, lease: Lease, heartbeat: LeaseHeartbeat) -> Outcome:
        payload = lease.payload
        try:
            dirs = lease_dirs(self._work_root, lease.job_id, lease.task_id, lease.lease_id)
            argv, payload_env = build_command(payload, self._runner, dirs,
                                              require_code_grant=self._require_code_grant,
                                              confinement=self._confinement,
                                              trusted_submitter_keys=self._trusted_submitter_keys,
                                              coordinator_url=self._client.base_url, node_addr=self._node_addr)
            gang = gang_of(payload)
            params = payload.get("params", {})
            if not isinstance(params, dict):
                raise TaskRefused(f"payload params must be an object, got {params!r}")
            try:
                hang_timeout_s = task_hang_setting(payload_env, self._hang_timeout_s)
            except InvalidSubmission as exc:
                raise TaskRefused(str(exc)) from None
            inputs = prepare_inputs(self._client, payload, dirs, self._datasets,
                                    should_stop=lambda: self._interrupted(heartbeat))
            write_spec(dirs, lease.task_id, params, inputs)
            if gang is None:  # a multi-node run's checkpoints are the group's, in its shared directory
                self._restore(lease, dirs)
            if self._interrupted(heartbeat):
                raise TaskInterrupted("stopped before the child started")
            # Journaled before the child exists: a kill -9 from here on leaves a record of
            # what to sweep (its cgroup, its marker), even before the child's pid is known.
            container = open_container(dirs.out, lease.lease_id)
            try:
                self._record(lease, dirs, container=container)
            except OSError:
                container.close()
                raise
            env = child_env(payload_env, dirs, lease, checkpoint_dir=gang.checkpoint_dir if gang else None)
            handle = start_child(argv, env, dirs, self._timing.term_grace_s,
                                 container=container, cwd=task_cwd(payload, dirs))
        except TaskRefused as exc:
            return self._fail(lease, str(exc), Outcome.FAILED)
        except TaskInterrupted:
            return self._after_interrupt(lease, heartbeat)
        except OSError as exc:  # the agent's own disk: work dir, spec.json, extraction
            return self._fail(lease, f"agent error preparing the task: {exc}", Outcome.FAILED)
        logger.info("lease %s (%s/%s) started pid %s", lease.lease_id, lease.job_id, lease.task_id,
                    handle.execution_id)
        try:
            self._record(lease, dirs, int(handle.execution_id), container=handle.container)
        except OSError as exc:  # the marker is journaled already, which is what a restart sweeps by
            logger.warning("lease %s: cannot journal pid %s: %s", lease.lease_id, handle.execution_id, exc)
        started = self._timing.clock()
        shipper = TaskLogShipper(self._client, task_log_key(payload_prefix(lease)), dirs.log,
                                 self._timing.log_upload_s,
                                 metrics_key=task_metrics_key(payload_prefix(lease)),
                                 metrics=dirs.out / TASK_METRICS_NAME, lease_gone=heartbeat.lost.is_set)
        sampler = ResourceSampler(dirs.root, int(handle.execution_id), period_s=self._timing.sampler_period_s)
        if not proc_available():
            # /proc finds every process of the attempt on Linux; elsewhere the sampler's last-seen
            # set is the launcher sweep's best-effort fallback. On Linux it would also hold the leader as an
            # unreaped zombie, which os.kill(pid, 0) reports alive, stalling the sweep.
            handle.extra_pids = sampler.last_seen_pids
        sampler.start()
        hangs = HangWatch(handle, lease.lease_id, hang_timeout_s,
                          lambda _type, message: logger.warning("lease %s: %s", lease.lease_id, message),
                          # A multi-node group meeting again after a loss is silent, and not hung.
                          floor_s=FLOOR_S + (gang.regroup_s if gang is not None else 0.0))
        stragglers = StragglerWatch(dirs.out, lease.lease_id,
                                    lambda _type, message: logger.warning("lease %s: %s", lease.lease_id, message),
                                    _StragglersToCoordinator(heartbeat))
        hung: HangVerdict | None = None
        notice: Notice | None = None
        try:
            shipper.start()
            hangs.start()
            stragglers.start()
            state = handle.wait(timeout_seconds=0)
            while not state.terminal and not self._interrupted(heartbeat):
                state = handle.wait(timeout_seconds=self._timing.child_poll_s)
            hung = hangs.stop()
            if self._preempting(heartbeat, handle, dirs):
                notice = self._notice(handle, dirs)
            # A child that failed while the agent was stopping may have died of the same stop
            # (a supervisor signals the whole service): not the task's failure either.
            elif not state.terminal or (self._stopping.is_set() and handle.exit_code != 0):
                handle.cancel()
                shipper.stop()
                return self._after_interrupt(lease, heartbeat, shipper)
            wall_seconds = self._timing.clock() - started
        finally:
            hangs.stop()
            stragglers.stop()  # after its last reading, which the flush sends while the lease is ours
            heartbeat.flush()
            sampler.stop()
            shipper.stop()
        if notice is not None:
            return self._after_preemption(lease, heartbeat, dirs, handle, notice, shipper)
        if hung is not None:
            return self._fail_hung(lease, dirs, hung, handle.exit_code, shipper)
        return self._finish(lease, heartbeat, dirs, handle.exit_code, wall_seconds, shipper)

    def _fail_hung(self, lease: Lease, dirs: LeaseDirs, hung: HangVerdict, exit_code: int | None,
                   shipper: TaskLogShipper) -> Outcome:
        """An attempt the hang watch stopped: its ranks' stacks are appended to its log, which is
        shipped, and the coordinator is told it hung (it judges the failure ``hang``)."""
        # The log is the evidence that travels; the fail must go anyway.
        with contextlib.suppress(OSError), open(dirs.log, "a", encoding="utf-8") as log:
            log.write("\n" + hung.stacks_path.read_text(encoding="utf-8"))
        shipper.ship(final=True)
        judged = exit_code if exit_code is not None and -255 <= exit_code <= 255 else None
        return self._fail(lease, f"hang: {hung.evidence()}", Outcome.FAILED, exit_code=judged, hung=True)

    def _preempting(self, heartbeat: LeaseHeartbeat, handle: LocalLaunchHandle, dirs: LeaseDirs) -> bool:
        """Whether the agent's stop is a preemption of this attempt: the agent takes notices,
        the lease is still ours, and the child is running, or ended of the stop (it failed, or
        its ranks saved after the same signal reached them)."""
        if not self._stopping.is_set() or heartbeat.lost.is_set():
            return False
        if self._preempt is None or not self._preempt.signals:
            return False
        state = handle.poll()
        return not state.terminal or handle.exit_code != 0 or bool(preempted_paths(dirs.out / RANKS_DIR))

    def _notice(self, handle: LocalLaunchHandle, dirs: LeaseDirs) -> Notice:
        """Forward the notice to the attempt's ranks and give them the grace to save and leave;
        what is left then is killed."""
        assert self._preempt is not None
        notice = Notice(self._preempt.signals[0], self._preempt.grace_s, clock=self._timing.clock)
        notice.forward(handle)
        if notice.reached(handle):
            told = notice.told(handle)
            self._note(dirs, f"preemption notice: {notice.name} forwarded to pid(s) "
                             f"{', '.join(map(str, told)) or '(none: the task had ended)'}; "
                             f"{notice.grace_s:g} s to save and leave")
            notice.settle(handle)
        else:
            notice.ended_before(handle)
        return notice

    def _after_preemption(self, lease: Lease, heartbeat: LeaseHeartbeat, dirs: LeaseDirs,
                          handle: LocalLaunchHandle, notice: Notice, shipper: TaskLogShipper) -> Outcome:
        """A preempted attempt: its newest checkpoint handed to the coordinator (the step every
        rank saved after the notice, else the newest one it kept), its log shipped, and the
        lease given back, so the task is requeued without spending a budget and its next
        attempt, on whichever machine, resumes from that step."""
        requeued = "the task is requeued without spending its budget"
        row, message = notice.report(handle, lease.lease_id, dirs.ckpt,
                                   resume_from=requeued + ", to resume from step {step}",
                                   resume_newest=requeued + ", to resume from the newest checkpoint handed over")
        if heartbeat.lost.is_set():
            raise _LeaseLost()
        handed = (self._hand_over(lease, dirs, row["saved_step"]) if gang_of(lease.payload) is None
                  else "a multi-node run's checkpoints are not handed over: they stay in its checkpoint_dir")
        message = f"{message}; {handed}"
        self._note(dirs, message)
        shipper.ship(final=True)
        return self._release(lease, f"{SHUTDOWN_REASON}: {message}"[:REASON_LIMIT * 4])

    def _hand_over(self, lease: Lease, dirs: LeaseDirs, step: int | None) -> str:
        """Hand the attempt's checkpoint (``step``, else its newest) to the coordinator; what became of it, in words."""
        try:
            handed = self._settled(lambda: ("sent", hand_over(self._client, lease, dirs.ckpt, step)))
        except (CheckpointError, OSError) as exc:
            return f"its checkpoint was not handed over: {exc}"
        except CoordinatorHTTPError as exc:
            return f"the coordinator refused its checkpoint: HTTP {exc.status}: {exc.detail}"
        if handed is None:
            return "its checkpoint was not handed over: the coordinator stayed unreachable"
        if handed[1] is None:
            return "it kept no verified checkpoint to hand over"
        return f"handed {handed[1].describe()} to the coordinator"

    def _restore(self, lease: Lease, dirs: LeaseDirs) -> None:
        """Bring the task's checkpoint that another machine handed over into its checkpoint
        directory, unless this machine holds that step or a later one; noted in the task's log.
        A checkpoint that cannot be brought is noted too, and the task starts from what is here."""
        try:
            restored = self._settled(lambda: ("sent", restore(self._client, lease, dirs.ckpt)))
        except (CheckpointError, OSError) as exc:
            problem: str | None = str(exc)
        except CoordinatorHTTPError as exc:
            problem = f"HTTP {exc.status}: {exc.detail}"
        else:
            if restored is not None and restored[1] is not None:
                self._note(dirs, f"restored {restored[1].describe()}, handed over by an earlier attempt")
                return
            problem = None if restored is not None else "the coordinator stayed unreachable"
        if problem is not None:
            self._note(dirs, f"the checkpoint an earlier attempt handed over was not restored ({problem}); the "
                             "task starts from what this machine holds")

    def _note(self, dirs: LeaseDirs, message: str) -> None:
        """A line of the agent's own in the task's log (which is shipped), and in the agent's."""
        logger.info("%s: %s", dirs.root.name, message)
        with contextlib.suppress(OSError), open(dirs.log, "a", encoding="utf-8") as log:
            log.write(f"flashruntime agent: {message}\n")

    def _after_interrupt(self, lease: Lease, heartbeat: LeaseHeartbeat,
                         shipper: TaskLogShipper | None = None) -> Outcome:
        if heartbeat.lost.is_set():
            raise _LeaseLost()
        if shipper is not None:
            shipper.ship(final=True)  # while the lease is still ours: a stopped task's log is kept too
        return self._release(lease, SHUTDOWN_REASON)

    def _finish(self, lease: Lease, heartbeat: LeaseHeartbeat, dirs: LeaseDirs, exit_code: int | None,
                wall_seconds: float, shipper: TaskLogShipper) -> Outcome:
        metrics = dirs.out / "metrics.json"
        has_metrics = is_regular_file(metrics)
        gang = gang_of(lease.payload)
        if gang is not None and exit_code == 0 and preempted_paths(dirs.out / RANKS_DIR):
            # Another node's preemption: every rank of the group saved and left, this node's
            # too. The run is not over: give the lease back, and the group meets again.
            self._note(dirs, "the group's ranks saved and left after a preemption notice on another node; "
                             "the lease is given back so the run continues")
            shipper.ship(final=True)
            return self._release(lease, f"{SHUTDOWN_REASON}: the group was preempted")
        if gang is not None and gang.max_nodes > 1 and exit_code == 0 and not has_metrics:
            has_metrics = self._no_metrics_of_this_node(dirs, metrics)
        if exit_code != 0 or not has_metrics:
            logger.info("lease %s: child exited %s%s", lease.lease_id, exit_code,
                        "" if has_metrics else " without out/metrics.json")
            shipper.ship(final=True)  # before fail: after it the lease, and the right to write, is gone
            if exit_code == 0:  # it ran fine but left no result: say so, not just its last line
                reason = ("exit 0 without out/metrics.json: a task must write metrics.json into "
                          f"$FLASHML_OUTPUT_DIR; its last line: {last_log_line(dirs.log)}")
            else:
                reason = f"exit {exit_code}: {last_log_line(dirs.log)}"
            # With the exit code the coordinator judges the failure from it and the shipped log; a
            # code outside what a POSIX process can exit with (a Windows crash code) is left to the budget.
            judged = exit_code if exit_code is not None and -255 <= exit_code <= 255 else None
            return self._fail(lease, reason, Outcome.FAILED, exit_code=judged)
        prefix = payload_prefix(lease)
        if is_regular_file(dirs.out / TASK_LOG_NAME):
            logger.warning("lease %s: the task wrote out/%s, which the task's own log replaces on the coordinator",
                           lease.lease_id, TASK_LOG_NAME)
        files = output_files(dirs.out)
        logger.info("lease %s: uploading %d output file(s)", lease.lease_id, len(files))
        for relative, path in files:
            if self._interrupted(heartbeat):
                return self._after_interrupt(lease, heartbeat, shipper)
            if path.stat().st_size == 0:  # the coordinator keeps no empty artifact
                logger.info("lease %s: out/%s is empty; not uploaded", lease.lease_id, relative)
                continue
            try:
                uploaded = self._settled(lambda key=prefix + relative, path=path: self._client.put_artifact(key, path))
            except CoordinatorHTTPError as exc:
                shipper.ship(final=True)
                why = f"too large: {exc.detail}" if exc.status == 413 else f"HTTP {exc.status}: {exc.detail}"
                return self._fail(lease, f"upload of {relative!r} refused: {why}", Outcome.FAILED)
            if uploaded is None:
                return self._fail(lease, f"upload of {relative!r} failed: coordinator unreachable", Outcome.FAILED)
        shipper.ship(final=True)
        if self._interrupted(heartbeat):
            return self._after_interrupt(lease, heartbeat)
        heartbeat.stop()
        evidence = evidence_from_telemetry(dirs.telemetry, exit_code=0, wall_seconds=wall_seconds)
        body = CompleteRequest(output_sha256=sha256_file(metrics), evidence=evidence).model_dump(mode="json")
        try:
            answer = self._settled(lambda: self._client.complete(lease.lease_id, body))
        except CoordinatorHTTPError as exc:
            logger.warning("lease %s: complete refused: %s", lease.lease_id, exc)
            return Outcome.ABANDONED
        if answer is None:
            return Outcome.ABANDONED
        logger.info("lease %s completed: accepted=%s %s", lease.lease_id, answer.get("accepted"),
                    answer.get("detail") or "")
        return Outcome.COMPLETED

    def _no_metrics_of_this_node(self, dirs: LeaseDirs, metrics: Path) -> bool:
        """A node of a multi-node run whose ranks wrote no ``metrics.json``: global rank 0 writes
        the run's, on one node. This node commits an empty object, which says so (the
        coordinator counts the run done only on a commit with metrics); whether it could."""
        try:
            # O_EXCL | O_NOFOLLOW: never through a name the task left there, a link included.
            fd = os.open(metrics, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        except OSError:
            return False
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write("{}\n")
        self._note(dirs, "this node's ranks wrote no metrics.json (global rank 0 writes the run's, on its node); "
                         "committed an empty one")
        return True

    def _fail(self, lease: Lease, reason: str, outcome: Outcome, *, exit_code: int | None = None,
              hung: bool = False) -> Outcome:
        reason = reason[:REASON_LIMIT * 4]
        logger.info("lease %s failed: %s", lease.lease_id, reason)
        try:
            # Repeated like the idempotent calls: a repeat of a fail that was applied gets 410
            # (the lease is gone), which ends the attempt just the same.
            sent = self._settled(lambda: self._client.retry.run(
                lambda: self._client.fail(lease.lease_id, reason, exit_code=exit_code, hung=hung)))
        except CoordinatorHTTPError as exc:
            logger.warning("lease %s: fail refused: %s", lease.lease_id, exc)
            return Outcome.ABANDONED
        return outcome if sent is not None else Outcome.ABANDONED

    def _release(self, lease: Lease, reason: str) -> Outcome:
        """Give the lease back without failing its task; against a coordinator without the
        release route, fail it instead, as agents did before there was one."""
        logger.info("lease %s released: %s", lease.lease_id, reason)

        def release() -> Any:
            try:
                return self._client.release(lease.lease_id, reason)
            except CoordinatorHTTPError as exc:
                if exc.status not in _NO_RELEASE_ROUTE:
                    raise
            logger.info("lease %s: the coordinator cannot release leases: failing it instead", lease.lease_id)
            return self._client.fail(lease.lease_id, reason)

        try:
            # Repeated like fail: a repeat of an applied release gets 410, which ends it just the same.
            sent = self._settled(lambda: self._client.retry.run(release))
        except CoordinatorHTTPError as exc:
            logger.warning("lease %s: release refused: %s", lease.lease_id, exc)
            return Outcome.ABANDONED
        return Outcome.SHUTDOWN if sent is not None else Outcome.ABANDONED

    def _settled(self, call: Callable[[], Any]) -> Any:
        """``call()`` (which the client retries by its policy while the coordinator is unreachable
        or answers 5xx or 429); None when it stayed so. 403/404/410 mean the lease is gone
        (``_LeaseLost``); other HTTP errors propagate."""
        try:
            return call()
        except CoordinatorHTTPError as exc:
            if exc.status in (*LOST_STATUSES, 404):
                raise _LeaseLost() from None
            if not is_transient(exc):
                raise
            problem: Exception = exc
        except CoordinatorUnavailable as exc:
            problem = exc
        logger.warning("coordinator call failed after %d tries: %s", self._client.retry.attempts, problem)
        return None
