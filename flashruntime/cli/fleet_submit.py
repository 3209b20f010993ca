"""``flashruntime submit --api URL CMD``: the command run as a command job on the
coordinator's workers instead of here. The source directory goes up first as a tar.gz
input (``flashruntime.workloads.source_archive``) that the worker unpacks and runs the
command in; then the job's task logs stream to the terminal (a sweep's lines prefixed by
their task), the coordinator's recovery events between them, and the run ends with the
same summary, sweep table, best trial and exit code as a local run. Ctrl-C detaches: the
job keeps running, and the message says how to follow or cancel it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from flashruntime.cli.job_output import TERMINAL_STATES, new_text
from flashruntime.cli.jobs import cli_client, coordinator_call
from flashruntime.client import CoordinatorClient
from flashruntime.errors import CommandError, InvalidSubmission
from flashruntime.local.run import metric_value, trial_rows
from flashruntime.protocol.task_logs import last_lines
from flashruntime.workloads.command import CommandWorkload, to_jobspec
from flashruntime.workloads.ranking import mode_reason, resolve_mode

__all__ = ["EXIT_DETACHED", "SOURCE_INPUT", "FleetSweep", "fleet_jobspec", "refused_flags", "submit_to_fleet"]

POLL_S = 1.0
EXIT_FAILED, EXIT_DETACHED = 1, 130  # 130: 128 + SIGINT, as for logs --follow
SOURCE_INPUT = "source"  # the input the source archive arrives as, and the command's working directory
# Task states as a local run names its trials'.
_TRIAL_STATE = {"PENDING": "PENDING", "LEASED": "RUNNING", "COMPLETED": "SUCCEEDED", "FAILED": "FAILED",
                "CANCELLED": "CANCELLED"}
# The coordinator's events a person watching needs, as a local run prints its recovery events.
_EVENTS_SHOWN = frozenset({"TASK_ATTEMPT_FAILED", "FAILURE_CLASSIFIED", "RECOVERY_ACTION_SELECTED", "TASK_EXHAUSTED",
                           "LEASE_EXPIRED", "STRAGGLER_DETECTED", "HANG_DETECTED"})
_TRACKERS = "on the fleet the coordinator logs jobs to its trackers (FLASHML_MLFLOW_URI, set where it is served)"
# (option, dest, value that means "not given", why it cannot be honoured on the fleet)
_LOCAL_ONLY: tuple[tuple[str, str, Any, str], ...] = (
    ("--parallel", "parallel", None, ("on the fleet every trial starts as soon as a worker claims it, so as "
                                      "many run at once as there are free workers")),
    ("--executor", "executor", "local", "the coordinator's workers run the tasks"),
    ("--ray-address", "ray_address", None, "the coordinator's workers run the tasks"),
    ("--checkpoint-glob", "checkpoint_glob", None, "a worker keeps the checkpoints written to $FLASHML_CKPT_DIR"),
    ("--output-dir", "output_dir", None, ("the outputs stay on the coordinator (flashruntime artifacts JOB "
                                          "--download DIR fetches them)")),
    ("--watch", "watch", None, "the coordinator's dashboard shows the job (open the --api URL)"),
    ("--tensorboard", "tensorboard", None, _TRACKERS),
    ("--mlflow", "mlflow", None, _TRACKERS),
    ("--ranks", "ranks", None, ("a coordinator task runs at the size its command gives; elastic relaunches on "
                                "the ranks left are a local run's")),
)


def refused_flags(args: argparse.Namespace) -> str | None:
    """Why a flag given with ``--api`` cannot be honoured on the fleet (naming it), or None (pure)."""
    for option, dest, unset, why in _LOCAL_ONLY:
        value = getattr(args, dest, unset)
        if value != unset and not (option == "--watch" and value is False):  # --no-watch asks for nothing
            return f"{option} is for local runs and cannot be honoured with --api: {why}; drop {option}"
    return None


def _job_name(source: Path) -> str:
    """A DNS-1123 label from the source directory's name."""
    label = re.sub(r"[^a-z0-9-]+", "-", source.resolve().name.lower()).strip("-")[:56].strip("-")
    return f"submit-{label}" if label else "submit"


