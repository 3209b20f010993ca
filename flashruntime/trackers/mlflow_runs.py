"""A run's metrics as MLflow runs, logged with MLflow's own client.

``log_run(run_dir, tracking_uri)`` logs what a local run recorded (read by ``run_records``):
a sweep as a parent run named after the run with one child run per trial (tag
``mlflow.parentRunId``), any other run as one plain run. Each MLflow run gets its parameters,
every number of every step record as a metric at its step and timestamp (ms; a relaunch's
recomputed steps included, as they ran), the final figures under ``final/``, its state and
times, and as artifacts its last attempt's output files plus the run's ``run.json``, each file
at most ``MAX_ARTIFACT_BYTES`` (a bigger one is skipped, and named in the tag
``flashruntime.skipped``). ``log_task`` logs one task of a coordinator job the same way,
under the job's parent run. The tracking URI goes to the client it was given to; MLflow's
process-wide settings are never changed. Each call logs new runs. Needs the ``mlflow`` extra.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from flashruntime.errors import ConfigurationError, ModuleUnavailable
from flashruntime.monitor.records import finite_number, json_object
from flashruntime.trackers.run_records import RecordedPart, figures, read_run, step_records

__all__ = [
    "DEFAULT_EXPERIMENT",
    "MAX_ARTIFACT_BYTES",
    "MAX_ARTIFACT_FILES",
    "MLFLOW_EXPERIMENT_ENV",
    "MLFLOW_URI_ENV",
    "Logged",
    "TaskRecord",
    "log_run",
    "log_task",
    "tracking_client",
    "tracking_problem",
]

MLFLOW_URI_ENV = "MLFLOW_TRACKING_URI"  # MLflow's own variables, read as MLflow reads them
MLFLOW_EXPERIMENT_ENV = "MLFLOW_EXPERIMENT_NAME"
DEFAULT_EXPERIMENT = "flashruntime"
MAX_ARTIFACT_BYTES = 16 * 1024 * 1024
MAX_ARTIFACT_FILES = 100  # of one MLflow run: a task that writes thousands of files is not uploaded whole
PARENT_TAG = "mlflow.parentRunId"
SKIPPED_TAG = "flashruntime.skipped"
_URI_FORMS = "http://host:port (a tracking server), sqlite:///path/mlflow.db, or file:///path/mlruns"
_INSTALL = "pip install 'flashruntime[mlflow]' (or pip install mlflow)"
_STATUS = {"SUCCEEDED": "FINISHED", "FAILED": "FAILED"}  # anything else ended before it finished: KILLED


@dataclass
class Logged:
    """What one call logged: the MLflow runs (the parent first, when there is one) and what it left out."""

    tracking_uri: str
    experiment: str
    experiment_id: str
    run_ids: list[str] = field(default_factory=list)
    parent_run_id: str | None = None
    skipped: list[str] = field(default_factory=list)

    @property
    def url(self) -> str | None:
        """The experiment's page on a tracking server; None for a store without one."""
        if urlparse(self.tracking_uri).scheme not in ("http", "https"):
            return None
        return f"{self.tracking_uri.rstrip('/')}/#/experiments/{self.experiment_id}"


@dataclass(frozen=True)
class TaskRecord:
    """One committed task of a coordinator job, as its worker uploaded it."""

    job_id: str
    job_name: str
    task_id: str
    params: dict[str, Any] | None
    steps_file: Path | None  # its metrics.jsonl
    final_file: Path | None  # its metrics.json
    files: tuple[tuple[str, Path], ...]  # (name under the task's directory, stored file)
    started_at: float | None  # when its accepted attempt was claimed
    ended_at: float  # when it was committed
    job_started_at: float | None = None
    tags: dict[str, str] = field(default_factory=dict)


def _mlflow() -> Any:
    try:
        import mlflow.tracking
    except ImportError:
        raise ModuleUnavailable(f"logging to MLflow needs mlflow: {_INSTALL}") from None
    return mlflow


