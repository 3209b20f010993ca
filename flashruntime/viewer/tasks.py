"""The run's tasks as the page shows them: one per job id — the single command's one, or
one per trial of a sweep — each with its attempts, its restarts and one loss curve that
spans them all, a restart starting a new segment of it.

Pure: ``task_view`` is given the run document, each attempt's ``MetricsView`` and a
reader of an attempt's ``metrics.json``; it reads no file itself. A run document with a
``sweep`` object is taken at its word; one without (an older run) has its trials derived
from the attempt rows' job ids (``local-000``, ``local-001``, …) and ``trials``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from flashruntime.viewer.series import SERIES_POINTS, MetricsView, Point, reduce_points

__all__ = ["task_view"]

FAN_OUT_JOB = re.compile(r"^local-(\d+)$")
SINGLE_JOB = "local"
# A segment of a curve cut to share SERIES_POINTS keeps at least its first and last point
# and one bucket's lowest and highest.
_SEGMENT_FLOOR = 4

TrialReader = Callable[[int], "dict[str, Any] | None"]


def task_view(doc: dict[str, Any], attempts: list[dict[str, Any]], views: list[MetricsView],
              trial_metrics: TrialReader) -> dict[str, Any]:
    """``{"fan_out", "derived", "metric", "mode", "best_trial_id", "loss", "tasks"}`` for the page.

    ``attempts[i]`` is an attempt row, ``views[i]`` its metrics, ``trial_metrics(i)`` its
    ``metrics.json`` (None when absent or unreadable), read only for a run without ``sweep``.
    """
    groups: dict[str, list[int]] = {}
    for index, attempt in enumerate(attempts):
        groups.setdefault(_job_id(attempt), []).append(index)
    sweep = doc.get("sweep") if isinstance(doc.get("sweep"), dict) else None
    fan_out = sweep is not None or any(FAN_OUT_JOB.match(job) for job in groups)
    if sweep is not None:
        tasks = _from_sweep(sweep, attempts, groups)
    else:
        tasks = _derived(doc, attempts, groups, trial_metrics, fan_out)
    key, x_axis = _loss_key(tasks, views)
    for task in tasks:
        task["segments"], task["read_fraction"] = _segments(task, attempts, views, key, x_axis)
    best = sweep.get("best_trial_id") if sweep is not None else None
    mode = sweep.get("mode") if sweep is not None else None
    metric = sweep.get("metric") if sweep is not None else None
    for task in tasks:
        task["best"] = isinstance(best, str) and task["job_id"] == best
    return {
        "fan_out": fan_out,
        "derived": fan_out and sweep is None,
        "metric": metric if isinstance(metric, str) else None,
        "mode": mode if mode in ("min", "max") else None,
        "best_trial_id": best if isinstance(best, str) else None,
        "loss": {"key": key, "x": x_axis, "points_per_series": SERIES_POINTS},
        "tasks": tasks,
    }


def _job_id(attempt: dict[str, Any]) -> str:
    job = attempt.get("job_id")
    return job if isinstance(job, str) and job else SINGLE_JOB


def _number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return value if ok else None


def _task(job_id: str, index: int, attempts: list[dict[str, Any]], members: list[int]) -> dict[str, Any]:
    """A task as its attempt rows describe it; a sweep's trial overrides what it knows better."""
    rows = [attempts[i] for i in members]
    last = rows[-1] if rows else {}
    return {
        "job_id": job_id,
        "index": index,
        "params": None,
        "state": last.get("state") if isinstance(last.get("state"), str) else "PENDING",
        "attempt_ids": [str(row.get("attempt_id", "")) for row in rows],
        "attempts": list(members),
        "restarts": max(0, len(rows) - 1),
        "started_at": _number(rows[0].get("started_at")) if rows else None,
        "finished_at": _number(last.get("finished_at")),
        "metric": None,
        "metrics": None,
    }


def _from_sweep(sweep: dict[str, Any], attempts: list[dict[str, Any]],
                groups: dict[str, list[int]]) -> list[dict[str, Any]]:
    tasks = []
    for position, trial in enumerate(t for t in sweep.get("trials") or [] if isinstance(t, dict)):
        job = trial.get("trial_id")
        job = job if isinstance(job, str) and job else f"local-{position:03d}"
        index = trial.get("index")
        task = _task(job, index if isinstance(index, int) and not isinstance(index, bool) else position,
                     attempts, groups.get(job, []))
        if not task["attempt_ids"] and isinstance(trial.get("attempt_ids"), list):
            task["attempt_ids"] = [str(a) for a in trial["attempt_ids"]]
        params, metrics = trial.get("params"), trial.get("metrics")
        task.update(
            params=params if isinstance(params, dict) else None,
            metric=_number(trial.get("metric")),
            metrics=_without_params(metrics) if isinstance(metrics, dict) else None,
        )
        if isinstance(trial.get("state"), str):
            task["state"] = trial["state"]
        for name in ("started_at", "finished_at"):
            if name in trial:
                task[name] = _number(trial[name])
        tasks.append(task)
    known = {task["job_id"] for task in tasks}
    for job, members in groups.items():  # rows of a job the sweep does not list: shown, not hidden
        if job not in known:
            tasks.append(_task(job, len(tasks), attempts, members))
    return tasks


