"""``Run``: the live record of one ``flash.submit`` — state, attempts, events, trials —
mirrored to ``run.json`` (contract ``viewer_v1``) after every change.

One lock guards the state, the event log, the attempt rows and the file write, so
``run.json`` is always a consistent snapshot; it is replaced atomically.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flashruntime.files import write_atomic
from flashruntime.launchers import LaunchState

if TYPE_CHECKING:
    from flashruntime.launchers import LaunchHandle
    from flashruntime.workloads.command import CommandWorkload

__all__ = ["Run"]

RUN_JSON = "run.json"
CONTRACT = "viewer_v1"


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
        self.max_restarts = max_restarts
        # Absolute, as the launcher resolves it: run.json is read from other working directories (the viewer).
        self.checkpoint_dir = None if checkpoint_dir is None else Path(os.path.expanduser(str(checkpoint_dir))).resolve()
        self.state = LaunchState.PENDING
        self.trials: list[dict[str, Any]] = []
        self.artifacts: list[Path] = []
        self.viewer_url: str | None = None
        self.started_at = time.time()
        self.finished_at: float | None = None
        self._events: list[dict[str, Any]] = []
        self._attempts: list[dict[str, Any]] = []
        self._log_blocks: list[str] = []
        self._lock = threading.RLock()
        self._done = threading.Event()
        self._cancel_requested = threading.Event()
        self._active_handle: LaunchHandle | None = None
        self._active_attempt: str | None = None
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
        if self._active_handle is not None and self._active_attempt is not None:
            blocks.append(f"--- {self._active_attempt} (RUNNING) ---\n{self._active_handle.logs(tail_lines)}")
        lines = "\n".join(blocks).splitlines()
        return "\n".join(lines[-tail_lines:]) if tail_lines > 0 else ""

    def best_trial(self, metric: str | None = None, maximize: bool | None = None) -> dict[str, Any] | None:
        metric = metric or self.workload.outputs.primary_metric
        if metric is None:
            raise ValueError(
                "best_trial needs a metric: pass best_trial(metric='accuracy') or set "
                "OutputSpec(primary_metric=...)"
            )
        maximize = self.workload.outputs.maximize if maximize is None else maximize
        scored = [t for t in self.trials if isinstance(t.get(metric), (int, float)) and not isinstance(t.get(metric), bool)]
        if not scored:
            return None
        return (max if maximize else min)(scored, key=lambda t: t[metric])

    def wait(self, timeout: float | None = None) -> LaunchState:
        self._done.wait(timeout)
        return self.state

    # --- mutation ---------------------------------------------------------
    def record_event(self, type: str, message: str) -> None:
        with self._lock:
            self._events.append(_event(type, message))
            self._write()

    def cancel(self) -> None:
        """Stop the running attempt (its process group and every rank) and every later restart."""
        with self._lock:
            if self.state.terminal:
                return
            self._cancel_requested.set()
            handle, attempt = self._active_handle, self._active_attempt
            driving = self._driver is not None and self._driver.is_alive()
        if handle is not None:
            handle.cancel()
        if driving and threading.current_thread() is not self._driver:
            return  # the drive loop settles the attempt, records RUN_CANCELLED and ends the run
        # Named only when this cancel stopped it, not when it had already ended by itself.
        stopped = handle is not None and handle.poll() in (LaunchState.CANCELLED, LaunchState.RUNNING)
        self._end_cancelled(attempt if stopped else None)

    def _end_cancelled(self, attempt: str | None) -> None:
        """Record RUN_CANCELLED (naming the attempt that was stopped) and end CANCELLED, unless
        the run has ended already (the drive loop and the signal guard may both get here)."""
        message = f"run cancelled ({attempt} stopped)" if attempt else "run cancelled"
        self._finish(LaunchState.CANCELLED, _event("RUN_CANCELLED", message))

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
                self._done.set()

    def _set_active(self, handle: LaunchHandle | None, attempt: str | None) -> None:
        with self._lock:
            self._active_handle, self._active_attempt = handle, attempt

    def _add_attempt(self, row: dict[str, Any]) -> None:
        with self._lock:
            self._attempts.append(row)
            self._write()

    def _record_attempt_end(
        self, attempt_id: str, log_block: str, changes: dict[str, Any], event: dict[str, Any]
    ) -> bool:
        """Settle the active attempt: its row, log block and event, and it stops being the
        active one. In memory first, then one write, so an interrupt can neither leave it
        half recorded nor have it recorded twice. False when ``attempt_id`` is not the
        active attempt (recorded already)."""
        with self._lock:
            if self._active_attempt != attempt_id:
                return False
            self._log_blocks.append(log_block)
            for row in self._attempts:
                if row["attempt_id"] == attempt_id:
                    row.update(changes)
            self._events.append(event)
            self._active_handle, self._active_attempt = None, None
            self._write()
        return True

    def _add_trial(self, trial: dict[str, Any]) -> None:
        with self._lock:
            self.trials.append(trial)
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
            "attempts": self._attempts,
            "events": self._events,
            "trials": self.trials,
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
    def active(self) -> tuple[LaunchHandle | None, str | None]:
        """The attempt in flight: its handle and id, or (None, None)."""
        return self._run._active_handle, self._run._active_attempt

    def request_cancel(self) -> None:
        """No further relaunch, whatever else still runs."""
        self._run._cancel_requested.set()

    def set_active(self, handle: LaunchHandle | None, attempt: str | None) -> None:
        self._run._set_active(handle, attempt)

    def set_state(self, state: LaunchState) -> None:
        self._run._set_state(state)

    def finish(self, state: LaunchState, event: dict[str, Any] | None = None) -> None:
        self._run._finish(state, event)

    def end_cancelled(self, attempt: str | None) -> None:
        self._run._end_cancelled(attempt)

    def add_attempt(self, row: dict[str, Any]) -> None:
        self._run._add_attempt(row)

    def record_attempt_end(self, attempt_id: str, log_block: str, changes: dict[str, Any],
                           event: dict[str, Any]) -> bool:
        return self._run._record_attempt_end(attempt_id, log_block, changes, event)

    def add_trial(self, trial: dict[str, Any]) -> None:
        self._run._add_trial(trial)

    def add_artifacts(self, paths: list[Path]) -> None:
        self._run._add_artifacts(paths)

    def write(self) -> None:
        """Write ``run.json`` again (the caller holds ``lock``)."""
        self._run._write()
