"""``Run``: the live record of one ``flash.submit`` — state, attempts, events, trials and,
for a sweep, its table — mirrored to ``run.json`` (contract ``viewer_v1``) after every change.

One lock guards the state, the event log, the attempt rows, the sweep table and the file
write, so ``run.json`` is always a consistent snapshot; it is replaced atomically. Several
attempts may be in flight at once (a sweep's trials side by side); a cancel stops them all.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flashruntime.files import write_atomic
from flashruntime.goodput.run import GoodputLedger, ledger_of_run
from flashruntime.launchers import LaunchState
from flashruntime.local.failure_summary import render_failure_summary
from flashruntime.recovery.budget import RestartBudget
from flashruntime.workloads.ranking import resolve_mode

if TYPE_CHECKING:
    from flashruntime.launchers import LaunchHandle
    from flashruntime.local.elastic import Capacity
    from flashruntime.workloads.command import CommandWorkload

__all__ = ["Run", "metric_value", "trial_id", "trial_rows"]

RUN_JSON = "run.json"
CONTRACT = "viewer_v1"


def trial_id(index: int) -> str:
    """A sweep trial's id: its job id, the directory its attempts and checkpoints live in."""
    return f"local-{index:03d}"


def metric_value(metrics: dict[str, Any], metric: str) -> float | None:
    """``metrics[metric]`` when it is a number (not a bool, not NaN), else None."""
    value = metrics.get(metric)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return None
    return float(value)


def _event(type: str, message: str) -> dict[str, Any]:
    return {"ts": time.time(), "type": str(type), "message": message}


