"""The built-in worker agent: register, heartbeat, claim, run, report — HTTP only.

``WorkerAgent(...).run()`` returns the exit code of ``flashruntime worker``: 0 after
``max_tasks`` tasks, a stop (SIGTERM, SIGINT) or a drain (SIGUSR1), 1 when registration is
refused (401/403), 2 when the coordinator is unreachable at startup or the work directory is
unusable or held by another worker. Before it registers, a worker stops whatever an earlier
worker in the same work directory left running (see ``agent.state``), and once registered
tells the coordinator those leases are abandoned. Standard library and pydantic only; psutil
is used when present.
"""

from __future__ import annotations

import logging
import math
import os
import platform
import signal
import socket
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pydantic import ValidationError

import flashruntime
from flashruntime.agent.gang_command import checked_node_addr
from flashruntime.agent.inputs import TaskRefused, safe_segment
from flashruntime.agent.lease_run import DRAIN_REASON, SHUTDOWN_REASON, LeaseRunner, WorkerTiming
from flashruntime.agent.node_token import read_token_file
from flashruntime.agent.sandbox import (
    BwrapProbe,
    Confinement,
    TaskUser,
    gpu_device_nodes,
    probe_bwrap,
    python_paths,
    resolve_task_user,
)
from flashruntime.agent.state import AttemptEntry, AttemptJournal, WorkDirLock
from flashruntime.agent.task_command import RUNNERS
from flashruntime.client import CoordinatorClient, RetryPolicy
from flashruntime.errors import (
    CoordinatorHTTPError,
    CoordinatorUnavailable,
    InvalidSubmission,
    LaunchError,
    WorkDirInUse,
    WorkerConfigError,
)
from flashruntime.launchers.containment import ContainmentKind, containment, containment_in_force
from flashruntime.launchers.local import proc_available, stop_leftover_attempt
from flashruntime.monitor.gpus import query_gpus
from flashruntime.monitor.hang_watch import hang_setting
from flashruntime.protocol.v1alpha1 import GpuInfo, Lease, NodeCapabilities, NodeHeartbeat, NodeRegistration
from flashruntime.recovery.preemption import preempt_settings
from flashruntime.signing import PublicKey, load_trusted_keys

__all__ = ["WorkerAgent"]

logger = logging.getLogger("flashruntime.worker")

