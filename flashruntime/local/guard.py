"""No attempt outlives the process driving it.

SIGTERM and SIGHUP (timeout, kill, docker stop, a closed terminal) end a process by
default and would leave the attempt, in a session of its own, running unwatched with
run.json saying RUNNING. While this process drives runs, a handler (installed on the
main thread, only over the default action) cancels and settles them first; then the
process dies of the same signal, so its parent sees the status it expects. Runs still
live when the interpreter exits (``wait=False``, then the script ended) are cancelled by
an atexit hook. ``flashruntime.local.submit`` drives the runs; this module only guards them.

A preemption signal (SIGTERM unless ``FLASHML_PREEMPT_SIGNAL`` says otherwise) is that
cancel with a grace: it is forwarded to the attempts' ranks, which get
``FLASHML_PREEMPT_GRACE_S`` to save and end by themselves before what is left is killed,
and each such attempt is recorded PREEMPTED (see ``flashruntime.monitor.preemption``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from flashruntime.launchers import LaunchState
from flashruntime.launchers.local import LocalLaunchHandle
from flashruntime.local.run import Run, _event
from flashruntime.monitor.preemption import PREEMPTED, Notice
from flashruntime.recovery.preemption import PreemptSettings, preempt_settings

__all__ = [
    "GUARD",
    "Terminated",
    "finish_attempt",
    "on_main_thread",
    "preempted",
    "preemption_of",
    "restore_handlers",
    "signals_deferred",
    "stop_active_attempts",
    "track",
    "untrack",
    "wind_down_and_die",
]

_TERMINATING = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))
_SETTLE_TIMEOUT_S = 60.0  # for a drive loop to settle a cancelled run


class Terminated(BaseException):
    """A terminating signal, raised on the main thread while it drives a run inline:
    handled like a KeyboardInterrupt by the drive loop, then the signal is re-raised."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"terminated by signal {signum}")
        self.signum = signum


class _Guard:
    """The runs this process drives and the signal handling around them."""

    def __init__(self) -> None:
        self.installed: set[int] = set()
        self.hooks_registered = False
        self.reset()

    def reset(self) -> None:
        """Also the state of a forked child: it drives nothing (its parent's runs are not
        its own to cancel)."""
        self.pid = os.getpid()  # a handler running in another process (a fork) has no runs
        self.lock = threading.RLock()  # re-entrant: the signal handler may run while it is held
        self.live: list[Run] = []
        self.inline = 0  # inline drives in progress on the main thread
        self.received: int | None = None  # the first terminating signal, once one arrived
        self.pending = False  # it arrived inside a launch window and waits to be raised
        self.local = threading.local()  # .deferred: launch windows open on this thread
        self.settings: PreemptSettings | None = None  # read when the first run is tracked
        self.preemption: Notice | None = None  # once a preemption signal arrived


GUARD = _Guard()


def on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def track(run: Run) -> None:
    with GUARD.lock:
        if GUARD.settings is None:
            GUARD.settings = preempt_settings(os.environ)
        GUARD.live.append(run)
        if not GUARD.hooks_registered:
            atexit.register(_cancel_at_exit)
            if hasattr(os, "register_at_fork"):  # POSIX
                os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                                    after_in_child=_after_fork_in_child)
            GUARD.hooks_registered = True
    if on_main_thread():  # signal.signal works there only
        for signum in dict.fromkeys((*_TERMINATING, *GUARD.settings.signals)):
            if signum not in GUARD.installed and signal.getsignal(signum) is signal.SIG_DFL:
                signal.signal(signum, _on_terminating_signal)
                GUARD.installed.add(signum)


def untrack(run: Run) -> None:
    with GUARD.lock:
        if run in GUARD.live:
            GUARD.live.remove(run)


def restore_handlers() -> None:
    """Back to the default action once nothing is driven (main thread only; a handler
    someone else installed over ours is left alone). Where this never runs (wait=False
    runs), ours stays and acts as the default would once nothing is live."""
    if not on_main_thread():
        return
    with GUARD.lock:
        if GUARD.live:
            return
    for signum in sorted(GUARD.installed):
        if signal.getsignal(signum) is _on_terminating_signal:
            signal.signal(signum, signal.SIG_DFL)
    GUARD.installed.clear()


# A forked child (multiprocessing's default on Linux) drives none of its parent's runs
# and gets the default action back. Our signals are blocked across the fork: CPython
# drops a signal that reaches a child inside fork() while a Python handler is set.
_fork_mask = threading.local()


def _before_fork() -> None:
    signals = set(GUARD.installed)
    _fork_mask.saved = signal.pthread_sigmask(signal.SIG_BLOCK, signals) if signals else None