class Run:
    def __init__(
        self,
        workload: CommandWorkload,
        output_dir: str | Path,
        max_restarts: int = 0,
        *,
        checkpoint_dir: str | Path | None = None,
    ) -> None:
        self.workload = workload
        self.output_dir = Path(output_dir)
        self.budget = RestartBudget(max_restarts)
        # Absolute, as the launcher resolves it: run.json is read from other working directories (the viewer).
        self.checkpoint_dir = None if checkpoint_dir is None else Path(os.path.expanduser(str(checkpoint_dir))).resolve()
        self.state = LaunchState.PENDING
        self.trials: list[dict[str, Any]] = []
        self.artifacts: list[Path] = []
        self.viewer_url: str | None = None
        self.started_at = time.time()
        self.finished_at: float | None = None
        # Globs (relative to the working directory) of checkpoints the script keeps itself, beyond
        # the layouts recognised anyway (see flashruntime.checkpoint.frameworks).
        self.checkpoint_patterns: list[str] = []
        # Seconds without progress that make a hang (None: the default rule; 0: no hang watch).
        self.hang_timeout_s: float | None = None
        # An elastic run's ranks (submit(ranks=(min, max))): what each relaunch can have.
        self.capacity: Capacity | None = None
        self.metric: str | None = workload.outputs.primary_metric
        self.mode: str = resolve_mode(self.metric, None, workload.outputs.maximize_if_set())
        self._events: list[dict[str, Any]] = []
        self._attempts: list[dict[str, Any]] = []
        self._log_blocks: list[str] = []
        self._sweep: dict[str, Any] | None = None
        self._chaos: dict[str, Any] | None = None
        self._trial_slots: dict[int, dict[str, Any]] = {}
        self._lock = threading.RLock()
        self._done = threading.Event()
        self._cancel_requested = threading.Event()
        self._active: dict[str, LaunchHandle] = {}  # attempt id -> handle, of the attempts in flight
        self._on_end: list[Callable[[], None]] = []
        self._driver: threading.Thread | None = None
        self.recorder = RunRecorder(self)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self._write()

    # --- views ------------------------------------------------------------
    @property
    def run_json_path(self) -> Path:
        return self.output_dir / RUN_JSON

    @property
    def events(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(e) for e in self._events]

    @property
    def attempts(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(a) for a in self._attempts]

    def logs(self, tail_lines: int = 200) -> str:
        with self._lock:
            blocks = list(self._log_blocks)
            active = list(self._active.items())
        for attempt_id, handle in active:
            blocks.append(f"--- {attempt_id} (RUNNING) ---\n{handle.logs(tail_lines)}")
        lines = "\n".join(blocks).splitlines()
        return "\n".join(lines[-tail_lines:]) if tail_lines > 0 else ""

    def best_trial(self, metric: str | None = None, maximize: bool | None = None) -> dict[str, Any] | None:
        """The trial (its metrics.json, with ``params``) with the best ``metric``: by default the
        run's metric and mode (``submit(metric=, mode=)``, else ``OutputSpec``, else the rule of
        ``flashruntime.workloads.ranking``: a cost such as ``loss`` is minimised). None when no
        trial reported the metric as a number."""
        metric = metric or self.metric
        if metric is None:
            raise ValueError(
                "best_trial needs a metric: pass best_trial(metric='accuracy'), submit(..., metric='accuracy') "
                "or set OutputSpec(primary_metric=...)"
            )
        if maximize is None:
            maximize = (self.mode if metric == self.metric else resolve_mode(metric)) == "max"
        scored = [t for t in self.trials if metric_value(t, metric) is not None]
        if not scored:
            return None
        return (max if maximize else min)(scored, key=lambda t: t[metric])

    @property
    def sweep(self) -> dict[str, Any] | None:
        """The sweep's table when the run fans out over ``task_params`` (None otherwise): metric,
        mode, ``best_trial_id`` and one row per trial, in trial order (see ``trial_table``)."""
        with self._lock:
            return json.loads(json.dumps(self._sweep, default=str)) if self._sweep is not None else None

    def trial_table(self) -> list[dict[str, Any]]:
        """One row per trial of a sweep, best first when the metric is known (trials without
        it after, in trial order): ``trial_id``, ``index``, ``params``, ``state``, ``metric``
        (its value or None), ``duration_s``, ``attempts``, ``best``. Empty for a single command."""
        return trial_rows(self.sweep)

    def goodput(self) -> GoodputLedger:
        """The run's goodput ledger so far (see ``flashruntime.goodput.run``)."""
        return ledger_of_run(self.output_dir, now=time.time())

    def failure_summary(self) -> str | None:
        """What went wrong, for a run that ended FAILED (None otherwise): for each failed
        trial (the command, for a single one), its last attempt, the failure class, the
        recovery policy's decision with its reason, the exception line and the last lines of
        its traceback, and the attempt's log file."""
        with self._lock:
            if self.state is not LaunchState.FAILED:
                return None
            attempts = [dict(row) for row in self._attempts]
            events = list(self._events)
            sweep = json.loads(json.dumps(self._sweep, default=str)) if self._sweep is not None else None
        return render_failure_summary(attempts, events, sweep, self.budget)

    @property
    def max_restarts(self) -> int:
        return self.budget.max_restarts

    def wait(self, timeout: float | None = None) -> LaunchState:
        self._done.wait(timeout)
        return self.state

    # --- mutation ---------------------------------------------------------
    def record_event(self, type: str, message: str) -> None:
        with self._lock:
            self._events.append(_event(type, message))
            self._write()

    def cancel(self) -> None:
        """Stop the running attempts (each one's process group and every rank) and every later
        restart and trial."""
        with self._lock:
            if self.state.terminal:
                return
            self._cancel_requested.set()
            active = list(self._active.items())
            driving = self._driver is not None and self._driver.is_alive()
        for _attempt_id, handle in active:
            handle.cancel()
        if driving and threading.current_thread() is not self._driver:
            return  # the drive loop settles the attempts, records RUN_CANCELLED and ends the run
        # Named only when this cancel stopped them, not when they had already ended by themselves.
        stopped = [attempt_id for attempt_id, handle in active
                   if handle.poll() in (LaunchState.CANCELLED, LaunchState.RUNNING)]
        self._end_cancelled(stopped)

    def _end_cancelled(self, attempts: list[str]) -> None:
        """Record RUN_CANCELLED (naming the attempts that were stopped) and end CANCELLED, unless
        the run has ended already (the drive loop and the signal guard may both get here)."""
        with self._lock:  # an attempt settled CANCELLED was stopped by a cancel, whoever settled it
            settled = [str(row["attempt_id"]) for row in self._attempts if row["state"] == str(LaunchState.CANCELLED)]
            preempted = {str(row["attempt_id"]): (row.get("preempted") or {}).get("saved_step")
                         for row in self._attempts if row["state"] == "PREEMPTED"}
            self._settle_trials(LaunchState.CANCELLED)
        attempts = list(dict.fromkeys([*attempts, *settled]))
        if preempted:  # still CANCELLED: stopped from outside, and a re-run continues it
            saved = [f"{a} saved step {step}" if step is not None else f"{a} stopped" for a, step in preempted.items()]
            self._finish(LaunchState.CANCELLED, _event("RUN_PREEMPTED", f"run preempted ({'; '.join(saved)})"))
            return
        message = f"run cancelled ({', '.join(attempts)} stopped)" if attempts else "run cancelled"
        self._finish(LaunchState.CANCELLED, _event("RUN_CANCELLED", message))

    def _settle_trials(self, state: LaunchState) -> None:
        """A sweep's trials still PENDING or RUNNING when the run ends (the guard ends it while
        their threads are still recording) end ``state``: no attempt of theirs is left running."""
        if self._sweep is None:
            return
        for trial in self._sweep["trials"]:
            if trial["state"] in (str(LaunchState.PENDING), str(LaunchState.RUNNING)):
                trial["state"] = str(state)
                trial["finished_at"] = trial["finished_at"] or time.time()

    @property
    def cancel_requested(self) -> bool:
        return self._cancel_requested.is_set()

    def _set_state(self, state: LaunchState) -> None:
        with self._lock:
            if not self.state.terminal:
                self.state = state
                self._write()

    def _finish(self, state: LaunchState, event: dict[str, Any] | None = None) -> None:
        """End the run (with its last event, if any) unless it has ended: in memory first,
        then one write, so an interrupt during the write neither loses nor repeats it."""
        with self._lock:
            if self.state.terminal:
                return
            if event is not None:
                self._events.append(event)
            self.state = state
            self.finished_at = time.time()
            try:
                self._write()
            finally:
                try:
                    for callback in self._on_end:
                        callback()  # e.g. the live output's last lines, before wait() returns
                finally:
                    self._done.set()

    def _add_active(self, attempt_id: str, handle: LaunchHandle) -> None:
        with self._lock:
            self._active[attempt_id] = handle

    def _add_attempt(self, row: dict[str, Any]) -> None:
        with self._lock:
            self._attempts.append(row)
            self._write()

    def _record_attempt_end(
        self, attempt_id: str, log_block: str, changes: dict[str, Any], event: dict[str, Any] | list[dict[str, Any]]
    ) -> bool:
        """Settle the active attempt: its row, log block and event, and it stops being the
        active one. In memory first, then one write, so an interrupt can neither leave it
        half recorded nor have it recorded twice. False when ``attempt_id`` is not the
        active attempt (recorded already)."""
        with self._lock:
            if attempt_id not in self._active:
                return False
            self._log_blocks.append(log_block)
            for row in self._attempts:
                if row["attempt_id"] == attempt_id:
                    row.update(changes)
            self._events.extend(event if isinstance(event, list) else [event])
            del self._active[attempt_id]
            self._write()
        return True

    def _update_attempt(self, attempt_id: str, changes: dict[str, Any]) -> None:
        with self._lock:
            for row in self._attempts:
                if row["attempt_id"] == attempt_id:
                    row.update(changes)
            self._write()

    def _add_trial(self, trial: dict[str, Any], index: int | None = None) -> None:
        """A param set's metrics: ``run.trials`` stays in trial order, whatever order the
        trials finish in."""
        with self._lock:
            self._trial_slots[len(self._trial_slots) if index is None else index] = trial
            self.trials[:] = [self._trial_slots[i] for i in sorted(self._trial_slots)]
            self._write()

    def _start_sweep(self, param_sets: list[dict[str, Any]], max_concurrent_trials: int, fail_fast: bool) -> None:
        with self._lock:
            self._sweep = {
                "metric": self.metric, "mode": self.mode, "max_concurrent_trials": max_concurrent_trials,
                "fail_fast": fail_fast, "best_trial_id": None,
                "trials": [
                    {"trial_id": trial_id(index), "index": index, "params": params, "state": str(LaunchState.PENDING),
                     "attempt_ids": [], "started_at": None, "finished_at": None, "metric": None, "metrics": None}
                    for index, params in enumerate(param_sets)
                ],
            }
            self._write()

    def _set_chaos(self, chaos: dict[str, Any]) -> None:
        with self._lock:
            self._chaos = chaos
            self._write()

    def _add_chaos_injection(self, injection: dict[str, Any]) -> None:
        with self._lock:
            if self._chaos is not None:
                self._chaos["injected"].append(injection)
                self._write()

    def _update_trial(self, index: int, changes: dict[str, Any], attempt_id: str | None = None) -> None:
        with self._lock:
            if self._sweep is None:
                return
            trial = self._sweep["trials"][index]
            trial.update(changes)
            if attempt_id is not None:
                trial["attempt_ids"].append(attempt_id)
            if "metrics" in changes:
                trial["metric"] = None if self.metric is None else metric_value(trial["metrics"] or {}, self.metric)
                scored = [t for t in self._sweep["trials"] if t["metric"] is not None]
                pick = max if self.mode == "max" else min
                self._sweep["best_trial_id"] = pick(scored, key=lambda t: t["metric"])["trial_id"] if scored else None
            self._write()

    def _add_artifacts(self, paths: list[Path]) -> None:
        with self._lock:
            self.artifacts.extend(paths)

    def _document(self) -> dict[str, Any]:
        return {
            "contract": CONTRACT,
            "workload": {
                "command": self.workload.argv(),
                "mode": self.workload.resolved_mode(),
                "source": str(Path(os.path.expanduser(self.workload.source.path)).resolve()),
            },
            "state": str(self.state),
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "max_restarts": self.max_restarts,
            "checkpoint_dir": None if self.checkpoint_dir is None else str(self.checkpoint_dir),
            "ranks": None if self.capacity is None else [self.capacity.ranks.minimum, self.capacity.ranks.maximum],
            "attempts": self._attempts,
            "events": self._events,
            "trials": self.trials,
            "sweep": self._sweep,
            "chaos": self._chaos,
        }

    def _write(self) -> None:
        # Caller holds the lock (or is the constructor). Readers never see half a file.
        write_atomic(self.run_json_path, json.dumps(self._document(), indent=1, default=str))


