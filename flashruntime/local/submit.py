"""``flash.submit``: run the user's command locally, collect what it produced, and
recover from failures by the recovery policy (classify -> decide), resuming from
the job-scoped checkpoint directory. A sweep (``task_params``) runs its trials one
after another, or up to ``max_concurrent_trials`` at once, and ranks them by a metric.
No attempt outlives the process driving it: a terminating signal or the interpreter's
exit cancels and settles the runs first.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from flashruntime.checkpoint.local import latest_valid_manifest
from flashruntime.errors import InvalidSubmission, LaunchError
from flashruntime.launchers import LaunchState
from flashruntime.launchers.local import LOG_NAME, LocalLaunchHandle, LocalProcessLauncher, read_log_tail
from flashruntime.local.guard import (
    GUARD,
    Terminated,
    finish_attempt,
    on_main_thread,
    restore_handlers,
    signals_deferred,
    stop_active_attempts,
    track,
    untrack,
    wind_down_and_die,
)
from flashruntime.local.chaos import ChaosInjector, ChaosPlan
from flashruntime.local.live_output import LiveOutput
from flashruntime.local.run import Run, trial_id
from flashruntime.local.framework_resume import CheckpointWatch, FrameworkCheckpoints
from flashruntime.local.output_metrics import OutputMetrics
from flashruntime.local.run_dirs import new_run_dir
from flashruntime.monitor.exits import ExitWatch, ProcessSighting, first_exit
from flashruntime.monitor.framework_metrics import final_figures
from flashruntime.protocol.v1alpha1 import FailureClass, RecoveryDecision
from flashruntime.local.trial_workdir import WORKDIR_NAME, is_shared, link_source_view
from flashruntime.recovery import decide, judge_exit
from flashruntime.recovery.signals import failure_excerpt
from flashruntime.strategies.command import compile_workload
from flashruntime.workloads.command import CommandWorkload, collect_pattern_problem, task_params_problem
from flashruntime.workloads.ranking import mode_reason, resolve_mode

__all__ = ["EXECUTORS", "Run", "submit"]

EXECUTORS = ("local", "ray")


@dataclass(frozen=True)
class _Sweep:
    """How the trials of a fan-out are run."""

    max_concurrent_trials: int = 1
    fail_fast: bool = False
    mode: str | None = None  # as given to submit(); None: the rule of flashruntime.workloads.ranking


def submit(
    workload: CommandWorkload,
    output_dir: str | Path | None = None,
    wait: bool = True,
    max_restarts: int = 0,
    watch: bool | None = None,
    *,
    checkpoint_dir: str | Path | None = None,
    checkpoints: str | list[str] | None = None,
    metric: str | None = None,
    mode: str | None = None,
    max_concurrent_trials: int | None = None,
    fail_fast: bool = False,
    quiet: bool = False,
    stream: TextIO | None = None,
    chaos: ChaosPlan | None = None,
    ledger: Any = None,
    plan_key: str | None = None,
    executor: str = "local",
    ray_address: str | None = None,
) -> Run:
    """Launch ``workload`` and drive it to a terminal state (inline, or on a thread with ``wait=False``).

    ``output_dir`` defaults to a new directory under the runs root (``$FLASHML_RUNS_DIR``,
    else the platform's user data directory), where ``flashruntime runs`` finds it.

    The job's output is copied to ``stream`` (default ``sys.stdout``) as it is written,
    with the run's recovery events; ``quiet=True`` turns that off. For a sweep
    (``task_params``), ``metric`` and ``mode`` ("min" or "max") rank the trials (defaults:
    ``outputs.primary_metric``, and ``outputs.maximize`` when set, else the metric's name:
    a cost such as ``loss`` is minimised, anything else maximised), ``max_concurrent_trials`` runs up
    to that many at once (default: one at a time; with Ray, as many as the cluster has CPUs),
    and ``fail_fast=True`` stops the sweep at the first failed trial (otherwise every trial
    runs). ``executor="ray"`` runs each attempt as a Ray task on the cluster at
    ``ray_address`` (default: ``$FLASHML_RAY_ADDRESS``, else an embedded local Ray; see
    ``flashruntime.ray_backend.launcher``), with the same directories, recovery and run.json.
    The checkpoints the script keeps itself are recognised in its working directory and in
    ``FLASHML_CKPT_DIR`` (Hugging Face ``checkpoint-<step>/``, Lightning ``*.ckpt``, accelerate
    ``checkpoint_<n>/`` / ``step_<n>/``, PyTorch DCP directories), plus files or directories
    matching ``checkpoints`` (a glob or a list of them, relative to the working directory, e.g.
    ``"snapshot.pt"``): each is fingerprinted once written and verified before a relaunch, and
    a bad one is moved aside so the script resumes from the one before (see
    ``flashruntime.local.framework_resume``).
    ``chaos`` injects a ``ChaosPlan``'s faults into the run on purpose (see
    ``flashruntime.local.chaos``). With a ``CalibrationLedger`` as ``ledger`` and
    its ``plan_key``, a run that ends SUCCEEDED records its median step time and peak memory
    under that key (see ``CalibrationLedger.record_run``; ``flash.run`` passes both for a plan).
    Raises ``InvalidSubmission`` for arguments that cannot describe a run, before anything starts
    (and, with ``executor="ray"``, ``LaunchError`` for a cluster that cannot be reached).
    """
    if not isinstance(workload, CommandWorkload):
        raise TypeError(f"submit() takes a CommandWorkload, got {type(workload).__name__}")
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise InvalidSubmission(f"max_restarts must be an integer >= 0, got {max_restarts!r}")
    if executor not in EXECUTORS:
        raise InvalidSubmission(f"executor must be one of {', '.join(map(repr, EXECUTORS))}, got {executor!r}")
    if ray_address is not None and executor != "ray":
        raise InvalidSubmission(f"ray_address is for executor='ray' (executor is {executor!r}): pass both, or neither")
    if executor == "ray":
        from flashruntime.ray_backend.launcher import connect_for_a_run, resolve_address

        ray_address = resolve_address(ray_address)
        if chaos is not None:
            raise InvalidSubmission("chaos injects faults into local processes; it cannot reach attempts on Ray: drop "
                                    "chaos, or use executor='local'")
    if max_concurrent_trials is not None and (
            isinstance(max_concurrent_trials, bool) or not isinstance(max_concurrent_trials, int)
            or max_concurrent_trials < 1):
        raise InvalidSubmission(
            f"max_concurrent_trials must be an integer >= 1 (1 runs the trials one after another), "
            f"got {max_concurrent_trials!r}"
        )
    if metric is not None and (not isinstance(metric, str) or not metric.strip()):
        raise InvalidSubmission(f"metric must be the name of a key of metrics.json, e.g. 'loss'; got {metric!r}")
    if mode is not None and mode not in ("min", "max"):
        raise InvalidSubmission(f"mode must be 'min' or 'max', got {mode!r}")
    if chaos is not None and not isinstance(chaos, ChaosPlan):
        raise InvalidSubmission(f"chaos must be a ChaosPlan, got {type(chaos).__name__}")
    if (ledger is None) != (plan_key is None):
        raise InvalidSubmission(
            "ledger and plan_key go together: pass both (plan_key from "
            "flashruntime.profiling.calibration.plan_key(plan_id, family, workers)) or neither"
        )
    if plan_key is not None and (not isinstance(plan_key, str) or not plan_key.strip()):
        raise InvalidSubmission(f"plan_key must be a non-empty string such as 'pl_.../ddp/x2', got {plan_key!r}")
    fan_out = workload.resolved_mode() == "independent_tasks" and bool(workload.task_params)
    if ledger is not None and fan_out:
        raise InvalidSubmission(
            "a sweep over task_params cannot be recorded into a calibration ledger: its trials run different "
            "parameters under one key; drop ledger and plan_key, or submit one parameter set at a time"
        )
    if checkpoint_dir is not None and fan_out:
        raise InvalidSubmission(
            "checkpoint_dir cannot be combined with a fan-out over task_params: each trial keeps its own "
            "checkpoint tree under output_dir; drop checkpoint_dir or submit one parameter set at a time"
        )
    for pattern in workload.outputs.collect:
        problem = collect_pattern_problem(pattern)
        if problem is not None:  # refused before anything runs, not after the attempt succeeded
            raise InvalidSubmission(problem)
    checkpoint_patterns = _checkpoint_patterns(checkpoints)
    problem = task_params_problem(workload)
    if problem is not None:  # a trial's placeholder it cannot fill: refused here, not as a KeyError mid-run
        raise InvalidSubmission(problem)
    if ray_address is not None:
        connect_for_a_run(ray_address)  # before anything is made
    if output_dir is None:
        output_dir = new_run_dir()
    output_dir = Path(os.path.expanduser(str(output_dir))).resolve()
    run = Run(workload, output_dir, max_restarts, checkpoint_dir=checkpoint_dir)
    run.checkpoint_patterns = checkpoint_patterns
    if metric is not None or mode is not None:
        chosen = metric or run.metric
        run.recorder.set_metric(chosen, resolve_mode(chosen, mode, workload.outputs.maximize_if_set()))
    launcher: Any
    if ray_address is not None:  # executor="ray"
        from flashruntime.ray_backend.launcher import RayLauncher, cluster_cpus

        launcher = RayLauncher(ray_address, output_dir, checkpoint_dir=checkpoint_dir,
                               num_gpus=workload.resources.gpus or 0)
        if max_concurrent_trials is None and fan_out:
            max_concurrent_trials = cluster_cpus(ray_address)
    else:
        launcher = LocalProcessLauncher(output_dir, checkpoint_dir=checkpoint_dir)
    sweep = _Sweep(max_concurrent_trials=max_concurrent_trials or 1, fail_fast=bool(fail_fast),
                   mode=mode) if fan_out else None
    if ledger is not None and plan_key is not None:
        key = plan_key
        run.recorder.on_end(lambda: _record_calibration(run, ledger, key))
    if _viewer_wanted(watch):
        _start_viewer(run)
    if not quiet:
        concurrent = sweep is not None and sweep.max_concurrent_trials > 1 and len(workload.task_params or []) > 1
        LiveOutput(run, stream if stream is not None else sys.stdout, prefix_trials=concurrent,
                   sweep=sweep is not None).start()
    if chaos is not None:
        ChaosInjector(run, chaos, launcher.checkpoint_root).start()
    track(run)
    if wait:
        run.recorder.driver = threading.current_thread()
        _drive_inline(run, launcher, sweep)
    else:
        thread = threading.Thread(target=_drive, args=(run, launcher, sweep), kwargs={"reraise": False},
                                  name="flashruntime-run", daemon=True)
        run.recorder.driver = thread
        try:
            thread.start()
        except BaseException:
            untrack(run)
            raise
    return run


def _checkpoint_patterns(checkpoints: str | list[str] | None) -> list[str]:
    """``checkpoints`` as a list of globs, each relative and inside the working directory."""
    if checkpoints is None:
        return []
    patterns = [checkpoints] if isinstance(checkpoints, str) else checkpoints
    if not isinstance(patterns, (list, tuple)) or not all(isinstance(p, str) for p in patterns):
        raise InvalidSubmission(f"checkpoints must be a glob or a list of globs, e.g. 'snapshot.pt' or "
                                f"['ckpt/*.pt'], got {checkpoints!r}")
    for pattern in patterns:
        problem = collect_pattern_problem(pattern)
        if problem is not None:
            raise InvalidSubmission(problem.replace("outputs.collect pattern", "checkpoints pattern")
                                    .replace("e.g. 'metrics.json' or 'results/*.csv'", "e.g. 'snapshot.pt'"))
    return list(patterns)


def _record_calibration(run: Run, ledger: Any, key: str) -> None:
    """Record a SUCCEEDED run's figures under ``key``, with an event saying what was recorded.
    Never raises: the run has succeeded, and a ledger that cannot be written does not change that."""
    if run.state is not LaunchState.SUCCEEDED:
        return  # a failed or cancelled run's step time is not what the plan's runs take
    try:
        figures = ledger.record_run(key, run.output_dir.name, run.output_dir)
    except Exception as exc:  # noqa: BLE001 - whatever the ledger raises is reported as an event, never raised
        run.record_event("CALIBRATION_FAILED", f"not recorded in the calibration ledger {ledger.path}: "
                         f"{type(exc).__name__}: {exc}")
        return
    if figures.step_time_s is None:
        run.record_event("CALIBRATION_SKIPPED", "not recorded in the calibration ledger: no two timed steps in one "
                         "attempt (call flashruntime.torch's log_metrics({'step': step, ...}) each step)")
        return
    memory = "no peak memory" if figures.peak_memory_gb is None else f"peak {figures.peak_memory_gb:.3g} GB"
    run.record_event("CALIBRATION_RECORDED", f"median step {figures.step_time_s:.4g} s over {figures.timed_steps} "
                     f"timed step(s), {memory}, recorded under {key} in {ledger.path}")


def _viewer_wanted(watch: bool | None) -> bool:
    if watch is not None:
        return watch
    return sys.stdout.isatty() and "CI" not in os.environ


_viewers: list[Any] = []  # kept alive for the process lifetime


def _start_viewer(run: Run) -> None:
    try:
        from flashruntime.viewer.server import RunViewerServer

        server = RunViewerServer(run.output_dir)
        server.start()
        _viewers.append(server)
        run.viewer_url = server.url
        print(f"viewer: {server.url}", flush=True)
        import webbrowser

        webbrowser.open(server.url)
    except Exception as exc:  # the viewer is a convenience; it never fails a run
        print(f"viewer: unavailable ({type(exc).__name__}: {exc})", file=sys.stderr, flush=True)


def _drive(run: Run, launcher: LocalProcessLauncher, sweep: _Sweep | None, *, reraise: bool) -> None:
    try:
        _drive_all(run, launcher, sweep)
    except LaunchError as exc:
        run.recorder.request_cancel()  # trials still running in a sweep: none of them goes on
        stop_active_attempts(run)
        run.record_event("LAUNCH_FAILED", str(exc))
        run.recorder.finish(LaunchState.FAILED)
        if reraise:
            raise
    except BaseException as exc:
        # Interrupted (Ctrl-C, a terminating signal), or a bug of ours: either way no
        # attempt may outlive the run, and its row is settled as a cancel() would settle it.
        if not isinstance(exc, Exception):
            run.recorder.request_cancel()  # no relaunch, whatever else is still running
        stopped = stop_active_attempts(run)
        if isinstance(exc, Exception):
            run.record_event("RUN_ERROR", f"run stopped by {type(exc).__name__}: {exc}")
            run.recorder.finish(LaunchState.FAILED)
        else:
            run.recorder.end_cancelled(stopped)
        if reraise:
            raise
    finally:
        untrack(run)


def _drive_inline(run: Run, launcher: LocalProcessLauncher, sweep: _Sweep | None) -> None:
    """``wait=True``: drive on this thread. On the main thread a terminating signal
    interrupts the drive like Ctrl-C (the attempt is stopped and settled), then this
    process dies of that signal, as it would have without a run."""
    main = on_main_thread()
    if main:
        GUARD.inline += 1
    interrupted_again = False
    try:
        try:
            _drive(run, launcher, sweep, reraise=True)
        finally:
            if main:
                GUARD.inline -= 1
    except Terminated:
        pass  # settled by _drive; the signal is re-raised below
    except BaseException:
        if not (main and GUARD.received is not None):
            raise
        interrupted_again = True  # a Ctrl-C cut short the cancel of the terminated attempt: hurry
    finally:
        signum = GUARD.received if main else None
        if signum is not None:
            wind_down_and_die(signum, run, hurry=interrupted_again)
        restore_handlers()


def _stopped_attempts(run: Run) -> list[str]:
    """The attempts a cancel() stopped: those that settled CANCELLED. A cancel that arrives
    after the last attempt ended by itself stopped nothing."""
    return [str(row["attempt_id"]) for row in run.attempts if row["state"] == str(LaunchState.CANCELLED)]


def _drive_all(run: Run, launcher: LocalProcessLauncher, sweep: _Sweep | None) -> None:
    run.recorder.set_state(LaunchState.RUNNING)
    if sweep is None:
        spec = compile_workload(run.workload, None)
        outcome, metrics = _run_param_set(run, launcher, spec, "local", "task-000", "coordinated_training", None)
        if metrics is not None:
            run.recorder.add_trial(metrics)
        all_succeeded = outcome is LaunchState.SUCCEEDED
    else:
        all_succeeded = _run_sweep(run, launcher, sweep)
    if run.cancel_requested:
        run.recorder.end_cancelled(_stopped_attempts(run))
    else:
        run.recorder.finish(LaunchState.SUCCEEDED if all_succeeded else LaunchState.FAILED)


class _SweepState:
    """The trials of one sweep being handed out to the threads that run them."""

    def __init__(self, size: int) -> None:
        self.lock = threading.Lock()
        self.next_index = 0
        self.size = size
        self.stopped = threading.Event()  # fail-fast: no further trial starts, the running ones are stopped
        self.failed = False
        self.error: BaseException | None = None

    def take(self) -> int | None:
        with self.lock:
            if self.stopped.is_set() or self.next_index >= self.size:
                return None
            index, self.next_index = self.next_index, self.next_index + 1
            return index


def _run_sweep(run: Run, launcher: LocalProcessLauncher, sweep: _Sweep) -> bool:
    """Run every trial (or up to the first failure with fail_fast); True when all succeeded."""
    param_sets = list(run.workload.task_params or [])
    run.recorder.start_sweep(param_sets, sweep.max_concurrent_trials, sweep.fail_fast)
    at_once = "one at a time" if sweep.max_concurrent_trials == 1 else f"up to {sweep.max_concurrent_trials} at once"
    ranked = ("unranked (no metric)" if run.metric is None else
              f"ranked by {run.metric}, {mode_reason(run.metric, sweep.mode, run.workload.outputs.maximize_if_set())}")
    run.record_event("SWEEP_STARTED", f"{len(param_sets)} trials, {at_once}, {ranked}")
    state = _SweepState(len(param_sets))

    def trials() -> None:
        while not run.cancel_requested:
            index = state.take()
            if index is None:
                return
            succeeded = _run_trial(run, launcher, param_sets[index], index, len(param_sets), state.stopped,
                                   concurrent=sweep.max_concurrent_trials > 1)
            if not succeeded and sweep.fail_fast:
                _stop_the_sweep(run, state, index)

    def trials_on_a_thread() -> None:
        try:
            trials()
        except BaseException as exc:  # handed to the driving thread; the other trials stop now
            with state.lock:
                state.error = state.error or exc
            state.stopped.set()
            for _attempt_id, handle in run.recorder.active:
                handle.cancel()

    workers = min(sweep.max_concurrent_trials, len(param_sets))
    if workers == 1:
        trials()
    else:
        threads = [threading.Thread(target=trials_on_a_thread, name=f"flashruntime-trials-{n}", daemon=True)
                   for n in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(0.2)  # in short waits: a signal handler runs on this thread meanwhile
    if state.error is not None:
        raise state.error
    for index, trial in enumerate(run.sweep["trials"] if run.sweep else []):
        if trial["state"] == str(LaunchState.PENDING):  # never started: fail-fast or a cancel stopped the sweep
            run.recorder.update_trial(index, {"state": str(LaunchState.CANCELLED)})
    return not state.failed and all(t["state"] == str(LaunchState.SUCCEEDED) for t in run.sweep["trials"])


def _stop_the_sweep(run: Run, state: _SweepState, failed_index: int) -> None:
    """fail_fast: no trial starts after ``failed_index`` failed, and the running ones are stopped."""
    with state.lock:
        state.failed = True
        if state.stopped.is_set():
            return
        state.stopped.set()
    run.record_event("SWEEP_STOPPED", f"trial {trial_id(failed_index)} failed: stopping the sweep (fail_fast)")
    for _attempt_id, handle in run.recorder.active:
        handle.cancel()


def _run_trial(
    run: Run, launcher: LocalProcessLauncher, params: dict[str, Any], index: int, total: int,
    stopped: threading.Event, *, concurrent: bool,
) -> bool:
    """One trial of a sweep, with its restarts, in its own working directory (a view of the
    source, see ``flashruntime.local.trial_workdir``); True when it succeeded. ``concurrent``:
    other trials run at the same time, so a file of the shared source is nobody's."""
    trial = trial_id(index)
    label = f"trial {index + 1}/{total} {trial}"
    started = time.time()
    run.recorder.update_trial(index, {"state": str(LaunchState.RUNNING), "started_at": started})
    run.record_event("TRIAL_STARTED", f"{label} started ({_describe_params(params)})")
    source = Path(os.path.expanduser(run.workload.source.path))
    try:
        # What the trial writes (collected outputs, its own checkpoints) is its own, never a link.
        view = link_source_view(source, run.output_dir / trial / WORKDIR_NAME,
                                [*run.workload.outputs.collect, *run.checkpoint_patterns], skip=[run.output_dir])
    except OSError as exc:
        raise LaunchError(f"could not make trial {trial}'s working directory from {str(source)!r}: {exc}; "
                          "check that the source directory is readable and the output directory writable") from exc
    spec = compile_workload(run.workload, params).model_copy(update={"workdir_hint": str(view)})
    outcome, metrics = _run_param_set(run, launcher, spec, trial, f"task-{index:03d}", "independent_tasks", params,
                                      trial_index=index, stopped=stopped, view=view,
                                      shared_writers=concurrent)
    if metrics is not None:
        run.recorder.add_trial(metrics, index)
    finished = time.time()
    run.recorder.update_trial(index, {"state": str(outcome), "finished_at": finished, "metrics": metrics})
    value = None if run.metric is None or metrics is None else metrics.get(run.metric)
    scored = f", {run.metric}={value}" if value is not None else ""
    run.record_event("TRIAL_FINISHED", f"{label} {outcome} in {finished - started:.1f} s{scored}")
    return outcome is LaunchState.SUCCEEDED


