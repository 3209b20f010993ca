"""A sweep's trials: handed out to up to ``max_concurrent_trials`` threads, each trial in its
own working directory (``flashruntime.local.trial_workdir``) with its own restarts, stopped
at the first failure with ``fail_fast``.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flashruntime.errors import LaunchError
from flashruntime.launchers import LaunchState
from flashruntime.launchers.local import LocalProcessLauncher
from flashruntime.local.attempts import run_param_set
from flashruntime.local.run import Run, trial_id
from flashruntime.local.trial_workdir import WORKDIR_NAME, link_source_view
from flashruntime.recovery.policy import INDEPENDENT
from flashruntime.strategies.command import compile_workload
from flashruntime.workloads.ranking import mode_reason

__all__ = ["Sweep", "run_sweep"]


@dataclass(frozen=True)
class Sweep:
    """How the trials of a fan-out are run."""

    max_concurrent_trials: int = 1
    fail_fast: bool = False
    mode: str | None = None  # as given to submit(); None: the rule of flashruntime.workloads.ranking


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


def run_sweep(run: Run, launcher: LocalProcessLauncher, sweep: Sweep) -> bool:
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
    outcome, metrics = run_param_set(run, launcher, spec, trial, f"task-{index:03d}", INDEPENDENT, params,
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