class RunRecorder:
    """What the code driving a ``Run`` changes of it (``run.recorder``): its state, its
    attempts, trials and events, the attempt in flight, and ``run.json``. Scripts read a
    ``Run``; only ``flashruntime.local`` drives one. Every change is made in memory first,
    then written once, under the run's lock."""

    __slots__ = ("_run",)

    def __init__(self, run: Run) -> None:
        self._run = run

    @property
    def lock(self) -> threading.RLock:
        return self._run._lock

    @property
    def done(self) -> threading.Event:
        """Set once the run has ended."""
        return self._run._done

    @property
    def driver(self) -> threading.Thread | None:
        """The thread running the drive loop."""
        return self._run._driver

    @driver.setter
    def driver(self, thread: threading.Thread | None) -> None:
        self._run._driver = thread

    @property
    def active(self) -> list[tuple[str, LaunchHandle]]:
        """The attempts in flight: (attempt id, handle), in launch order."""
        with self._run._lock:
            return list(self._run._active.items())

    def request_cancel(self) -> None:
        """No further relaunch, whatever else still runs."""
        self._run._cancel_requested.set()

    def add_active(self, attempt_id: str, handle: LaunchHandle) -> None:
        """``attempt_id`` is in flight until ``record_attempt_end`` settles it."""
        self._run._add_active(attempt_id, handle)

    def on_end(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when the run ends, after run.json is written, before ``wait()`` returns."""
        with self._run._lock:
            self._run._on_end.append(callback)

    def set_metric(self, metric: str | None, mode: str) -> None:
        with self._run._lock:
            self._run.metric, self._run.mode = metric, mode
            self._run._write()

    def start_sweep(self, param_sets: list[dict[str, Any]], max_concurrent_trials: int, fail_fast: bool) -> None:
        """The run fans out over ``param_sets``: one PENDING trial row each."""
        self._run._start_sweep(param_sets, max_concurrent_trials, fail_fast)

    def update_trial(self, index: int, changes: dict[str, Any], attempt_id: str | None = None) -> None:
        """Change trial ``index``'s row (and the best trial, when ``metrics`` changes); add ``attempt_id``."""
        self._run._update_trial(index, changes, attempt_id)

    def update_attempt(self, attempt_id: str, changes: dict[str, Any]) -> None:
        self._run._update_attempt(attempt_id, changes)

    def set_chaos(self, chaos: dict[str, Any]) -> None:
        """The run injects faults on purpose: ``{"plan", "steps", "injected": []}``."""
        self._run._set_chaos(chaos)

    def add_chaos_injection(self, injection: dict[str, Any]) -> None:
        """One fault injected: ``{"kind", "step", "reached_step", "attempt_id", "ts", "done", "detail"}``."""
        self._run._add_chaos_injection(injection)

    def set_state(self, state: LaunchState) -> None:
        self._run._set_state(state)

    def finish(self, state: LaunchState, event: dict[str, Any] | None = None) -> None:
        self._run._finish(state, event)

    def end_cancelled(self, attempts: list[str]) -> None:
        self._run._end_cancelled(attempts)

    def add_attempt(self, row: dict[str, Any]) -> None:
        self._run._add_attempt(row)

    def record_attempt_end(self, attempt_id: str, log_block: str, changes: dict[str, Any],
                           event: dict[str, Any] | list[dict[str, Any]]) -> bool:
        return self._run._record_attempt_end(attempt_id, log_block, changes, event)

    def add_trial(self, trial: dict[str, Any], index: int | None = None) -> None:
        self._run._add_trial(trial, index)

    def add_artifacts(self, paths: list[Path]) -> None:
        self._run._add_artifacts(paths)

    def write(self) -> None:
        """Write ``run.json`` again (the caller holds ``lock``)."""
        self._run._write()


def trial_rows(sweep: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The rows of ``Run.trial_table`` from a sweep as run.json keeps it (``[]`` without one)."""
    if sweep is None:
        return []
    rows = []
    for trial in sweep["trials"]:
        started, finished = trial.get("started_at"), trial.get("finished_at")
        rows.append({
            "trial_id": trial["trial_id"], "index": trial["index"], "params": trial["params"],
            "state": trial["state"], "metric": trial["metric"],
            "duration_s": None if started is None or finished is None else round(finished - started, 3),
            "attempts": len(trial["attempt_ids"]), "best": trial["trial_id"] == sweep["best_trial_id"],
        })
    sign = -1.0 if sweep["mode"] == "max" else 1.0
    rows.sort(key=lambda r: (r["metric"] is None, 0.0 if r["metric"] is None else sign * r["metric"], r["index"]))
    return rows