def _describe_params(params: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value!r}" if isinstance(value, str) else f"{key}={value}"
                     for key, value in params.items()) or "no parameters"


def _run_param_set(
    run: Run,
    launcher: LocalProcessLauncher,
    spec: Any,
    job_id: str,
    base_id: str,
    mode: str,
    params: dict[str, Any] | None,
    *,
    trial_index: int | None = None,
    stopped: threading.Event | None = None,
    view: Path | None = None,
    shared_writers: bool = False,
) -> tuple[LaunchState, dict[str, Any] | None]:
    """Run one param set with its restarts: (its last state, its last metrics.json). ``stopped``
    (a fail-fast sweep) ends it like a cancel, without cancelling the run. ``view``: the trial's
    working directory, where its outputs are collected from (see ``_collect_outputs``)."""
    source_dir = Path(os.path.expanduser(run.workload.source.path))
    metrics: dict[str, Any] | None = None
    state = LaunchState.FAILED
    framework = FrameworkCheckpoints([view or source_dir, launcher.checkpoint_root(job_id)], run.checkpoint_patterns,
                                     run.output_dir / job_id, since_ns=_filesystem_now_ns(run.output_dir))
    failure_class: FailureClass | None = None

    def halted() -> bool:
        return run.cancel_requested or (stopped is not None and stopped.is_set())

    for restart in range(run.max_restarts + 1):
        if halted():
            break
        attempt_id = base_id if restart == 0 else f"{base_id}-r{restart}"
        if restart >= 1:
            _select_resume(run, launcher.checkpoint_root(job_id), attempt_id, framework,
                           failed_loading=failure_class is FailureClass.ARTIFACT_CORRUPTION)
        started_ns = _filesystem_now_ns(run.output_dir)
        # A terminating signal waits until the attempt has its handle and its row; the run's lock,
        # held throughout, makes a cancel on another thread wait for the handle too.
        with run.recorder.lock, signals_deferred():
            if halted():  # a cancel (or fail-fast) took the lock first: it could not see this attempt
                break
            handle = launcher.launch(spec, job_id, attempt_id)
            run.recorder.add_active(attempt_id, handle)
            launched = f"{attempt_id} launched ({getattr(handle, 'launched_as', None) or f'pid {handle.execution_id}'})"
            if handle.previous_dir is not None:
                launched += f"; an earlier run's {attempt_id}/ was moved to {handle.previous_dir.name}/"
            run.record_event("LAUNCH_STARTED", launched)
            run.recorder.add_attempt({
                "attempt_id": attempt_id, "job_id": job_id, "state": "RUNNING", "pid": handle.execution_id,
                "started_at": time.time(), "finished_at": None, "output_dir": str(handle.output_dir),
                "exit_code": None,
            })
            if trial_index is not None:
                run.recorder.update_trial(trial_index, {}, attempt_id=attempt_id)
        sampler = _start_sampler(handle)
        exits = ExitWatch(handle.processes).start() if isinstance(handle, LocalLaunchHandle) else None
        saves = CheckpointWatch(framework, run.record_event).start()
        curves = OutputMetrics(handle.output_dir).start()
        try:
            try:
                state = handle.wait()
            finally:  # on an interrupt the attempt stays active: _drive stops and settles it
                if sampler is not None:
                    _stop_sampler(sampler)
                sightings = exits.stop() if exits is not None else []
            finish_attempt(run, handle, attempt_id, state)  # first: a cancel arriving now finds it settled
        finally:
            saves.stop()
            curves.stop()
        _collect_outputs(run, source_dir, handle.output_dir, started_ns, attempt_id=attempt_id, view=view,
                         shared_writers=shared_writers)
        candidate = _read_metrics(handle.output_dir / "metrics.json", started_ns)
        if candidate is None:
            candidate = _framework_figures(run, view or source_dir, handle, attempt_id, started_ns)
        if candidate is not None:
            if params is not None:
                candidate.setdefault("params", params)
            metrics = candidate
        if state is not LaunchState.FAILED:
            break
        went_first = first_exit(sightings, int(handle.execution_id)) if sightings else None
        decision = _classify_failure(run, handle, attempt_id, mode, last_attempt=restart == run.max_restarts,
                                     went_first=went_first, processes=len(sightings))
        failure_class = decision.failure_class
        if decision.action == "fail_job":
            break
    return state, metrics