def fleet_jobspec(workload: CommandWorkload, source_uri: str, *, pool: str | None, max_restarts: int) -> dict[str, Any]:
    """The command job for ``workload``: its source as the unpacked input the command runs in,
    tier ``sandboxed`` (a worker's sandbox runs it), or with ``pool`` the sandbox waiver inside
    that team pool (its ``--runner trusted`` workers run it); each task tried
    ``max_restarts + 1`` times, as a local run relaunches it."""
    if SOURCE_INPUT in workload.inputs:
        raise InvalidSubmission(f"input name {SOURCE_INPUT!r} is the source directory's on the fleet; rename the "
                                "workload's own input")
    spec = to_jobspec(workload, _job_name(Path(workload.source.path).expanduser()))
    parameters = spec.spec.workload.parameters
    parameters["inputs"] = {**parameters["inputs"], SOURCE_INPUT: source_uri}
    parameters["unpack_inputs"] = [SOURCE_INPUT]
    parameters["workdir"] = SOURCE_INPUT
    spec.spec.isolation.tier = "sandboxed"
    if pool is not None:
        spec.spec.isolation.allowFallback = True
        spec.spec.placement.pool = pool
    spec.spec.retryPolicy.maxTaskAttempts = max_restarts + 1
    return spec.model_dump(mode="json")


@dataclass
class FleetSweep:
    """The job's tasks as a local run's trials: the rows ``trial_rows`` ranks, built from the
    coordinator's task rows and each task's metrics.json."""

    param_sets: list[dict[str, Any]]  # one empty set for a single command
    metric: str | None
    mode: str
    fan_out: bool = True
    trials: list[dict[str, Any]] = field(default_factory=list)
    started: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.trials = [{"trial_id": f"task-{index:03d}", "index": index, "params": params, "state": "PENDING",
                        "attempt_ids": [], "started_at": None, "finished_at": None, "metric": None,
                        "metrics": None} for index, params in enumerate(self.param_sets)]

    def update(self, index: int, row: dict[str, Any], now: float, metrics: dict[str, Any] | None) -> None:
        trial = self.trials[index]
        trial["state"] = _TRIAL_STATE.get(str(row.get("state")), str(row.get("state")))
        trial["attempt_ids"] = list(range(int(row.get("attempts") or 0)))
        if trial["state"] == "RUNNING" and trial["started_at"] is None:
            trial["started_at"] = now
        if trial["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") and trial["finished_at"] is None:
            wall = (row.get("evidence") or {}).get("wall_seconds")
            trial["finished_at"] = now
            if isinstance(wall, (int, float)):
                trial["started_at"] = now - float(wall)
            elif trial["started_at"] is None:
                trial["started_at"] = now
        if metrics is not None:
            trial["metrics"] = {**metrics, "params": metrics.get("params", trial["params"])}
            trial["metric"] = None if self.metric is None else metric_value(metrics, self.metric)

    def sweep(self) -> dict[str, Any]:
        scored = [trial for trial in self.trials if trial["metric"] is not None]
        pick = max if self.mode == "max" else min
        best = pick(scored, key=lambda trial: trial["metric"])["trial_id"] if scored else None
        return {"metric": self.metric, "mode": self.mode, "best_trial_id": best, "trials": self.trials}

    def best(self) -> dict[str, Any] | None:
        best_id = self.sweep()["best_trial_id"]
        return next((trial["metrics"] for trial in self.trials if trial["trial_id"] == best_id), None)