def _without_params(metrics: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in metrics.items() if key != "params"}


def _derived(doc: dict[str, Any], attempts: list[dict[str, Any]], groups: dict[str, list[int]],
             trial_metrics: TrialReader, fan_out: bool) -> list[dict[str, Any]]:
    """Trials from the attempt rows. A trial's ``params`` live in the ``trials`` entry its
    job contributed: the one equal (but for ``params``) to the ``metrics.json`` of the
    job's newest attempt that has one, as ``flash.submit`` credited it."""
    def order(job: str) -> tuple[int, int]:
        match = FAN_OUT_JOB.match(job)
        return (0, int(match.group(1))) if match else (1, 0)

    jobs = sorted(groups, key=order)  # stable: jobs of no trial keep their order, after the trials
    tasks = [_task(job, position, attempts, groups[job]) for position, job in enumerate(jobs)]
    if not fan_out:
        return tasks
    trials = [t for t in doc.get("trials") or [] if isinstance(t, dict)]
    unused = list(range(len(trials)))
    unmatched = []
    for task in tasks:
        found = None
        for member in reversed(task["attempts"]):
            content = trial_metrics(member)
            if content is None:
                continue
            wanted = _without_params(content)
            found = next((j for j in unused if _without_params(trials[j]) == wanted), None)
            if found is not None:
                break
        if found is None:
            unmatched.append(task)
            continue
        unused.remove(found)
        _credit(task, trials[found])
    if len(trials) == len(tasks):  # files gone: one trial per job, in job order
        for task in unmatched:
            if task["index"] in unused:
                _credit(task, trials[task["index"]])
    return tasks


def _credit(task: dict[str, Any], trial: dict[str, Any]) -> None:
    params = trial.get("params")
    task["params"] = params if isinstance(params, dict) else None
    task["metrics"] = _without_params(trial)


def _loss_key(tasks: list[dict[str, Any]], views: list[MetricsView]) -> tuple[str | None, str]:
    """``loss`` when any attempt logs it, else the first other numeric key logged; drawn
    against ``step`` when every point of it has one, else against the record number."""
    ordered = [views[i] for task in tasks for i in task["attempts"] if i < len(views)]
    key = "loss" if any("loss" in view.series for view in ordered) else next(
        (k for view in ordered for k in view.series), None)
    by_step = all(view.series[key][1] for view in ordered if key in view.series)
    return key, "step" if by_step else "record"


def _segments(task: dict[str, Any], attempts: list[dict[str, Any]], views: list[MetricsView],
              key: str | None, x_axis: str) -> tuple[list[dict[str, Any]], float]:
    """One segment per attempt, in order, sharing at most ``SERIES_POINTS`` points (each
    non-empty one keeps at least its first and last). On the record axis an attempt's
    records are numbered on from where the one before it ended."""
    members = [i for i in task["attempts"] if i < len(views)]
    raw: list[list[Point]] = [list(views[i].series.get(key, ([], True))[0]) if key else [] for i in members]
    total = sum(len(points) for points in raw)
    if total > SERIES_POINTS:
        filled = sum(1 for points in raw if points)
        if filled * _SEGMENT_FLOOR <= SERIES_POINTS:
            spare = SERIES_POINTS - filled * _SEGMENT_FLOOR
            raw = [reduce_points(points, _SEGMENT_FLOOR + spare * len(points) // total) for points in raw]
        else:
            raw = [reduce_points(points, 2) for points in raw]
    segments = []
    offset = 0
    for member, points in zip(members, raw):
        if x_axis == "step":
            xy = [[step, value] for _, step, value in points]
        else:
            xy = [[offset + index, value] for index, _, value in points]
        offset += views[member].records
        segments.append({"attempt_id": str(attempts[member].get("attempt_id", "")), "attempt": member,
                         "points": xy})
    fraction = min((views[i].read_fraction for i in members), default=1.0)
    return segments, fraction
