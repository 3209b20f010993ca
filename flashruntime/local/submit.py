"""``flash.submit``: run the user's command locally, collect what it produced, and
recover from failures by the recovery policy (classify -> decide), resuming from
the job-scoped checkpoint directory. A sweep (``task_params``) runs its trials one
after another, or up to ``max_concurrent_trials`` at once, and ranks them by a metric.
No attempt outlives the process driving it: a terminating signal or the interpreter's
exit cancels and settles the runs first. A parameter set's attempts are
``flashruntime.local.attempts``; a sweep's trials, ``flashruntime.local.sweep``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
from pathlib import Path
from typing import Any, TextIO

from flashruntime.errors import InvalidSubmission, LaunchError
from flashruntime.launchers import LaunchState
from flashruntime.launchers.local import LocalProcessLauncher
from flashruntime.local.attempts import run_param_set
from flashruntime.local.chaos import ChaosInjector, ChaosPlan
from flashruntime.local.elastic import Capacity, argv_at, parse_ranks
from flashruntime.local.guard import (
    GUARD,
    Terminated,
    on_main_thread,
    restore_handlers,
    stop_active_attempts,
    track,
    untrack,
    wind_down_and_die,
)
from flashruntime.local.live_output import LiveOutput
from flashruntime.local.run import Run
from flashruntime.local.sweep import Sweep, run_sweep
from flashruntime.local.visible_gpus import VisibleGpus
from flashruntime.monitor.hang_watch import hang_setting
from flashruntime.recovery.policy import COORDINATED
from flashruntime.recovery.preemption import preempt_settings
from flashruntime.run_dirs import new_run_dir
from flashruntime.strategies.command import compile_workload
from flashruntime.trackers.mlflow_runs import MLFLOW_URI_ENV, tracking_problem
from flashruntime.trackers.tensorboard_events import TENSORBOARD_DIR_ENV
from flashruntime.workloads.command import CommandWorkload, collect_pattern_problem, task_params_problem
from flashruntime.workloads.ranking import resolve_mode

__all__ = ["EXECUTORS", "Run", "submit"]

EXECUTORS = ("local", "ray")


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
    tensorboard_dir: str | Path | None = None,
    hang_timeout_s: float | None = None,
    mlflow_uri: str | None = None,
    mlflow_experiment: str | None = None,
    ranks: tuple[int, int] | str | None = None,
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
    ``tensorboard_dir`` (else ``$FLASHML_TENSORBOARD_DIR``): when the run ends, its metrics and
    every trial's are written there as TensorBoard event files, ``<dir>/<run name>[/<trial>]``
    (see ``flashruntime.trackers.tensorboard_events``; needs the ``tensorboard`` extra).
    ``mlflow_uri`` (else ``$MLFLOW_TRACKING_URI``): when the run ends, it is logged to that MLflow
    tracking store, in ``mlflow_experiment`` (else ``$MLFLOW_EXPERIMENT_NAME``, else
    ``flashruntime``): a sweep as a parent run with one child run per trial, else one run, with
    parameters, metric history, final figures and output files (see
    ``flashruntime.trackers.mlflow_runs``; needs the ``mlflow`` extra).
    ``hang_timeout_s``: seconds without progress (heartbeats of ``flashruntime.torch``, else the steps of
    ``metrics.jsonl``, else any output) after which an attempt counts as hung: its ranks' stacks are
    dumped into ``hang-stacks.txt`` in the attempt directory, it is stopped, classified ``hang`` and
    relaunched from the last valid checkpoint (see ``flashruntime.monitor.hang_watch``). Default:
    ``$FLASHML_HANG_TIMEOUT_S``, else ``max(10 x the median step time, 60 s)`` once steps are timed;
    0 turns the watch off.
    ``ranks=(min, max)`` (or ``"MIN:MAX"``; default: ``workload.ranks``) makes the run elastic: each attempt starts with as many
    ranks as are available, up to ``max`` (the command's ``--nproc-per-node`` is set, or a plain
    ``python`` command is started under torchrun), so a rank lost for good costs a relaunch on
    the ranks left, down to ``min``, not the run, and the ranks come back at the next relaunch
    once they are available again; every change is a ``WORLD_SIZE_CHANGED`` event. Checkpoints
    of ``flashruntime.torch`` load at the new size and its loader continues with the samples
    not seen yet (see ``flashruntime.local.elastic``). An elastic sweep runs its trials one at a
    time: ``max_concurrent_trials`` above 1 is refused with ``ranks``.
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
    elastic = parse_ranks(ranks if ranks is not None else workload.ranks)
    if elastic is not None:
        if executor != "local":
            raise InvalidSubmission("ranks=(min, max) relaunches local ranks at another world size; on Ray each "
                                    "attempt is one task: drop ranks, or use executor='local'")
        for params in workload.task_params or [None]:
            argv_at(workload.argv(params), elastic.maximum)  # a command that cannot be resized is refused now
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
    events_dir = _tensorboard_dir(tensorboard_dir)
    tracking = _mlflow_target(mlflow_uri, mlflow_experiment)
    if metric is not None and (not isinstance(metric, str) or not metric.strip()):
        raise InvalidSubmission(f"metric must be the name of a key of metrics.json, e.g. 'loss'; got {metric!r}")
    if mode is not None and mode not in ("min", "max"):
        raise InvalidSubmission(f"mode must be 'min' or 'max', got {mode!r}")
    if chaos is not None and not isinstance(chaos, ChaosPlan):
        raise InvalidSubmission(f"chaos must be a ChaosPlan, got {type(chaos).__name__}")
    if chaos is not None and elastic is None and any(fault.kind == "lose_rank" for fault in chaos.faults):
        raise InvalidSubmission("a lose_rank fault takes a rank's slot away, which only an elastic run can "
                                "continue without: pass ranks=(min, max) too, or use kill_rank")
    if (ledger is None) != (plan_key is None):
        raise InvalidSubmission(
            "ledger and plan_key go together: pass both (plan_key from "
            "flashruntime.profiling.calibration.plan_key(plan_id, family, workers)) or neither"
        )
    if plan_key is not None and (not isinstance(plan_key, str) or not plan_key.strip()):
        raise InvalidSubmission(f"plan_key must be a non-empty string such as 'pl_.../ddp/x2', got {plan_key!r}")
    fan_out = workload.resolved_mode() == "independent_tasks" and bool(workload.task_params)
    # An elastic attempt starts with every slot the machine has free, up to max, and a lost slot is
    # the machine's, not one trial's: trials running at once would each take the same slots (the
    # same GPUs), and splitting the slots between them would make each trial's size hang on when its
    # neighbours happen to relaunch. So an elastic sweep runs its trials one after another.
    if elastic is not None and fan_out and len(workload.task_params or []) > 1 and (max_concurrent_trials or 1) > 1:
        raise InvalidSubmission(
            f"ranks=(min, max) gives each attempt every rank slot of this machine, so the "
            f"{len(workload.task_params or [])} trials of a sweep cannot run {max_concurrent_trials} at once "
            f"(max_concurrent_trials={max_concurrent_trials}, --parallel {max_concurrent_trials}) without sharing "
            "them: run the trials one at a time (max_concurrent_trials=1, or no --parallel), or drop ranks")
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
    try:
        preempt_settings(os.environ)  # what a SIGTERM does is settled before anything runs
    except ValueError as exc:
        raise InvalidSubmission(str(exc)) from None
    hang_timeout = hang_setting(hang_timeout_s, os.environ)
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
    run.hang_timeout_s = hang_timeout
    if elastic is not None:
        run.capacity = Capacity(elastic, gpus=VisibleGpus.of(workload.resources.gpus, workload.env))
    if metric is not None or mode is not None:
        chosen = metric or run.metric
        run.recorder.set_metric(chosen, resolve_mode(chosen, mode, workload.outputs.maximize_if_set()))
    launcher: Any
    if ray_address is not None:  # executor="ray"
        from flashruntime.ray_backend.launcher import RayLauncher, cluster_cpus

        launcher = RayLauncher(ray_address, output_dir, checkpoint_dir=checkpoint_dir,
                               num_gpus=workload.resources.gpus or 0, hang_timeout_s=hang_timeout)
        if max_concurrent_trials is None and fan_out:
            max_concurrent_trials = cluster_cpus(ray_address)
    else:
        launcher = LocalProcessLauncher(output_dir, checkpoint_dir=checkpoint_dir)
    sweep = Sweep(max_concurrent_trials=max_concurrent_trials or 1, fail_fast=bool(fail_fast),
                   mode=mode) if fan_out else None
    if ledger is not None and plan_key is not None:
        key = plan_key
        run.recorder.on_end(lambda: _record_calibration(run, ledger, key))
    if events_dir is not None:
        run.recorder.on_end(lambda: _write_tensorboard(run, events_dir))
    if tracking is not None:
        uri, experiment = tracking
        run.recorder.on_end(lambda: _log_mlflow(run, uri, experiment))
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


def _tensorboard_dir(given: str | Path | None) -> Path | None:
    """Where the run's TensorBoard event files go (``given``, else the environment's), checked
    before the run starts: tensorboard importable, the directory creatable."""
    chosen = given if given is not None else os.environ.get(TENSORBOARD_DIR_ENV) or None
    if chosen is None:
        return None
    if not isinstance(chosen, (str, Path)) or not str(chosen).strip():
        raise InvalidSubmission(f"tensorboard_dir must be a directory path, got {chosen!r}")
    if importlib.util.find_spec("tensorboard") is None:
        raise InvalidSubmission("tensorboard_dir (or FLASHML_TENSORBOARD_DIR) needs tensorboard: pip install "
                                "'flashruntime[tensorboard]' (or pip install tensorboard), or unset it")
    directory = Path(chosen).expanduser()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidSubmission(f"tensorboard_dir {str(directory)!r} cannot be created: {exc.strerror or exc}; "
                                "give a directory this user can write") from None
    return directory


def _write_tensorboard(run: Run, logdir: Path) -> None:
    """Write the ended run's event files, saying where in an event. Never raises: the run has
    ended as it ended, and a tracker that cannot be written does not change that."""
    from flashruntime.trackers.tensorboard_events import write_run_events

    try:
        written = write_run_events(run.output_dir, logdir)
    except Exception as exc:  # noqa: BLE001 - reported as an event, never raised
        run.record_event("TENSORBOARD_FAILED", f"metrics not written to {logdir}: {type(exc).__name__}: {exc}")
        return
    run.record_event("TENSORBOARD_WRITTEN", f"metrics written to {logdir / run.output_dir.name} "
                     f"({len(written)} event director{'y' if len(written) == 1 else 'ies'}): "
                     f"tensorboard --logdir {logdir}")


def _mlflow_target(given: str | None, experiment: str | None) -> tuple[str, str | None] | None:
    """The MLflow tracking URI (``given``, else MLflow's own variable) and experiment the run is
    logged to, checked before the run starts: mlflow importable, a store MLflow opens."""
    uri = given if given is not None else os.environ.get(MLFLOW_URI_ENV) or None
    if uri is None:
        if experiment is not None:
            raise InvalidSubmission(f"mlflow_experiment={experiment!r} names where to log, but there is no "
                                    f"tracking URI: pass mlflow_uri as well (or set {MLFLOW_URI_ENV})")
        return None
    if experiment is not None and (not isinstance(experiment, str) or not experiment.strip()):
        raise InvalidSubmission(f"mlflow_experiment must be an experiment name such as 'flashruntime', "
                                f"got {experiment!r}")
    problem = tracking_problem(uri, "mlflow_uri" if given is not None else MLFLOW_URI_ENV)
    if problem is not None:
        raise InvalidSubmission(problem)
    return str(uri), experiment


def _log_mlflow(run: Run, uri: str, experiment: str | None) -> None:
    """Log the ended run to MLflow, saying where in an event. Never raises: the run has ended
    as it ended, and a tracker that cannot be written to does not change that."""
    from flashruntime.trackers.mlflow_runs import log_run

    try:
        logged = log_run(run.output_dir, uri, experiment)
    except Exception as exc:  # noqa: BLE001 - reported as an event, never raised
        run.record_event("MLFLOW_FAILED", f"not logged to MLflow at {uri}: {type(exc).__name__}: {exc}")
        return
    children = len(logged.run_ids) - (logged.parent_run_id is not None)
    shape = (f"parent run {logged.parent_run_id} with {children} trial run(s)" if logged.parent_run_id
             else f"run {logged.run_ids[0]}")
    skipped = f"; left out: {'; '.join(logged.skipped)}" if logged.skipped else ""
    where = f"; {logged.url}" if logged.url else ""
    run.record_event("MLFLOW_LOGGED", f"logged to MLflow at {uri}, experiment {logged.experiment!r}: "
                     f"{shape}{skipped}{where}")


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


def _drive(run: Run, launcher: LocalProcessLauncher, sweep: Sweep | None, *, reraise: bool) -> None:
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


def _drive_inline(run: Run, launcher: LocalProcessLauncher, sweep: Sweep | None) -> None:
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


def _drive_all(run: Run, launcher: LocalProcessLauncher, sweep: Sweep | None) -> None:
    run.recorder.set_state(LaunchState.RUNNING)
    if sweep is None:
        spec = compile_workload(run.workload, None)
        outcome, metrics = run_param_set(run, launcher, spec, "local", "task-000", COORDINATED, None)
        if metrics is not None:
            run.recorder.add_trial(metrics)
        all_succeeded = outcome is LaunchState.SUCCEEDED
    else:
        all_succeeded = run_sweep(run, launcher, sweep)
    if run.cancel_requested:
        run.recorder.end_cancelled([])  # names the attempts settled CANCELLED
    else:
        run.recorder.finish(LaunchState.SUCCEEDED if all_succeeded else LaunchState.FAILED)