def tracking_problem(uri: object, name: str) -> str | None:
    """Why MLflow cannot log to ``uri`` (``name`` says where it was set), or None. Opens the
    store as MLflow would (a SQLite database is created); contacts no server."""
    if not isinstance(uri, str) or not uri.strip():
        return f"{name} must be an MLflow tracking URI, {_URI_FORMS}; got {uri!r}"
    try:
        tracking_client(uri)
    except ModuleUnavailable:
        return f"{name} needs mlflow: {_INSTALL}, or unset it"
    except ConfigurationError as exc:
        return f"{name} {uri!r} is no tracking URI MLflow can log to: {exc}"
    return None


def tracking_client(uri: str) -> Any:
    """MLflow's client for ``uri``; ``ConfigurationError`` saying why when MLflow has no store
    for it, ``ModuleUnavailable`` without mlflow."""
    mlflow = _mlflow()
    parsed = urlparse(uri)
    if parsed.scheme in ("http", "https") and not parsed.hostname:
        raise ConfigurationError("it names no host; give the server's address, e.g. http://127.0.0.1:5000")
    try:
        return mlflow.tracking.MlflowClient(tracking_uri=uri)
    except mlflow.exceptions.MlflowException as exc:
        raise ConfigurationError(f"{exc.message} (forms: {_URI_FORMS})") from None


def _experiment_id(client: Any, name: str) -> str:
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is None:
        try:
            return str(client.create_experiment(name))
        except MlflowException:  # made meanwhile by another process: use that one
            found = client.get_experiment_by_name(name)
            if found is None:
                raise
    if found.lifecycle_stage != "active":
        raise ConfigurationError(f"MLflow experiment {name!r} is deleted: restore it (mlflow experiments restore "
                         f"--experiment-id {found.experiment_id}) or choose another experiment name")
    return str(found.experiment_id)


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def _param_value(value: Any) -> str:
    if isinstance(value, (str, bool, int, float)):
        return str(value)  # as mlflow.log_param writes a scalar
    return json.dumps(value, sort_keys=True, default=str)


class _Batch:
    """A run's metrics, params and tags, sent in batches of the sizes MLflow accepts; names
    and values MLflow cannot store are left out and listed in ``skipped``."""

    def __init__(self, client: Any, run_id: str, skipped: list[str]) -> None:
        from mlflow.entities import Metric, Param, RunTag
        from mlflow.utils import validation

        self._client, self._run_id, self._skipped = client, run_id, skipped
        self._kinds, self._limits = (Metric, Param, RunTag), validation
        self._metrics: list[Any] = []
        self._others: list[Any] = []
        self._unnamed: set[str] = set()

    def _nameable(self, key: str) -> bool:
        valid = (len(key) <= self._limits.MAX_ENTITY_KEY_LENGTH and self._limits.validate_param_and_metric_name(key)
                 and not self._limits.path_not_unique(key))
        if not valid and key not in self._unnamed:
            self._unnamed.add(key)
            self._skipped.append(f"{key!r}: a name MLflow cannot store (letters, digits, _ - . : / and spaces)")
        return valid

    def metric(self, key: str, value: float, timestamp_ms: int, step: int) -> None:
        if self._nameable(key):
            self._metrics.append(self._kinds[0](key, value, timestamp_ms, step))
            if len(self._metrics) >= self._limits.MAX_METRICS_PER_BATCH:
                self.flush()

    def params(self, params: dict[str, Any]) -> None:
        for key, value in params.items():
            text = _param_value(value)
            if len(text) > self._limits.MAX_PARAM_VAL_LENGTH:
                self._skipped.append(f"param {key!r}: {len(text)} characters, over MLflow's "
                                     f"{self._limits.MAX_PARAM_VAL_LENGTH} (all params are in params.json)")
            elif self._nameable(str(key)):
                self._others.append(self._kinds[1](str(key), text))
                if len(self._others) >= self._limits.MAX_PARAMS_TAGS_PER_BATCH:
                    self.flush()

    def tag(self, key: str, value: str) -> None:
        self._others.append(self._kinds[2](key, value[: self._limits.MAX_TAG_VAL_LENGTH]))
        if len(self._others) >= self._limits.MAX_PARAMS_TAGS_PER_BATCH:
            self.flush()

    def flush(self) -> None:
        from mlflow.entities import Param

        if self._metrics or self._others:
            params = [item for item in self._others if isinstance(item, Param)]
            tags = [item for item in self._others if not isinstance(item, Param)]
            self._client.log_batch(self._run_id, metrics=self._metrics, params=params, tags=tags, synchronous=True)
        self._metrics, self._others = [], []