def _after_fork_in_parent() -> None:
    saved, _fork_mask.saved = getattr(_fork_mask, "saved", None), None
    if saved is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, saved)


def _after_fork_in_child() -> None:
    GUARD.reset()
    try:
        for signum in sorted(GUARD.installed):
            if signal.getsignal(signum) is _on_terminating_signal:
                signal.signal(signum, signal.SIG_DFL)
    finally:  # never leave the child with these signals blocked
        GUARD.installed.clear()
        _after_fork_in_parent()  # lets through what arrived meanwhile, to the default action


def _on_terminating_signal(signum: int, frame: Any) -> None:
    if os.getpid() != GUARD.pid:  # forked without the at-fork hooks (from C): the default action
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    if GUARD.received is not None:
        return  # already winding down: the process dies of the first signal
    GUARD.received = signum
    if GUARD.settings is not None and signum in GUARD.settings.signals:
        GUARD.preemption = Notice(signum, GUARD.settings.grace_s)
    if GUARD.inline:
        if getattr(GUARD.local, "deferred", 0):
            GUARD.pending = True  # raised at the end of the deferred section
            return
        raise Terminated(signum)
    wind_down_and_die(signum)


def wind_down_and_die(signum: int, current: Run | None = None, *, hurry: bool = False) -> None:
    """Cancel and settle ``current`` (the run this thread drove, if any) and every live run,
    then die of ``signum``. A second interrupt (a Ctrl-C) during the cancel's grace period,
    or ``hurry``, kills the attempts at once instead: either way nothing is left running."""
    try:
        if not hurry:
            try:
                if current is not None:
                    _settle_interrupted(current)
                _cancel_live_runs()
            except BaseException:
                hurry = True
        if hurry:
            _kill_live_runs(current)
    finally:  # whatever cuts the settling short must not keep the process alive
        _die_of(signum)


def _kill_live_runs(current: Run | None = None) -> None:
    """Kill every live run's attempt without a grace period and settle the runs. Further
    Ctrl-Cs are ignored meanwhile (main thread): the process is on its way out already."""
    if on_main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    with GUARD.lock:
        runs = list(GUARD.live)
    if current is not None and current not in runs:
        runs.insert(0, current)
    for run in runs:
        if run.state.terminal:
            continue
        run.recorder.request_cancel()
        for _attempt_id, handle in run.recorder.active:
            if isinstance(handle, LocalLaunchHandle):
                if GUARD.preemption is not None:
                    GUARD.preemption.killed(handle)
                handle.cancel(grace_s=0)
        _settle_interrupted(run)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """A section a terminating signal does not cut in two (spawning an attempt and recording
    its handle; recording an attempt's end): the signal is raised after it."""
    local = GUARD.local
    local.deferred = getattr(local, "deferred", 0) + 1
    try:
        yield
    finally:
        local.deferred -= 1
    if GUARD.pending and not local.deferred and on_main_thread() and GUARD.received is not None:
        GUARD.pending = False
        raise Terminated(GUARD.received)


def stop_active_attempts(run: Run) -> list[str]:
    """Cancel the attempts still running, if any, and settle them; returns the ids of those
    the cancel stopped (not of those that had already ended by themselves). After a
    preemption signal each first gets the notice and the grace to end by itself."""
    notice = GUARD.preemption
    active = run.recorder.active
    if notice is not None:
        run.recorder.request_cancel()  # the platform takes the machine: no relaunch here
        for attempt_id, handle in active:  # all of them first: their graces run side by side
            _forward(run, notice, attempt_id, handle)
    stopped = []
    for attempt_id, handle in active:
        if notice is not None and notice.reached(handle):
            state = notice.settle(handle)
        else:
            handle.cancel()
            state = handle.poll()
            state = state if state.terminal else LaunchState.CANCELLED
        finish_attempt(run, handle, attempt_id, state)
        if state is LaunchState.CANCELLED or preempted(handle):
            stopped.append(attempt_id)
    return stopped


def _forward(run: Run, notice: Notice, attempt_id: str, handle: Any) -> None:
    """Send the notice to the attempt's ranks, once, and say so."""
    if notice.reached(handle):
        return
    notice.forward(handle)
    if notice.reached(handle):
        told = notice.told(handle)
        whom = "no process" if not told else ", ".join(f"pid {pid}" for pid in told)
        run.record_event("PREEMPTION_NOTICE", f"{attempt_id}: {notice.name} forwarded to {whom}; "
                         f"{notice.remaining():.0f} s to save before what is left is killed")


def preempted(handle: Any) -> bool:
    """Whether the preemption notice this process received reached the attempt of ``handle``:
    it ended for that, not by a failure to classify or a success to credit, and the run ends."""
    return GUARD.preemption is not None and GUARD.preemption.reached(handle)