def _select_resume(run: Run, checkpoint_root: Path, attempt_id: str, framework: FrameworkCheckpoints, *,
                   failed_loading: bool) -> None:
    """Before a relaunch: say what it resumes from. A valid ``flashruntime.torch`` manifest in
    ``FLASHML_CKPT_DIR`` first; else the newest framework checkpoint that verifies (bad ones
    are quarantined first, so the script's own resume logic takes the one before)."""
    manifest = latest_valid_manifest(checkpoint_root)
    if manifest is not None:
        run.record_event("RESUME_SELECTED", f"{attempt_id} resumes from step {manifest.step} ({manifest.manifest_id})")
        return
    point = framework.prepare_resume(failed_loading=failed_loading)
    for event_type, message in point.events:
        run.record_event(event_type, f"{attempt_id}: {message}")
    chosen = point.checkpoint
    if chosen is None:
        run.record_event("RESUME_SELECTED", f"{attempt_id} starts at step 0 (no valid checkpoint)")
    elif chosen.step is None:
        run.record_event("RESUME_SELECTED", f"{attempt_id} resumes from the {framework.describe(chosen)}, verified "
                         "(script-managed, step unknown)")
    else:
        run.record_event("RESUME_SELECTED", f"{attempt_id} resumes from {chosen.unit} {chosen.step} "
                         f"({framework.describe(chosen)}, verified: the newest the script's own resume will find)")