def _files(directory: Path) -> Iterator[tuple[str, Path]]:
    """(relative name, path) of each regular file under ``directory``, sorted."""
    if directory.is_dir():
        for path in sorted(directory.rglob("*")):
            if path.is_file() and not path.is_symlink():
                yield path.relative_to(directory).as_posix(), path


def _upload(client: Any, run_id: str, files: Iterable[tuple[str, Path]], skipped: list[str],
            max_bytes: int = MAX_ARTIFACT_BYTES) -> None:
    uploaded = 0
    for name, path in files:
        try:
            size = path.stat().st_size
        except OSError:
            continue  # gone meanwhile
        if size > max_bytes:
            skipped.append(f"{name}: {size} bytes, over {max_bytes}")
            continue
        if uploaded >= MAX_ARTIFACT_FILES:
            skipped.append(f"{name}: over {MAX_ARTIFACT_FILES} files")
            continue
        parent = Path(name).parent.as_posix()
        client.log_artifact(run_id, str(path), None if parent == "." else parent)
        uploaded += 1


def _log_one(client: Any, experiment_id: str, run_name: str, *, tags: dict[str, str],
             params: dict[str, Any] | None, steps_files: Sequence[Path | None], final: dict[str, Any] | None,
             files: Iterable[tuple[str, Path]], state: str | None, started_at: float | None, ended_at: float,
             skipped: list[str], max_bytes: int = MAX_ARTIFACT_BYTES) -> str:
    """One MLflow run, ended with its state once everything is logged (FAILED if logging broke off)."""
    run = client.create_run(experiment_id, start_time=_ms(started_at if started_at is not None else ended_at),
                            tags=tags, run_name=run_name)
    run_id = str(run.info.run_id)
    mine: list[str] = []
    try:
        batch = _Batch(client, run_id, mine)
        batch.params(params or {})
        last_step, last_ms = 0, _ms(ended_at)
        for steps in steps_files:
            for step, ts, record in step_records(steps):
                stamp = _ms(ts) if ts is not None else _ms(ended_at)
                for key, value in figures(record):
                    batch.metric(key, value, stamp, step)
                last_step, last_ms = max(last_step, step), stamp
        for key, value in figures(final or {}):
            batch.metric(f"final/{key}", value, max(last_ms, _ms(ended_at)), last_step)
        batch.flush()
        _upload(client, run_id, files, mine, max_bytes)
        if params:
            client.log_dict(run_id, params, "params.json")
        if mine:
            batch.tag(SKIPPED_TAG, "; ".join(mine))
            batch.flush()
    except BaseException:
        client.set_terminated(run_id, "FAILED", end_time=_ms(ended_at))
        raise
    client.set_terminated(run_id, _STATUS.get(state or "", "KILLED"), end_time=_ms(ended_at))
    skipped.extend(f"{run_name}: {item}" for item in mine)
    return run_id


def _last_attempt_files(part: RecordedPart) -> list[tuple[str, Path]]:
    return list(_files(part.attempt_dirs[-1])) if part.attempt_dirs else []