def preemption_of(handle: Any) -> Notice | None:
    """The notice that reached the attempt of ``handle``: the one this process received, or
    one chaos mode sent its ranks (``handle.chaos_notice``), after which the run goes on."""
    if preempted(handle):
        return GUARD.preemption
    notice = getattr(handle, "chaos_notice", None)
    return notice if isinstance(notice, Notice) and notice.reached(handle) else None


def finish_attempt(run: Run, handle: Any, attempt_id: str, state: LaunchState) -> None:
    """Log block, settled row and ATTEMPT_FINISHED for an attempt that has ended, recorded
    once: by the drive loop, or by the guard when the loop cannot get there. The attempt
    stays the run's active one until all of it is recorded, so an interrupt before that
    leaves it to the guard to record, never half recorded."""
    logs = handle.logs()
    shown = str(state)
    changes: dict[str, Any] = {}
    events = []
    notice = preemption_of(handle)
    if notice is not None:
        shown = PREEMPTED
        wording = {} if notice is GUARD.preemption else {
            "resume_from": "the restart budget is untouched; relaunched to resume from step {step}",
            "resume_newest": "the restart budget is untouched; relaunched to resume from the newest checkpoint"}
        changes["preempted"], message = notice.report(handle, attempt_id, run.checkpoint_dir, **wording)
        events.append(_event("ATTEMPT_PREEMPTED", message))
    with signals_deferred():
        run.recorder.record_attempt_end(
            attempt_id,
            f"--- {attempt_id} ({shown}) ---\n{logs}",
            {**changes, "state": shown, "finished_at": time.time(), "exit_code": handle.exit_code},
            [_event("ATTEMPT_FINISHED", f"{attempt_id} finished {shown} (exit {handle.exit_code})"), *events],
        )


def _settle_interrupted(run: Run) -> None:
    """End, as cancelled, a run its drive loop did not settle, stopping its attempt first.
    Then write run.json once more: the signal may have cut its last write short."""
    if not run.state.terminal:
        run.recorder.request_cancel()
        run.recorder.end_cancelled(stop_active_attempts(run))
    with run.recorder.lock:
        run.recorder.write()


def _cancel_live_runs() -> None:
    """Cancel every run this process still drives and wait until each is settled."""
    with GUARD.lock:
        runs = list(GUARD.live)
    notice = GUARD.preemption
    if notice is not None:
        for run in runs:
            run.recorder.request_cancel()
            for attempt_id, handle in run.recorder.active:
                _forward(run, notice, attempt_id, handle)
        for run in runs:  # the drive loops record the attempts as they end
            for _attempt_id, handle in run.recorder.active:
                if notice.reached(handle):
                    notice.settle(handle)
    for run in runs:
        # Also when a cancel was requested already: this thread may have been interrupted
        # inside that cancel's grace period, which then never ends in a SIGKILL.
        run.cancel()
    deadline = time.monotonic() + _SETTLE_TIMEOUT_S
    for run in runs:
        if run.state.terminal:
            continue
        # This thread may have been interrupted while holding the run's lock (reading
        # run.attempts, say): then the drive loop cannot record anything, so settle here.
        if _holds(run.recorder.lock) or not run.recorder.done.wait(max(0.0, deadline - time.monotonic())):
            _settle_interrupted(run)


def _holds(lock: Any) -> bool:
    """Whether this thread holds ``lock``, an ``RLock`` (``_is_owned`` is what
    ``threading.Condition`` asks it too)."""
    return bool(lock._is_owned())


def _cancel_at_exit() -> None:
    if os.getpid() != GUARD.pid:
        return  # a forked child's exit: the runs are its parent's
    with GUARD.lock:
        live = [run for run in GUARD.live if not run.state.terminal]
    for run in live:
        with contextlib.suppress(AttributeError, OSError, ValueError):  # stderr gone: cancel all the same
            print(f"flashruntime: the interpreter is exiting while the run in {run.output_dir} is still "
                  "running (submit(wait=False)); cancelling it. Call run.wait() to let a run finish.",
                  file=sys.stderr, flush=True)
    try:
        _cancel_live_runs()
    except BaseException:  # a Ctrl-C during the grace period: no grace, but nothing left running
        _kill_live_runs()


def _die_of(signum: int) -> None:
    """End this process as ``signum``'s default action does (a shell sees 128+signum).
    Like that action, it flushes nothing: a flush can block on a full pipe, or raise when
    the signal interrupted a write to the same stream."""
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    # Reached only where the signal is blocked: exit with the status it would have given.
    GUARD.received = None
    raise SystemExit(128 + signum)
