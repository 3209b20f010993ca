"""A coordinator's committed tasks logged to MLflow (``FLASHML_MLFLOW_URI``), on a thread of
its own: a slow or unreachable tracking server (MLflow's client retries for minutes) never
holds a commit, and one thread makes each job's parent run once. What cannot be logged is
logged as a warning; the commit has already been accepted."""

from __future__ import annotations

import logging
import queue
import threading

from flashruntime.errors import ConfigurationError
from flashruntime.trackers.mlflow_runs import TaskRecord, log_task, tracking_client, tracking_problem

__all__ = ["MlflowTasks"]

log = logging.getLogger("flashruntime.service")

_Item = tuple[TaskRecord, "str | None"]


class MlflowTasks:
    """Log each task given to ``log`` as an MLflow run, in the order given. A URI MLflow cannot
    log to (or no mlflow installed) is refused here, before the coordinator serves anything."""

    def __init__(self, uri: str, experiment: str) -> None:
        problem = tracking_problem(uri, "FLASHML_MLFLOW_URI")
        if problem is not None:
            raise ConfigurationError(problem)
        self.uri, self.experiment = uri, experiment
        self._queue: queue.Queue[_Item | None] = queue.Queue()
        # By job id: several coordinator replicas each find a job's parent by its tags, and
        # may each make one when their first tasks of the job commit at the same moment.
        self._parents: dict[str, str] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False

    def log(self, task: TaskRecord, job_ended: str | None) -> None:
        """Queue ``task``; ``job_ended`` is its job's state when it was the job's last task."""
        with self._lock:
            if self._closed:
                log.warning("MLflow run of %s/%s not logged: the coordinator is stopping", task.job_id, task.task_id)
                return
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="flashruntime-mlflow", daemon=True)
                self._thread.start()
        self._queue.put((task, job_ended))

    def _work(self) -> None:
        client = None
        while (item := self._queue.get()) is not None:
            task, job_ended = item
            try:
                client = client or tracking_client(self.uri)
                logged = log_task(client, self.experiment, task, self._parents, job_ended)
                log.info("MLflow: %s/%s logged to %s as run %s (job run %s)%s", task.job_id, task.task_id, self.uri,
                         logged.run_ids[0], logged.parent_run_id,
                         f"; left out: {'; '.join(logged.skipped)}" if logged.skipped else "")
            except Exception as exc:  # noqa: BLE001 - a tracker's failure is logged, never the commit's
                log.warning("MLflow run of %s/%s not logged to %s: %s: %s", task.job_id, task.task_id, self.uri,
                            type(exc).__name__, exc)

    def close(self, timeout_s: float = 30.0) -> None:
        """Log what is queued, waiting at most ``timeout_s``, then stop taking tasks."""
        with self._lock:
            self._closed = True
            thread = self._thread
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout_s)
            if thread.is_alive():
                log.warning("MLflow: tasks still queued for %s after %.0f s are not logged", self.uri, timeout_s)
