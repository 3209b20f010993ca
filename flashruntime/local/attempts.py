"""One parameter set of a local run, attempt after attempt: launch, watch (resources, the
ranks' exits, the script's own checkpoints, the curves it prints), collect its outputs and
figures, classify a failure by the recovery policy, and choose what the relaunch resumes from.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flashruntime.checkpoint.local import latest_valid_manifest
from flashruntime.launchers import LaunchState
from flashruntime.launchers.local import LOG_NAME, LocalLaunchHandle, LocalProcessLauncher, read_log_tail
from flashruntime.local.elastic import Capacity, ranks_words, size_change, spec_at
from flashruntime.local.framework_resume import CheckpointWatch, FrameworkCheckpoints
from flashruntime.local.guard import (
    finish_attempt,
    preempted,
    preemption_of,
    signals_deferred,
)
from flashruntime.local.output_metrics import OutputMetrics
from flashruntime.local.run import Run
from flashruntime.monitor.straggler_watch import StragglerWatch
from flashruntime.local.trial_workdir import is_shared
from flashruntime.monitor.exits import ExitWatch, ProcessSighting, first_exit
from flashruntime.monitor.framework_metrics import final_figures
from flashruntime.monitor.hang_watch import HangVerdict, HangWatch, ReportedHang
from flashruntime.protocol.v1alpha1 import FailureClass, RecoveryDecision
from flashruntime.recovery import decide, judge_exit
from flashruntime.recovery.signals import failure_excerpt
from flashruntime.workloads.command import collect_pattern_problem

__all__ = ["run_param_set"]


def run_param_set(
    run: Run,
    launcher: LocalProcessLauncher,
    spec: Any,
    job_id: str,
    base_id: str,
    recovery_mode: str,
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

    budget = run.budget
    restart = 0  # relaunches spent
    started = 0  # attempts started: a relaunch after chaos mode's preemption spends no restart
    capacity = run.capacity
    world: int | None = None  # an elastic run's world size, chosen anew for every attempt
    while restart < budget.attempts:
        if halted():
            break
        attempt_id = base_id if started == 0 else f"{base_id}-r{started}"
        if capacity is not None:
            chosen = _elastic_world(run, capacity, attempt_id, world, halted=halted)
            if chosen is None:
                state = LaunchState.FAILED
                break
            world = chosen
        started += 1
        if started > 1:
            _select_resume(run, launcher.checkpoint_root(job_id), attempt_id, framework,
                           failed_loading=failure_class is FailureClass.ARTIFACT_CORRUPTION)
        else:
            _earlier_run_resume(run, launcher.checkpoint_root(job_id), attempt_id)
        started_ns = _filesystem_now_ns(run.output_dir)
        # A terminating signal waits until the attempt has its handle and its row; the run's lock,
        # held throughout, makes a cancel on another thread wait for the handle too.
        with run.recorder.lock, signals_deferred():
            if halted():  # a cancel (or fail-fast) took the lock first: it could not see this attempt
                break
            handle = launcher.launch(spec if capacity is None or world is None
                                     else spec_at(spec, capacity.ranks, world), job_id, attempt_id)
            run.recorder.add_active(attempt_id, handle)
            launched = f"{attempt_id} launched ({getattr(handle, 'launched_as', None) or f'pid {handle.execution_id}'})"
            if handle.previous_dir is not None:
                launched += f"; an earlier run's {attempt_id}/ was moved to {handle.previous_dir.name}/"
            run.record_event("LAUNCH_STARTED", launched)
            run.recorder.add_attempt({
                "attempt_id": attempt_id, "job_id": job_id, "state": "RUNNING", "pid": handle.execution_id,
                "started_at": time.time(), "finished_at": None, "output_dir": str(handle.output_dir),
                "exit_code": None, **({} if world is None else {"world_size": world}),
            })
            if trial_index is not None:
                run.recorder.update_trial(trial_index, {}, attempt_id=attempt_id)
        sampler = _start_sampler(handle)
        exits = ExitWatch(handle.processes).start() if isinstance(handle, LocalLaunchHandle) else None
        hangs = (HangWatch(handle, attempt_id, run.hang_timeout_s, run.record_event).start()
                 if isinstance(handle, LocalLaunchHandle) and run.hang_timeout_s != 0 else None)
        if hasattr(handle, "on_hang"):  # an attempt watched where it runs (a Ray task) reports its detection
            handle.on_hang = lambda words: run.record_event("HANG_DETECTED", words)  # it names the attempt
        saves = CheckpointWatch(framework, run.record_event).start()
        curves = OutputMetrics(handle.output_dir).start()
        stragglers = StragglerWatch(handle.output_dir, attempt_id, run.record_event,
                                    run.recorder.update_attempt).start()
        try:
            try:
                state = handle.wait()
            finally:  # on an interrupt the attempt stays active: _drive stops and settles it
                if sampler is not None:
                    _stop_sampler(sampler)
                sightings = exits.stop() if exits is not None else []
                hang = hangs.stop() if hangs is not None else getattr(handle, "reported_hang", None)
            finish_attempt(run, handle, attempt_id, state)  # first: a cancel arriving now finds it settled
        finally:
            saves.stop()
            curves.stop()
            stragglers.stop()
        _collect_outputs(run, source_dir, handle.output_dir, started_ns, attempt_id=attempt_id, view=view,
                         shared_writers=shared_writers)
        candidate = _read_metrics(handle.output_dir / "metrics.json", started_ns)
        if candidate is None:
            candidate = _framework_figures(run, view or source_dir, handle, attempt_id, started_ns)
        if candidate is not None:
            if params is not None:
                candidate.setdefault("params", params)
            metrics = candidate
        if preempted(handle):
            state = LaunchState.CANCELLED  # stopped from outside; it spends no restart
            break
        if preemption_of(handle) is not None:
            failure_class = None
            continue  # chaos mode's preemption: the machine is back at once; relaunched, no restart spent
        if state is not LaunchState.FAILED:
            break
        went_first = first_exit(sightings, int(handle.execution_id)) if sightings else None
        decision = _classify_failure(run, handle, attempt_id, recovery_mode, restart=restart,
                                     went_first=went_first, processes=len(sightings), hang=hang)
        failure_class = decision.failure_class
        if not budget.relaunches(restart, decision):
            break
        restart += 1
    return state, metrics


_RETURN_GRACE_S = 5.0  # after a lost slot's known return: for the machine to show it again
_WAIT_POLL_S = 0.2


def _elastic_world(run: Run, capacity: Capacity, attempt_id: str, previous: int | None, *,
                   halted: Callable[[], bool] = lambda: False,
                   sleep: Callable[[float], None] = time.sleep) -> int | None:
    """The world size of an elastic run's next attempt: every rank available now, up to the
    most it may have. With fewer than its fewest it waits for lost slots whose return is known
    (up to that return and a little more), else None at once, with the event saying why; None
    too when the run is stopped while it waits. ``sleep``: how it waits (on ``capacity``'s clock)."""
    ranks = capacity.ranks
    found = capacity.now(ranks.minimum)
    waited: float | None = None
    if found.count < ranks.minimum and found.back_in is not None:
        limit = found.back_in + _RETURN_GRACE_S
        run.record_event("WORLD_SIZE_WAITING", (
            f"{attempt_id} waits up to {limit:.0f} s for {ranks_words(ranks.minimum)}: {found.count} available "
            f"({found.why}), and a lost slot returns in {found.back_in:.0f} s"))
        began = capacity.clock()
        while found.count < ranks.minimum and found.back_in is not None and capacity.clock() - began < limit:
            if halted():
                return None
            sleep(min(_WAIT_POLL_S, max(0.0, limit - (capacity.clock() - began))))
            found = capacity.now(ranks.minimum)
        waited = capacity.clock() - began
    if found.count < ranks.minimum:
        after = "" if waited is None else f" after waiting {waited:.0f} s for the lost slot's return"
        run.record_event("WORLD_SIZE_UNAVAILABLE", (
            f"{attempt_id} not launched: {ranks_words(found.count)} available ({found.why or 'no slot free'}){after}, "
            f"fewer than the {ranks.minimum} the run needs at least ({ranks.words()})"))
        return None
    world = min(found.count, ranks.maximum)
    change = size_change(attempt_id, previous, world, ranks.maximum, found.why or "no slot free")
    if change is not None:
        run.record_event("WORLD_SIZE_CHANGED", change)
    return world


def _earlier_run_resume(run: Run, checkpoint_root: Path, attempt_id: str) -> None:
    """A first attempt that finds a verified ``flashruntime.torch`` checkpoint (an earlier run
    with this output directory, preempted or stopped) says it resumes from it; ``prepare``
    restores it."""
    manifest = latest_valid_manifest(checkpoint_root)
    if manifest is not None:
        run.record_event("RESUME_SELECTED", f"{attempt_id} resumes from step {manifest.step} ({manifest.manifest_id}, "
                         "an earlier run's)")


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


def _classify_failure(run: Run, handle: LocalLaunchHandle, attempt_id: str, recovery_mode: str, *, restart: int,
                      went_first: ProcessSighting | None = None, processes: int = 0,
                      hang: HangVerdict | ReportedHang | None = None) -> RecoveryDecision:
    """Classify failed attempt ``restart`` (0: the first), record the class, the decision and
    the log lines that show the error (for the failure summary), and return the decision.
    When the run's restart budget cannot pay for the relaunch it calls for, it says so. What Ray reported of an
    attempt it lost (``reported_failure`` of a Ray handle) is its class and evidence.
    ``went_first``: the rank the exit watch saw gone while the others still ran, named first.
    ``processes``: how many the watch saw; an attempt of one process is no group to restart.
    ``hang``: what the hang watch found before it stopped the attempt: the class and evidence."""
    log_tail = read_log_tail(handle.output_dir / LOG_NAME)
    reported = getattr(handle, "reported_failure", None)
    if hang is not None:  # the ranks' exits are the watch's doing: neither they nor the log say why
        failure, evidence, went_first = FailureClass.HANG, hang.evidence(), None
    elif reported is not None:
        failure, evidence = reported
    else:
        verdict = judge_exit(handle.exit_code, log_tail, recovery_mode)
        failure, evidence = verdict.failure_class, verdict.evidence
    if went_first is not None:
        evidence = f"rank {went_first.rank} (pid {went_first.pid}) exited first; {evidence}"
    decision = decide(failure, recovery_mode)
    if processes == 1 and "restart the group" in decision.reason:
        decision = decision.model_copy(update={"reason": decision.reason.replace("restart the group",
                                                                                  "relaunch the command")})
    # A hung attempt's log ends with what its stop made the ranks print: the stacks say what it was doing.
    excerpt = failure_excerpt("" if hang is not None else log_tail)
    spent = run.budget.spent_by(restart, decision)
    last_lines = [] if excerpt.exception or hang is not None else [
        line for line in log_tail.splitlines() if line.strip()][-_LAST_LINES:]
    run.recorder.update_attempt(attempt_id, {"failure": {
        "class": str(failure), "evidence": evidence, "action": str(decision.action), "reason": decision.reason,
        "exception": excerpt.exception, "traceback": list(excerpt.traceback), "rank": excerpt.tag,
        "last_lines": last_lines, "restarts_spent": spent,
        "first_exit": None if went_first is None else {"rank": went_first.rank, "pid": went_first.pid},
        **({"hang": hang.as_json()} if hang is not None else {}),
    }})
    run.record_event("FAILURE_CLASSIFIED", f"{attempt_id}: {failure} (exit {handle.exit_code}; {evidence})")
    run.record_event("RECOVERY_ACTION_SELECTED",
                     f"{attempt_id}: {run.budget.words(str(decision.action), decision.reason, spent=spent)}")
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