class _Watch:
    """Follows one job: prints new log lines, the events shown, each task's start and end."""

    def __init__(self, api: str, client: CoordinatorClient, job_id: str, sweep: FleetSweep, write: Callable[[str], None],
                 *, prefixed: bool, quiet: bool, fail_fast: bool) -> None:
        self.api, self.client, self.job_id, self.sweep = api, client, job_id, sweep
        self.write, self.prefixed, self.quiet, self.fail_fast = write, prefixed, quiet, fail_fast
        self.seen_logs: dict[str, str] = {}
        self.seen_events = 0
        self.announced: set[str] = set()
        self.finished: set[str] = set()
        self.stopped_by_fail_fast = False
        self.logs: dict[str, str] = {}
        self.reasons: dict[str, str] = {}

    def call(self, fn: Callable[[], Any]) -> Any:
        return coordinator_call(self.api, fn)

    def _say(self, task_id: str | None, text: str) -> None:
        if not self.quiet:
            tag = f"[{task_id}] " if task_id and self.prefixed else ""
            self.write(f"flashruntime: {tag}{text}\n")

    def _lines(self, task_id: str, log: str, final: bool) -> None:
        added = new_text(self.seen_logs.get(task_id, ""), log)
        shown = added if final else added[:added.rfind("\n") + 1]
        self.seen_logs[task_id] = log[:len(log) - len(added) + len(shown)]
        if shown and not self.quiet:
            prefix = f"[{task_id}] " if self.prefixed else ""
            self.write("".join(f"{prefix}{line}\n" for line in shown.splitlines()))

    def poll(self) -> str:
        """One pass; the job's state as read at its start."""
        state = str(self.call(lambda: self.client.job(self.job_id)).get("state"))
        rows = {str(row.get("task_id")): row for row in self.call(lambda: self.client.tasks(self.job_id))}
        logs = {str(entry.get("task_id")): str(entry.get("log") or "")
                for entry in self.call(lambda: self.client.logs(self.job_id)).get("tasks") or ()}
        events = self.call(lambda: self.client.events(self.job_id))
        by_task: dict[str | None, list[dict[str, Any]]] = {}
        for event in events[self.seen_events:]:
            data = event.get("data") if isinstance(event.get("data"), dict) else {}
            task_id = str(data["task_id"]) if data.get("task_id") else None
            if event.get("type") in ("TASK_ATTEMPT_FAILED", "FAILURE_CLASSIFIED", "TASK_EXHAUSTED") and task_id:
                self.reasons[task_id] = str(event.get("message"))
            if event.get("type") in _EVENTS_SHOWN:
                by_task.setdefault(task_id if task_id in rows else None, []).append(event)
        self.seen_events = len(events)
        now = time.time()
        total = len(self.sweep.trials)
        for index, trial in enumerate(self.sweep.trials):
            task_id = trial["trial_id"]
            row = rows.get(task_id)
            if row is None:
                continue
            label = f"trial {index + 1}/{total} {task_id}" if self.sweep.fan_out else task_id
            if task_id not in self.announced and row.get("state") != "PENDING":
                self.announced.add(task_id)
                params = ", ".join(f"{key}={value!r}" if isinstance(value, str) else f"{key}={value}"
                                   for key, value in trial["params"].items()) or "no parameters"
                self._say(task_id, f"{label} started on {row.get('node_id') or 'a worker'} ({params})")
            terminal = row.get("state") in ("COMPLETED", "FAILED", "CANCELLED")
            self.logs[task_id] = logs.get(task_id, "")
            self._lines(task_id, logs.get(task_id, ""), final=terminal)
            for event in by_task.pop(task_id, []):  # after the lines they explain, before the trial's end
                self._say(task_id, str(event.get("message")))
            if terminal and task_id not in self.finished:
                self.finished.add(task_id)
                metrics = self._metrics(task_id) if row.get("state") == "COMPLETED" else None
                self.sweep.update(index, row, now, metrics)
                seconds = trial["finished_at"] - trial["started_at"]
                value = trial["metric"]
                scored = f", {self.sweep.metric}={value}" if value is not None else ""
                self._say(task_id, f"{label} {trial['state']} in {seconds:.1f} s{scored}")
                if trial["state"] == "FAILED" and self.fail_fast and state not in TERMINAL_STATES:
                    self.stopped_by_fail_fast = True
                    self._say(None, f"trial {task_id} failed: stopping the sweep (fail_fast)")
                    self.call(lambda: self.client.cancel(self.job_id))
            elif not terminal:
                self.sweep.update(index, row, now, None)
        for remaining in by_task.values():
            for event in remaining:
                self._say(None, str(event.get("message")))
        return state

    def _metrics(self, task_id: str) -> dict[str, Any] | None:
        try:
            raw = self.client.get_artifact(f"jobs/{self.job_id}/{task_id}/metrics.json")
            value = json.loads(raw)
        except Exception:  # noqa: BLE001 - a task without readable metrics is a trial without a score
            return None
        return value if isinstance(value, dict) else None

    def failure_summary(self) -> str | None:
        failed = [trial for trial in self.sweep.trials if trial["state"] == "FAILED"]
        if not failed:
            return None
        blocks = []
        for trial in failed:
            task_id = trial["trial_id"]
            reason = self.reasons.get(task_id, "no reason recorded")
            tail = last_lines(self.logs.get(task_id, ""), 10).rstrip("\n")
            blocks.append(f"{task_id} FAILED after {len(trial['attempt_ids'])} attempt(s): {reason}"
                          + ("\n  last lines of its log:\n" + "\n".join(f"    {line}" for line in tail.splitlines())
                             if tail else ""))
        return "\n".join(blocks) + f"\n(flashruntime logs {self.job_id} --api {self.api} shows the whole logs)"