_LAST_LINES = 5  # of a failed attempt's log, shown when it names no exception


def _classify_failure(run: Run, handle: LocalLaunchHandle, attempt_id: str, mode: str, *, last_attempt: bool,
                      went_first: ProcessSighting | None = None, processes: int = 0) -> RecoveryDecision:
    """Classify a failed attempt, record the class, the decision and the log lines that show
    the error (for the failure summary), and return the decision. On the last attempt the
    budget allows, a decision to relaunch says that none is left. What Ray reported of an
    attempt it lost (``reported_failure`` of a Ray handle) is its class and evidence.
    ``went_first``: the rank the exit watch saw gone while the others still ran, named first.
    ``processes``: how many the watch saw; an attempt of one process is no group to restart."""
    log_tail = read_log_tail(handle.output_dir / LOG_NAME)
    reported = getattr(handle, "reported_failure", None)
    if reported is not None:
        failure, evidence = reported
    else:
        verdict = judge_exit(handle.exit_code, log_tail, mode)
        failure, evidence = verdict.failure_class, verdict.evidence
    if went_first is not None:
        evidence = f"rank {went_first.rank} (pid {went_first.pid}) exited first; {evidence}"
    decision = decide(failure, mode)
    if processes == 1 and "restart the group" in decision.reason:
        decision = decision.model_copy(update={"reason": decision.reason.replace("restart the group",
                                                                                  "relaunch the command")})
    excerpt = failure_excerpt(log_tail)
    spent = last_attempt and decision.action != "fail_job"
    last_lines = [] if excerpt.exception else [line for line in log_tail.splitlines() if line.strip()][-_LAST_LINES:]
    run.recorder.update_attempt(attempt_id, {"failure": {
        "class": str(failure), "evidence": evidence, "action": str(decision.action), "reason": decision.reason,
        "exception": excerpt.exception, "traceback": list(excerpt.traceback), "rank": excerpt.tag,
        "last_lines": last_lines, "restarts_spent": spent,
        "first_exit": None if went_first is None else {"rank": went_first.rank, "pid": went_first.pid},
    }})
    run.record_event("FAILURE_CLASSIFIED", f"{attempt_id}: {failure} (exit {handle.exit_code}; {evidence})")
    action = f"{attempt_id}: {decision.action} — {decision.reason}"
    if spent:
        action += f"; no restarts left (max_restarts={run.max_restarts})"
    run.record_event("RECOVERY_ACTION_SELECTED", action)
    return decision