EXIT_OK, EXIT_REFUSED, EXIT_UNREACHABLE = 0, 1, 2
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
DRAIN_SIGNAL: signal.Signals | None = getattr(signal, "SIGUSR1", None)  # POSIX only
_NO_DATASETS: Mapping[str, str] = MappingProxyType({})
_ARCHITECTURES = {"x86_64": "amd64", "amd64": "amd64", "x64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def _cpu_cores() -> float | None:
    try:
        return float(len(os.sched_getaffinity(0)))  # what this process may use, e.g. inside a container
    except (AttributeError, OSError):
        count = os.cpu_count()
        return float(count) if count else None


def _memory_bytes() -> int | None:
    if hasattr(os, "sysconf"):
        try:
            return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
        except (ValueError, OSError):
            return None
    try:  # no sysconf (Windows): psutil when present
        import psutil
    except ImportError:
        return None
    return int(psutil.virtual_memory().total)


def _gpus() -> list[GpuInfo]:
    return [GpuInfo(index=index, name=row.get("name") or "", memory_total_mb=row.get("mem_total_mb"))
            for index, row in enumerate(query_gpus())]


def resolve_task_user_config(name: str) -> TaskUser:
    """``task_user`` as a ``TaskUser``; ``WorkerConfigError`` when it cannot be used."""
    try:
        return resolve_task_user(name)
    except ValueError as exc:
        raise WorkerConfigError(str(exc)) from None


def _pool_list(pools: Iterable[str] | str) -> list[str]:
    items = pools.split(",") if isinstance(pools, str) else list(pools)
    if not all(isinstance(item, str) for item in items):
        raise ValueError(f"pools must be strings, got {items!r}")
    return [item.strip() for item in items if item.strip()]


class WorkerAgent:
    """A pull-based agent for one coordinator. ``timing`` tunes periods and clocks (tests)."""

    def __init__(
        self,
        coordinator: str,
        *,
        token: str | None = None,
        node_id: str | None = None,
        runner: str = "subprocess",
        max_tasks: int = 0,
        work_dir: str | os.PathLike[str] | None = None,
        join_code: str | None = None,
        poll_seconds: float = 2.0,
        pools: Iterable[str] = (),
        datasets: Mapping[str, str | os.PathLike[str]] = _NO_DATASETS,
        timing: WorkerTiming | None = None,
        token_file: str | os.PathLike[str] | None = None,
        task_user: str | None = None,
        sandbox_probe: BwrapProbe | None = None,
        trusted_submitter_keys: str | os.PathLike[str] | Mapping[str, PublicKey] | None = None,
        hang_timeout_s: float | None = None,
        node_addr: str | None = None,
    ) -> None:
        if runner not in RUNNERS:
            raise ValueError(f"runner must be one of {', '.join(RUNNERS)}, got {runner!r}")
        # Where the other nodes of a multi-node job reach this one (torchrun's --local-addr).
        self.node_addr = checked_node_addr(node_addr)
        # Seconds without progress before a task counts as hung (else $FLASHML_HANG_TIMEOUT_S,
        # else the default rule of monitor.hangs; 0: no watch).
        try:
            self.hang_timeout_s = hang_setting(hang_timeout_s, os.environ)
        except InvalidSubmission as exc:
            raise WorkerConfigError(str(exc)) from None
        # What a stop does to a running task ($FLASHML_PREEMPT_SIGNAL, $FLASHML_PREEMPT_GRACE_S):
        # the notice forwarded to its ranks, their grace to save, the checkpoint handed over.
        try:
            self.preempt = preempt_settings(os.environ)
        except ValueError as exc:
            raise WorkerConfigError(str(exc)) from None
        # A file or directory of .pub keys (SigningError, a ValueError, when unusable), or keys by id.
        self.trusted_submitter_keys: dict[str, PublicKey] | None = (
            None if trusted_submitter_keys is None
            else dict(trusted_submitter_keys) if isinstance(trusted_submitter_keys, Mapping)
            else load_trusted_keys(trusted_submitter_keys))
        # The token file is read here and masked in every task; a token given too wins.
        self.token_file = None if token_file is None else Path(os.path.expanduser(os.fspath(token_file))).resolve()
        if token is None and self.token_file is not None:
            token = read_token_file(self.token_file)
        self.task_user = None if task_user is None else resolve_task_user_config(task_user)
        # bwrap builds the sandboxed runner and the trusted runner's pid namespace; probed once.
        self.sandbox = sandbox_probe if sandbox_probe is not None or runner == "subprocess" else probe_bwrap()
        if runner == "sandboxed" and (self.sandbox is None or not self.sandbox.works):
            reason = self.sandbox.reason if self.sandbox is not None else "bwrap was not probed"
            raise WorkerConfigError(f"--runner sandboxed needs bubblewrap: {reason}; or start the worker with "
                                    "--runner subprocess (task modules only)")
        if isinstance(max_tasks, bool) or not isinstance(max_tasks, int) or max_tasks < 0:
            raise ValueError(f"max_tasks must be an integer >= 0 (0 = unlimited), got {max_tasks!r}")
        if isinstance(poll_seconds, bool) or not isinstance(poll_seconds, (int, float)) \
                or not math.isfinite(poll_seconds) or poll_seconds <= 0:
            raise ValueError(f"poll_seconds must be a finite number > 0, got {poll_seconds!r}")
        node_id = socket.gethostname() if node_id is None else node_id
        if not isinstance(node_id, str) or not node_id.strip():
            raise ValueError(f"node_id must be a non-empty string, got {node_id!r}")
        resolved: dict[str, str] = {}
        for name, path in dict(datasets).items():
            try:
                safe_segment(name, "dataset name")
            except TaskRefused as exc:
                raise ValueError(str(exc)) from None
            resolved[name] = os.fspath(path)
        self.timing = timing or WorkerTiming()
        self._stopping = threading.Event()  # stop requested (signal, stop(), refused re-registration)
        self._draining = threading.Event()  # drain requested: the running task finishes first
        self._no_more_claims = threading.Event()  # set by either: the claim loop ends
        self._takes_signals = False  # run() on the main thread: SIGUSR1 reaches drain()
        # The client repeats what is safe to repeat while the coordinator is unreachable or
        # busy, waiting between tries the way the claim loop does (a stop request ends a wait).
        self.client = CoordinatorClient(
            coordinator, token=token, join_code=join_code, user_agent=f"flashruntime-worker/{flashruntime.__version__}",
            retry=RetryPolicy(attempts=self.timing.finish_attempts, backoff_s=1.0,
                              max_backoff_s=self.timing.max_backoff_s, sleep=self._sleep),
        )
        self._claim_backoff = RetryPolicy(backoff_s=2.0 * float(poll_seconds), max_backoff_s=self.timing.max_backoff_s)
        self.runner = runner
        self.max_tasks = max_tasks
        self.poll_seconds = float(poll_seconds)
        self.pools = _pool_list(pools)
        self.datasets: dict[str, str] = resolved
        self.work_dir = None if work_dir is None else Path(os.path.expanduser(os.fspath(work_dir)))
        self.tasks_done = 0  # tasks that completed or failed
        self._node_id = node_id
        self._capabilities: NodeCapabilities | None = None
        self._closing = threading.Event()  # run() is returning: background threads end
        self._register_lock = threading.Lock()
        self._exit_code = EXIT_OK

    def confinement(self, work_root: Path) -> Confinement:
        """How this agent confines its tasks (see ``agent.sandbox``), said once in the log."""
        bwrap = self.sandbox.path if self.sandbox is not None and self.sandbox.works else None
        hidden = (self.token_file,) if self.token_file is not None else ()
        if self.runner == "sandboxed" and bwrap:
            readable = (*(Path(os.path.expanduser(path)) for path in self.datasets.values()), *python_paths())
            logger.info("tasks run in the bubblewrap sandbox (%s): read-only filesystem but their lease directory, "
                        "own pid and network namespaces, the worker's files out of sight", bwrap)
            worker_is_root = os.geteuid() == 0
            if worker_is_root and self.task_user is None:
                logger.warning("this worker runs as root without --task-user, so its sandboxed tasks run as root: they "
                               "cannot see /root, /home, /run, /var, /srv, /opt, /mnt, /media or the worker's files, but "
                               "they can read root's files elsewhere on the read-only filesystem; name an unprivileged "
                               "user with --task-user")
            return Confinement("sandbox", work_root, bwrap, hidden=hidden, readable=readable,
                               devices=gpu_device_nodes(), task_user=self.task_user, worker_is_root=worker_is_root)
        if self.runner == "trusted" and bwrap:
            logger.info("trusted tasks share the filesystem and network but run in their own pid namespace (%s): the "
                        "worker's environment, memory and token file are out of their reach", bwrap)
            return Confinement("namespace", work_root, bwrap, hidden=hidden, task_user=self.task_user)
        if self.runner == "trusted":
            logger.warning("bubblewrap is unavailable (%s): trusted tasks run as plain children; they cannot read the "
                           "worker's environment or memory (it is non-dumpable), but a task of the worker's own user "
                           "can read its token file and other leases' directories",
                           self.sandbox.reason if self.sandbox is not None else "not probed")
        return Confinement("none", work_root, task_user=self.task_user)

    @property
    def node_id(self) -> str:
        """The node id in use: the requested one, or the one the coordinator answered with."""
        return self._node_id

    def registration(self) -> NodeRegistration:
        """The ``NodeRegistration`` this agent sends (capabilities probed once)."""
        if self._capabilities is None:
            machine = platform.machine()
            self._capabilities = NodeCapabilities(
                cpu_cores=_cpu_cores(), memory_bytes=_memory_bytes(), gpus=_gpus(), pools=self.pools,
                os=platform.system().lower(), architecture=_ARCHITECTURES.get(machine.lower(), machine.lower()),
            )
        return NodeRegistration(
            node_id=self._node_id,
            kubernetes_node="",
            hostname=socket.gethostname(),
            capabilities=self._capabilities,
            module_capable=True,
            argv_capable=False,  # this agent never runs containers
            # The bubblewrap sandbox: the coordinator places sandboxed-tier commands here.
            sandbox_capable=self.runner == "sandboxed",
            unsandboxed_argv_capable=self.runner == "trusted",
            local_datasets=sorted(self.datasets),
            agent_version=flashruntime.__version__,
        )

    def stop(self) -> None:
        """Ask ``run`` to return now: a running child is stopped and its lease released ("agent
        shutdown"), which spends none of the task's budgets (a coordinator without the release
        route fails it instead)."""
        self._stopping.set()
        self._no_more_claims.set()

    def drain(self) -> None:
        """Ask ``run`` to return once the running task, if any, has finished and its outcome is
        reported; nothing new is claimed. A ``stop`` meanwhile still stops the task."""
        if not self._draining.is_set():
            logger.info("draining: no new tasks; exiting once the running one is reported")
        self._draining.set()
        self._no_more_claims.set()

    # lifecycle -------------------------------------------------------------------
    def run(self) -> int:
        """Register, then claim and run leases until ``max_tasks`` or a stop; returns the exit code."""
        restore = self._install_signal_handlers()
        try:
            return self._run()
        finally:
            restore()

    def _install_signal_handlers(self) -> Callable[[], None]:
        if threading.current_thread() is not threading.main_thread():
            return lambda: None  # signals reach only the main thread; callers elsewhere use stop()/drain()

        def on_stop(signum: int, frame: Any) -> None:
            logger.info("received %s: stopping", signal.Signals(signum).name)
            self.stop()

        def on_drain(signum: int, frame: Any) -> None:
            logger.info("received %s: draining", signal.Signals(signum).name)
            self.drain()

        handlers: dict[signal.Signals, Callable[[int, Any], None]] = dict.fromkeys(STOP_SIGNALS, on_stop)
        if DRAIN_SIGNAL is not None:
            handlers[DRAIN_SIGNAL] = on_drain
        previous = {sig: signal.getsignal(sig) for sig in handlers}
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        self._takes_signals = DRAIN_SIGNAL is not None

        def restore() -> None:
            self._takes_signals = False
            for sig, handler in previous.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

        return restore

    def _work_root(self) -> Path:
        if self.work_dir is None:
            return Path(tempfile.mkdtemp(prefix="flashruntime-worker-"))
        self.work_dir.mkdir(parents=True, exist_ok=True)
        return self.work_dir.resolve()

    def _run(self) -> int:
        try:
            work_root = self._work_root()
        except OSError as exc:
            logger.error("work directory %s is unusable: %s", self.work_dir, exc)
            return EXIT_UNREACHABLE
        lock = WorkDirLock(work_root)
        try:
            lock.acquire(self.node_id, drains_on_sigusr1=self._takes_signals)
        except WorkDirInUse as exc:
            logger.error("%s", exc)
            return EXIT_UNREACHABLE
        except OSError as exc:
            logger.error("work directory %s is unusable: %s", work_root, exc)
            return EXIT_UNREACHABLE
        try:
            return self._run_locked(work_root)
        finally:
            lock.release()

    def _run_locked(self, work_root: Path) -> int:
        try:
            confinement = self.confinement(work_root)
        except WorkerConfigError as exc:
            logger.error("%s", exc)
            return EXIT_REFUSED
        try:
            contained = containment_in_force()  # probed once, before any attempt starts
        except LaunchError as exc:
            logger.error("%s", exc)
            return EXIT_UNREACHABLE
        if containment().kind is not ContainmentKind.CGROUP:
            logger.warning("attempts run without a cgroup each (%s): %s", contained, containment().reason)
        journal = AttemptJournal(work_root)
        leftovers = journal.entries()
        self._sweep_leftovers(leftovers)
        if self._no_more_claims.is_set():
            logger.info("node %s stopping before it registered", self.node_id)
            return EXIT_OK
        logger.info("registering node %s with %s", self.node_id, self.client.base_url)
        try:
            self._register()
        except CoordinatorHTTPError as exc:
            if self._no_more_claims.is_set():  # asked to stop meanwhile: that is why it ends
                return EXIT_OK
            if exc.status in (401, 403):
                logger.error("registration refused by %s: %s", self.client.base_url, exc)
                return EXIT_REFUSED
            logger.error("registration failed at %s: %s", self.client.base_url, exc)
            return EXIT_UNREACHABLE
        except CoordinatorUnavailable as exc:
            if self._no_more_claims.is_set():
                return EXIT_OK
            logger.error("coordinator unreachable: %s", exc)
            return EXIT_UNREACHABLE
        logger.info("node %s registered with %s (runner %s, work dir %s, containment %s)", self.node_id,
                    self.client.base_url, self.runner, work_root, contained)
        beat = threading.Thread(target=self._node_heartbeats, name="flashruntime-node-heartbeat", daemon=True)
        beat.start()
        # A worker with a token believes its fleet is protected: it runs a command only for a
        # submitter the coordinator says holds the code-execution permission.
        runner = LeaseRunner(self.client, work_root=work_root, runner=self.runner, datasets=self.datasets,
                             timing=self.timing, stopping=self._stopping,
                             require_code_grant=self.client.authenticates, journal=journal,
                             confinement=confinement,
                             trusted_submitter_keys=self.trusted_submitter_keys,
                             hang_timeout_s=self.hang_timeout_s, preempt=self.preempt, node_addr=self.node_addr)
        try:
            self._report_abandoned(journal, leftovers)
            self._claim_loop(runner)
        finally:
            self._closing.set()
            beat.join()
        how = "drained" if self._draining.is_set() and not self._stopping.is_set() else "stopping"
        logger.info("node %s %s after %d task(s)", self.node_id, how, self.tasks_done)
        return self._exit_code

    # what an earlier worker in this work directory left ------------------------------
    def _sweep_leftovers(self, leftovers: list[AttemptEntry]) -> None:
        """Stop every process of the attempts an earlier worker here was running when it died.
        Before registering: nothing is claimed while they run, lest a task run twice at once."""
        if leftovers and not proc_available():
            logger.warning("an earlier worker in this work directory left %d attempt(s) in its journal; without "
                           "/proc their processes cannot be found, so any still running are left alone",
                           len(leftovers))
            return
        for entry in leftovers:
            pids = stop_leftover_attempt(Path(entry.output_dir), self.timing.term_grace_s,
                                         pgids=[entry.pid] if entry.pid else [], cgroup=entry.cgroup)
            if pids:
                logger.warning("stopped what an earlier worker in this work directory left running of lease %s "
                               "(%s/%s): pid(s) %s", entry.lease_id, entry.job_id, entry.task_id,
                               ", ".join(str(pid) for pid in sorted(pids)))

    def _report_abandoned(self, journal: AttemptJournal, leftovers: list[AttemptEntry]) -> None:
        """Tell the coordinator that the earlier worker's leases are abandoned (each counts as an
        expiry, as it would at its deadline), so their tasks requeue now; then forget them."""
        for entry in leftovers:
            reason = (f"the worker that ran it on node {entry.node_id} stopped without reporting (killed?); its "
                      "restart stopped what it left running")
            try:
                answer = self.client.retry.run(
                    lambda entry=entry, reason=reason: self.client.release(entry.lease_id, reason, abandoned=True))
            except CoordinatorHTTPError as exc:
                if exc.status == 410:
                    logger.info("lease %s of an earlier worker here had already ended", entry.lease_id)
                else:
                    logger.warning("lease %s of an earlier worker here: the coordinator would not take it back "
                                   "(%s); it ends at its deadline", entry.lease_id, exc)
            except CoordinatorUnavailable as exc:
                logger.warning("lease %s of an earlier worker here: %s; it ends at its deadline", entry.lease_id, exc)
            else:
                logger.warning("lease %s (%s/%s) of an earlier worker here reported abandoned: its task is %s",
                               entry.lease_id, entry.job_id, entry.task_id, answer.get("status", "requeued"))
            try:
                journal.forget(entry.lease_id)
            except OSError as exc:
                logger.warning("cannot update %s: %s", journal.path, exc)

    # registration and node heartbeats ------------------------------------------------
    def _register(self) -> None:
        with self._register_lock:
            answer = self.client.register(self.registration().model_dump(mode="json"))
            assigned = answer.get("node_id") if isinstance(answer, dict) else None
            if isinstance(assigned, str) and assigned and assigned != self._node_id:
                logger.info("coordinator registered this agent as node %s (asked for %s)", assigned, self._node_id)
                self._node_id = assigned
            withheld = answer.get("detail") if isinstance(answer, dict) else None
            if isinstance(withheld, str) and withheld:  # pools or the unsandboxed runner its credential lacks
                logger.warning("the coordinator withheld part of this registration: %s", withheld)

    def _reregister(self) -> bool:
        """Register again; a refusal (401/403) stops the agent with exit code 1."""
        try:
            self._register()
        except CoordinatorHTTPError as exc:
            if exc.status in (401, 403):
                logger.error("re-registration refused: %s", exc)
                self._exit_code = EXIT_REFUSED
                self.stop()
            else:
                logger.warning("re-registration failed: %s", exc)
            return False
        except CoordinatorUnavailable as exc:
            logger.warning("re-registration failed: %s", exc)
            return False
        logger.info("node %s re-registered", self.node_id)
        return True

    def _node_heartbeats(self) -> None:
        while not self._closing.wait(self.timing.node_heartbeat_s):
            node_id = self.node_id
            try:
                self.client.node_heartbeat(node_id, NodeHeartbeat(node_id=node_id).model_dump(mode="json"),
                                           retry=False)  # the next beat is the retry
            except CoordinatorHTTPError as exc:
                if exc.status == 404:
                    logger.warning("coordinator does not know node %s: re-registering", node_id)
                    self._reregister()
                else:
                    logger.warning("node heartbeat refused: %s", exc)
            except CoordinatorUnavailable as exc:
                logger.warning("node heartbeat failed: %s", exc)

    # claim loop ----------------------------------------------------------------------
    def _sleep(self, seconds: float) -> None:
        (self.timing.sleep or self._stopping.wait)(seconds)

    def _idle(self, seconds: float) -> None:
        """A wait of the claim loop, which a drain ends too."""
        (self.timing.sleep or self._no_more_claims.wait)(seconds)

    def _jittered(self, seconds: float) -> float:
        return seconds * self.timing.rng.uniform(0.8, 1.2)

    def _backoff(self, failures: int) -> float:
        """The wait after ``failures`` failed claims in a row: the client's retry rule, from
        twice the poll period, jittered so a fleet does not come back in step."""
        return self._jittered(self._claim_backoff.delay(failures))

    def _claim_loop(self, runner: LeaseRunner) -> None:
        refused = 0  # consecutive claims answered 403
        errors = 0  # consecutive claims that failed otherwise
        while not self._no_more_claims.is_set():
            try:
                data = self.client.claim(self.node_id)
            except CoordinatorHTTPError as exc:
                if exc.status == 403:
                    refused += 1
                    if refused == 1:
                        logger.warning("claim refused (%s): re-registering", exc)
                        self._reregister()
                    else:
                        self._idle(self._backoff(refused - 1))
                    continue
                errors += 1
                logger.warning("claim failed: %s", exc)
                self._idle(self._backoff(errors))
                continue
            except CoordinatorUnavailable as exc:
                errors += 1
                logger.warning("claim failed: %s", exc)
                self._idle(self._backoff(errors))
                continue
            refused = errors = 0
            if data is None:
                self._idle(self._jittered(self.poll_seconds))
                continue
            try:
                lease = Lease.model_validate(data)
            except ValidationError as exc:
                errors += 1
                logger.warning("claim answer is not a Lease: %s", exc)
                self._idle(self._backoff(errors))
                continue
            if self._no_more_claims.is_set():
                # The answer to a claim sent before the stop or drain: not run, given back.
                logger.info("lease %s arrived after the %s began: releasing it", lease.lease_id,
                            "stop" if self._stopping.is_set() else "drain")
                runner.give_back(lease, SHUTDOWN_REASON if self._stopping.is_set() else DRAIN_REASON)
                return
            outcome = runner.run(lease)
            if outcome.counts:
                self.tasks_done += 1
            if self.max_tasks and self.tasks_done >= self.max_tasks:
                logger.info("max tasks (%d) reached", self.max_tasks)
                return