def _upload_source(api: str, client: CoordinatorClient, workload: CommandWorkload, caller: dict[str, Any],
                   say: Callable[[str], None]) -> str:
    from flashruntime.workloads.source_archive import pack_source

    packed = pack_source(workload.source.path)
    for name, why in packed.skipped:
        print(f"warning: {name} is not uploaded: {why}", file=sys.stderr)
    key = f"{caller.get('artifact_prefix') or ''}sources/{packed.sha256}.tar.gz"
    coordinator_call(api, lambda: client.put_artifact(key, packed.data, "application/gzip"))
    say(f"source: {len(packed.files)} files ({packed.total_bytes} bytes) uploaded as artifact://{key}")
    return f"artifact://{key}"


def submit_to_fleet(args: argparse.Namespace, workload: CommandWorkload, api: str, lines: TextIO) -> int:
    """Submit ``workload`` to the coordinator at ``api`` and follow it to its end (see the module)."""
    from flashruntime.cli.trial_table import trial_table_text

    def write(text: str) -> None:
        lines.write(text)
        lines.flush()

    def say(text: str) -> None:
        if not args.quiet:
            write(f"flashruntime: {text}\n")

    client = cli_client(api, args)
    try:
        caller = coordinator_call(api, client.whoami)
        # Without the grant the job is sent first, so the coordinator's own refusal is what is
        # told, and no source is stored for a job that cannot exist.
        source_uri = (_upload_source(api, client, workload, caller, say) if caller.get("may_run_code")
                      else f"artifact://{caller.get('artifact_prefix') or ''}sources/not-uploaded.tar.gz")
        spec = fleet_jobspec(workload, source_uri, pool=args.pool, max_restarts=args.max_restarts)
        record = coordinator_call(api, lambda: client.submit_job(spec))
    except CommandError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
    except InvalidSubmission as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    job_id = str(record["job_id"])
    param_sets = list(workload.task_params or [])
    metric = args.metric or workload.outputs.primary_metric
    mode = resolve_mode(metric, args.mode, workload.outputs.maximize_if_set())
    sweep = FleetSweep(param_sets or [{}], metric, mode, fan_out=bool(param_sets))
    say(f"job {job_id} submitted to {api}")
    if param_sets:
        ranked = "unranked (no metric)" if metric is None else f"ranked by {metric}, {mode_reason(metric, args.mode)}"
        say(f"{len(param_sets)} trials on the fleet, as workers claim them, {ranked}")
    watch = _Watch(api, client, job_id, sweep, write, prefixed=bool(param_sets), quiet=args.quiet,
                   fail_fast=args.fail_fast)
    try:
        while (state := watch.poll()) not in TERMINAL_STATES:
            time.sleep(POLL_S)
        watch.poll()  # the last lines and results, read after the job ended
    except KeyboardInterrupt:
        print(f"\nflashruntime: detached; job {job_id} keeps running on {api}: follow it with flashruntime logs "
              f"{job_id} --follow --api {api}, cancel it with flashruntime cancel {job_id} --api {api}",
              file=sys.stderr)
        return EXIT_DETACHED
    except CommandError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
    if watch.stopped_by_fail_fast:
        state = "FAILED"
    return _summary(args, watch, state, trial_table_text)


def _summary(args: argparse.Namespace, watch: _Watch, state: str, table_text: Callable[..., str]) -> int:
    sweep = watch.sweep
    rows = trial_rows(sweep.sweep()) if sweep.fan_out else []
    best = sweep.best() if sweep.metric else None
    trials = sum(1 for trial in sweep.trials if trial["metrics"] is not None)
    output = f"artifact://jobs/{watch.job_id}/"
    failure = watch.failure_summary() if state != "SUCCEEDED" else None
    if failure:
        print(failure, file=sys.stderr)
    if args.json:
        print(json.dumps({"state": state, "trials": trials, "best": best, "job_id": watch.job_id, "api": watch.api,
                          "output_dir": output, "metric": sweep.metric, "mode": sweep.mode if sweep.metric else None,
                          "table": rows, "failure": failure}, default=str))
    else:
        if rows:
            print(table_text(rows, sweep.metric))
        print(f"state: {state}")
        print(f"trials: {trials}")
        if sweep.metric:
            print(f"best: {json.dumps(best, default=str)}")
        print(f"job: {watch.job_id} on {watch.api}")
        print(f"output: {output} (flashruntime artifacts {watch.job_id} --download DIR)")
    return 0 if state == "SUCCEEDED" else EXIT_FAILED
