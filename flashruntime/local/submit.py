"""``flash.submit``: run the user's command locally, collect what it produced, and
recover from failures by the recovery policy (classify -> decide), resuming from
the job-scoped checkpoint directory. No attempt outlives the process driving it:
a terminating signal or the interpreter's exit cancels and settles the runs first.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from flashruntime.checkpoint.local import latest_valid_manifest
from flashruntime.errors import LaunchError
from flashruntime.launchers import LaunchState
from flashruntime.launchers.local import LOG_NAME, LocalLaunchHandle, LocalProcessLauncher, read_log_tail
from flashruntime.local.guard import (
    GUARD,
    Terminated,
    finish_attempt,
    on_main_thread,
    restore_handlers,
    signals_deferred,
    stop_active_attempt,
    track,
    untrack,
    wind_down_and_die,
)
from flashruntime.local.run import Run
from flashruntime.recovery import classify, decide, describe_launch, from_local_launch
from flashruntime.strategies.command import compile_workload
from flashruntime.workloads.command import CommandWorkload, collect_pattern_problem, task_params_problem

__all__ = ["Run", "submit"]


def submit(
    workload: CommandWorkload,
    output_dir: str | Path | None = None,
    wait: bool = True,
    max_restarts: int = 0,
    watch: bool | None = None,
    *,
    checkpoint_dir: str | Path | None = None,
) -> Run:
    """Launch ``workload`` and drive it to a terminal state (inline, or on a thread with ``wait=False``)."""
    if not isinstance(workload, CommandWorkload):
        raise TypeError(f"submit() takes a CommandWorkload, got {type(workload).__name__}")
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"max_restarts must be an integer >= 0, got {max_restarts!r}")
    fan_out = workload.resolved_mode() == "independent_tasks" and bool(workload.task_params)
    if checkpoint_dir is not None and fan_out:
        raise ValueError(
            "checkpoint_dir cannot be combined with a fan-out over task_params: each trial keeps its own "
            "checkpoint tree under output_dir; drop checkpoint_dir or submit one parameter set at a time"
        )
    for pattern in workload.outputs.collect:
        problem = collect_pattern_problem(pattern)
        if problem is not None:  # refused before anything runs, not after the attempt succeeded
            raise ValueError(problem)
    problem = task_params_problem(workload)
    if problem is not None:  # a trial's placeholder it cannot fill: refused here, not as a KeyError mid-run
        raise ValueError(problem)
    if output_dir is None:
        output_dir = tempfile.mkdtemp(prefix="flashruntime-run-")
    output_dir = Path(os.path.expanduser(str(output_dir))).resolve()
    run = Run(workload, output_dir, max_restarts, checkpoint_dir=checkpoint_dir)
    launcher = LocalProcessLauncher(output_dir, checkpoint_dir=checkpoint_dir)
    if _viewer_wanted(watch):
        _start_viewer(run)
    track(run)
    if wait:
        run.recorder.driver = threading.current_thread()
        _drive_inline(run, launcher, fan_out)
    else:
        thread = threading.Thread(target=_drive, args=(run, launcher, fan_out), kwargs={"reraise": False},
                                  name="flashruntime-run", daemon=True)
        run.recorder.driver = thread
        try:
            thread.start()
        except BaseException:
            untrack(run)
            raise
    return run


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


def _drive(run: Run, launcher: LocalProcessLauncher, fan_out: bool, *, reraise: bool) -> None:
    try:
        _drive_all(run, launcher, fan_out)
    except LaunchError as exc:
        run.record_event("LAUNCH_FAILED", str(exc))
        run.recorder.finish(LaunchState.FAILED)
        if reraise:
            raise
    except BaseException as exc:
        # Interrupted (Ctrl-C, a terminating signal), or a bug of ours: either way no
        # attempt may outlive the run, and its row is settled as a cancel() would settle it.
        if not isinstance(exc, Exception):
            run.recorder.request_cancel()  # no relaunch, whatever else is still running
        stopped = stop_active_attempt(run)
        if isinstance(exc, Exception):
            run.record_event("RUN_ERROR", f"run stopped by {type(exc).__name__}: {exc}")
            run.recorder.finish(LaunchState.FAILED)
        else:
            run.recorder.end_cancelled(stopped)
        if reraise:
            raise
    finally:
        untrack(run)


def _drive_inline(run: Run, launcher: LocalProcessLauncher, fan_out: bool) -> None:
    """``wait=True``: drive on this thread. On the main thread a terminating signal
    interrupts the drive like Ctrl-C (the attempt is stopped and settled), then this
    process dies of that signal, as it would have without a run."""
    main = on_main_thread()
    if main:
        GUARD.inline += 1
    interrupted_again = False
    try:
        try:
            _drive(run, launcher, fan_out, reraise=True)
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


def _stopped_attempt(run: Run) -> str | None:
    """The attempt a cancel() stopped: the last one, if it settled CANCELLED. A cancel
    that arrives after the last attempt ended by itself stopped nothing."""
    rows = run.attempts
    if rows and rows[-1]["state"] == str(LaunchState.CANCELLED):
        return str(rows[-1]["attempt_id"])
    return None


def _drive_all(run: Run, launcher: LocalProcessLauncher, fan_out: bool) -> None:
    run.recorder.set_state(LaunchState.RUNNING)
    workload = run.workload
    source_dir = Path(os.path.expanduser(workload.source.path))
    mode = "independent_tasks" if fan_out else "coordinated_training"
    param_sets: list[dict[str, Any] | None] = list(workload.task_params or []) if fan_out else [None]
    all_succeeded = True
    for index, params in enumerate(param_sets):
        base_id = f"task-{index:03d}"
        job_id = f"local-{index:03d}" if fan_out else "local"
        spec = compile_workload(workload, params)
        outcome, metrics = _run_param_set(run, launcher, spec, job_id, base_id, mode, source_dir, params, fan_out)
        if metrics is not None:
            run.recorder.add_trial(metrics)
        if run.cancel_requested:
            break
        all_succeeded = all_succeeded and outcome is LaunchState.SUCCEEDED
    if run.cancel_requested:
        run.recorder.end_cancelled(_stopped_attempt(run))
    else:
        run.recorder.finish(LaunchState.SUCCEEDED if all_succeeded else LaunchState.FAILED)


def _run_param_set(
    run: Run,
    launcher: LocalProcessLauncher,
    spec: Any,
    job_id: str,
    base_id: str,
    mode: str,
    source_dir: Path,
    params: dict[str, Any] | None,
    fan_out: bool,
) -> tuple[LaunchState, dict[str, Any] | None]:
    metrics: dict[str, Any] | None = None
    state = LaunchState.FAILED
    for restart in range(run.max_restarts + 1):
        if run.cancel_requested:
            break
        attempt_id = base_id if restart == 0 else f"{base_id}-r{restart}"
        if restart >= 1:
            manifest = latest_valid_manifest(launcher.checkpoint_root(job_id))
            run.record_event(
                "RESUME_SELECTED",
                f"{attempt_id} resumes from step {manifest.step} ({manifest.manifest_id})" if manifest
                else f"{attempt_id} starts at step 0 (no valid checkpoint)",
            )
        started_ns = _filesystem_now_ns(run.output_dir)
        # A terminating signal waits until the attempt has its handle and its row; the run's lock,
        # held throughout, makes a cancel on another thread wait for the handle too.
        with run.recorder.lock, signals_deferred():
            handle = launcher.launch(spec, job_id, attempt_id)
            run.recorder.set_active(handle, attempt_id)
            launched = f"{attempt_id} launched (pid {handle.execution_id})"
            if handle.previous_dir is not None:
                launched += f"; an earlier run's {attempt_id}/ was moved to {handle.previous_dir.name}/"
            run.record_event("LAUNCH_STARTED", launched)
            run.recorder.add_attempt({
                "attempt_id": attempt_id, "job_id": job_id, "state": "RUNNING", "pid": handle.execution_id,
                "started_at": time.time(), "finished_at": None, "output_dir": str(handle.output_dir),
                "exit_code": None,
            })
        sampler = _start_sampler(handle)
        if run.cancel_requested:  # cancel() raced the launch: it could not see this handle
            handle.cancel()
        try:
            state = handle.wait()
        finally:  # on an interrupt the attempt stays active: _drive stops and settles it
            if sampler is not None:
                _stop_sampler(sampler)
        finish_attempt(run, handle, attempt_id, state)
        _collect_outputs(run, source_dir, handle.output_dir, started_ns)
        candidate = _read_metrics(handle.output_dir / "metrics.json", started_ns)
        if candidate is not None:
            if fan_out and params is not None:
                candidate.setdefault("params", params)
            metrics = candidate
        if state is not LaunchState.FAILED:
            break
        log_tail = read_log_tail(handle.output_dir / LOG_NAME)
        failure = classify(from_local_launch(handle.exit_code, log_tail))
        decision = decide(failure, mode)
        run.record_event(
            "FAILURE_CLASSIFIED",
            f"{attempt_id}: {failure} (exit {handle.exit_code}; {describe_launch(handle.exit_code, log_tail)})",
        )
        run.record_event("RECOVERY_ACTION_SELECTED", f"{attempt_id}: {decision.action} — {decision.reason}")
        if decision.action == "fail_job":
            break
    return state, metrics


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


def _collect_outputs(run: Run, source_dir: Path, attempt_dir: Path, started_ns: int) -> None:
    """Copy files matching ``outputs.collect`` that changed since the attempt started.
    Only files inside the source directory are collected, into the attempt directory."""
    collected: list[Path] = []
    source = source_dir.resolve()
    for pattern in run.workload.outputs.collect:
        if collect_pattern_problem(pattern) is not None:
            continue  # refused by submit(); only a workload changed since could bring one here
        for match in sorted(source.glob(pattern)):
            try:
                info = match.stat()
                inside = match.resolve().is_relative_to(source)
            except (OSError, RuntimeError):  # RuntimeError: a symlink loop (Python < 3.13)
                continue
            if not inside:
                continue  # a symlink out of the source directory: never copied
            if not match.is_file() or info.st_mtime_ns < started_ns:
                continue  # stale: written before this attempt, never credited
            relative = match.relative_to(source)
            target = attempt_dir / relative
            if target.resolve() == match.resolve():
                collected.append(target)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(match, target)
            collected.append(target)
    run.recorder.add_artifacts(collected)


def _read_metrics(path: Path, started_ns: int) -> dict[str, Any] | None:
    """The attempt's metrics.json, only when written during the attempt (the collection rule)."""
    try:
        if path.stat().st_mtime_ns < started_ns:
            return None  # stale: written before this attempt, never credited
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None