def _filesystem_now_ns(directory: Path) -> int:
    """'Now' on the filesystem's own clock (which is coarser than time.time()), so an
    mtime comparison never credits a file written before the attempt started."""
    fd, name = tempfile.mkstemp(prefix=".clock-", dir=directory)
    try:
        return os.fstat(fd).st_mtime_ns
    finally:
        os.close(fd)
        os.unlink(name)


def _start_sampler(handle: LocalLaunchHandle) -> Any:
    if not isinstance(handle, LocalLaunchHandle):
        return None  # an attempt on a Ray node: its processes are not this machine's to sample
    try:
        from flashruntime.monitor import ResourceSampler

        sampler = ResourceSampler(handle.output_dir, int(handle.execution_id))
        sampler.start()
        last_seen = getattr(sampler, "last_seen_pids", None)
        if callable(last_seen):
            handle.extra_pids = last_seen
        return sampler
    except Exception:  # telemetry is best effort
        return None


def _stop_sampler(sampler: Any) -> None:
    try:
        sampler.stop()
    except Exception:
        pass


def _collect_outputs(
    run: Run, source_dir: Path, attempt_dir: Path, started_ns: int, *, attempt_id: str = "",
    view: Path | None = None, shared_writers: bool = False,
) -> None:
    """Copy files matching ``outputs.collect`` that changed since the attempt started, into the
    attempt directory. They are looked for in ``view`` (a trial's working directory) when given,
    else in the source directory, and must lie inside one of the two. A match that is a file of
    the shared source, found through the view while other trials run (``shared_writers``), is
    not credited: any of them may have written it, and the event says how to fix that."""
    collected: list[Path] = []
    source = source_dir.resolve()
    where = (view or source).resolve()
    unattributable: list[str] = []
    for pattern in run.workload.outputs.collect:
        if collect_pattern_problem(pattern) is not None:
            continue  # refused by submit(); only a workload changed since could bring one here
        for match in sorted(where.glob(pattern)):
            try:
                info = match.stat()
                real = match.resolve()
                inside = real.is_relative_to(where) or real.is_relative_to(source)
            except (OSError, RuntimeError):  # RuntimeError: a symlink loop (Python < 3.13)
                continue
            if not inside:
                continue  # a symlink out of the source directory: never copied
            if not match.is_file() or info.st_mtime_ns < started_ns:
                continue  # stale: written before this attempt, never credited
            if view is not None and shared_writers and is_shared(match, view):
                unattributable.append(str(match.relative_to(where)))
                continue
            relative = match.relative_to(where)
            target = attempt_dir / relative
            if target.resolve() == real:
                collected.append(target)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(match, target)
            collected.append(target)
    if unattributable:
        run.record_event("OUTPUT_UNATTRIBUTABLE", (
            f"{attempt_id}: not credited: {', '.join(unattributable)} lies in a directory of the source that every "
            f"trial running at once writes to, so it may be another trial's; have the script write it into "
            f"$FLASHML_OUTPUT_DIR (or its working directory itself), or run the trials one at a time"))
    run.recorder.add_artifacts(collected)


def _framework_figures(run: Run, workdir: Path, handle: Any, attempt_id: str, started_ns: int) -> dict[str, Any] | None:
    """Without a metrics.json: the figures the framework wrote during the attempt (see
    ``flashruntime.monitor.framework_metrics``), with an event naming where they came from."""
    found = final_figures(workdir, handle.output_dir, read_log_tail(handle.output_dir / LOG_NAME), started_ns)
    if found is None:
        return None
    figures, where = found
    run.record_event("METRICS_FOUND", f"{attempt_id}: {len(figures)} figure(s) from {where}")
    return dict(figures)


def _read_metrics(path: Path, started_ns: int) -> dict[str, Any] | None:
    """The attempt's metrics.json, only when written during the attempt (the collection rule)."""
    try:
        if path.stat().st_mtime_ns < started_ns:
            return None  # stale: written before this attempt, never credited
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None