def log_run(run_dir: str | os.PathLike[str], tracking_uri: str, experiment: str | None = None, *,
            max_artifact_bytes: int = MAX_ARTIFACT_BYTES) -> Logged:
    """Log the run in ``run_dir`` to the MLflow store at ``tracking_uri`` (see the module), in
    ``experiment`` (default ``$MLFLOW_EXPERIMENT_NAME``, else ``flashruntime``; made when missing);
    files over ``max_artifact_bytes`` are left out. ``ModuleUnavailable`` without mlflow; MLflow's
    own errors as it raises them."""
    client = tracking_client(tracking_uri)
    name = experiment or os.environ.get(MLFLOW_EXPERIMENT_ENV) or DEFAULT_EXPERIMENT
    logged = Logged(tracking_uri, name, _experiment_id(client, name))
    recorded = read_run(run_dir)
    document = recorded.document
    summary = ("run.json", recorded.run_dir / "run.json")
    base = {"flashruntime.run_dir": str(recorded.run_dir), "flashruntime.run": recorded.name}
    started = finite_number(document.get("started_at"))
    state = document.get("state") if isinstance(document.get("state"), str) else None
    if recorded.sweep is None:
        (whole,) = recorded.parts
        logged.run_ids.append(_log_one(
            client, logged.experiment_id, recorded.name, tags=base, params=None, steps_files=whole.steps_files,
            final=whole.final, files=[*_last_attempt_files(whole), summary], state=whole.state,
            started_at=whole.started_at, ended_at=whole.ended_at, skipped=logged.skipped,
            max_bytes=max_artifact_bytes))
        return logged
    sweep = recorded.sweep
    ended = finite_number(document.get("finished_at")) or max((part.ended_at for part in recorded.parts),
                                                              default=started or 0.0)
    parent = client.create_run(logged.experiment_id, start_time=_ms(started if started is not None else ended),
                               tags={**base, "flashruntime.best_trial": str(sweep.get("best_trial_id") or "")},
                               run_name=recorded.name)
    logged.parent_run_id = str(parent.info.run_id)
    logged.run_ids.append(logged.parent_run_id)
    try:
        ranking = {key: sweep[key] for key in ("metric", "mode") if sweep.get(key) is not None}
        batch = _Batch(client, logged.parent_run_id, logged.skipped)
        batch.params({f"sweep.{key}": value for key, value in ranking.items()})
        batch.flush()
        _upload(client, logged.parent_run_id, [summary], logged.skipped, max_artifact_bytes)
        for part in recorded.parts:
            logged.run_ids.append(_log_one(
                client, logged.experiment_id, str(part.trial_id),
                tags={**base, "flashruntime.trial": str(part.trial_id), PARENT_TAG: logged.parent_run_id},
                params=part.params, steps_files=part.steps_files, final=part.final,
                files=_last_attempt_files(part), state=part.state, started_at=part.started_at,
                ended_at=part.ended_at, skipped=logged.skipped, max_bytes=max_artifact_bytes))
    except BaseException:
        client.set_terminated(logged.parent_run_id, "FAILED", end_time=_ms(ended))
        raise
    client.set_terminated(logged.parent_run_id, _STATUS.get(state or "", "KILLED"), end_time=_ms(ended))
    return logged


def _job_parent(client: Any, experiment_id: str, task: TaskRecord, parents: dict[str, str]) -> str:
    """The parent run of ``task``'s job: known, found by its tags, else made."""
    known = parents.get(task.job_id)
    if known is not None:
        return known
    quoted = task.job_id.replace("\\", "\\\\").replace("'", "\\'")
    found = client.search_runs([experiment_id], filter_string=f"tags.`flashruntime.job_id` = '{quoted}' and "
                               "tags.`flashruntime.kind` = 'job'", max_results=1)
    if found:
        parents[task.job_id] = str(found[0].info.run_id)
    else:
        started = task.job_started_at if task.job_started_at is not None else task.ended_at
        made = client.create_run(experiment_id, start_time=_ms(started), run_name=f"{task.job_name}-{task.job_id}",
                                 tags={"flashruntime.job_id": task.job_id, "flashruntime.kind": "job"})
        parents[task.job_id] = str(made.info.run_id)
    return parents[task.job_id]


def log_task(client: Any, experiment: str, task: TaskRecord, parents: dict[str, str],
             job_ended: str | None = None) -> Logged:
    """Log one committed coordinator task as a child of its job's parent run (``parents``
    remembers them by job id, across calls). ``job_ended``: the job's state when this task was
    its last, which ends the parent run too."""
    logged = Logged(str(client.tracking_uri), experiment, _experiment_id(client, experiment))
    logged.parent_run_id = _job_parent(client, logged.experiment_id, task, parents)
    tags = {**task.tags, "flashruntime.job_id": task.job_id, "flashruntime.task_id": task.task_id,
            PARENT_TAG: logged.parent_run_id}
    final = json_object(task.final_file) if task.final_file is not None else None
    logged.run_ids.append(_log_one(
        client, logged.experiment_id, task.task_id, tags=tags, params=task.params, steps_files=[task.steps_file],
        final=final, files=task.files, state="SUCCEEDED", started_at=task.started_at, ended_at=task.ended_at,
        skipped=logged.skipped))
    if job_ended is not None:
        client.set_terminated(logged.parent_run_id, _STATUS.get(job_ended, "KILLED"), end_time=_ms(task.ended_at))
    return logged
