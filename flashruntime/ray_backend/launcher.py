"""``flash.submit(executor="ray")``: each attempt of a local run as one Ray task.

The Ray task starts the attempt with the local launcher itself (``run_local_attempt``), so
the command sees the same directories and environment as a local attempt: its
``FLASHML_OUTPUT_DIR`` is the run's attempt directory and its ``FLASHML_CKPT_DIR`` the job's
checkpoint directory. Those paths must therefore be visible on the Ray node: a local Ray, or
a cluster whose nodes mount the run's directory; a node that does not see it fails the
attempt with a message saying so. The driver (``flash.submit``) keeps everything else as for
a local run: restarts by the recovery policy, trials, metrics, ``run.json``.

The attempt's hang watch runs beside it in the Ray task, on its node, as it would beside a
local attempt: it dumps the ranks' stacks there, stops the attempt and reports what it found,
which the driver classifies ``hang``.

Ray never retries an attempt (``max_retries=0``); a Ray worker that dies fails the attempt
with no exit code, classified as Ray reported it (``reported_failure``: the run's restarts
follow that class), a line in its log says so, and what the dead worker left running is
stopped on its node. ``cancel`` cancels the Ray
task, which stops the attempt's processes before it ends, and kills it after the grace.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from flashruntime.errors import BadRayAddress, InvalidSubmission, LaunchError
from flashruntime.launchers import Launcher, LaunchHandle, LaunchState
from flashruntime.launchers.local import LOG_NAME, LocalProcessLauncher, read_log_tail, stop_leftover_attempt
from flashruntime.monitor.hang_watch import HangWatch, ReportedHang
from flashruntime.ray_backend.cluster import (
    ALIVE,
    ALIVE_S,
    ENDED,
    LOST,
    RAY_ADDRESS_ENV,
    connect,
    import_ray,
    on_node,
    parse_ray_address,
    placement,
    read_stream,
    total_cpus,
)
from flashruntime.ray_backend.failures import classify_ray_error, is_cancellation

__all__ = ["RayLaunchHandle", "RayLauncher", "cluster_cpus", "connect_for_a_run", "resolve_address",
           "run_local_attempt"]

POLL_S = 0.1


def run_local_attempt(spec_json: dict[str, Any], job_id: str, attempt_id: str, output_root: str,
                      checkpoint_dir: str | None, term_grace_s: float,
                      hang_timeout_s: float | None = None) -> Iterator[tuple[str, Any]]:
    """In the Ray worker: launch the attempt with the local launcher and follow it, its hang
    watch beside it (``hang_timeout_s`` as ``flash.submit`` takes it; 0: none). Yields
    ``("started", placement + pid + previous_dir)``, ``("hang_detected", words)`` when the
    watch acts, ``("hung", ReportedHang)`` once it has stopped the attempt, then
    ``("finished", exit_code)``; or one ``("refused", why)``."""
    from flashruntime.strategies import LaunchSpec

    if not os.path.isdir(output_root):
        yield "refused", (f"the run's output directory {output_root} is not on Ray node {placement()['hostname']}: "
                          "executor='ray' needs the run's directory on a file system the Ray nodes share with the "
                          "submitting process (a local Ray, or a shared mount)")
        return
    launcher = LocalProcessLauncher(output_root, term_grace_s=term_grace_s, checkpoint_dir=checkpoint_dir)
    try:
        handle = launcher.launch(LaunchSpec.model_validate(spec_json), job_id, attempt_id)
    except LaunchError as exc:
        yield "refused", str(exc)
        return
    previous = str(handle.previous_dir) if handle.previous_dir is not None else None
    yield "started", {**placement(), "pid": int(handle.execution_id), "previous_dir": previous}
    detected: queue.SimpleQueue[str] = queue.SimpleQueue()
    hangs = (HangWatch(handle, attempt_id, hang_timeout_s, lambda _type, words: detected.put(words)).start()
             if hang_timeout_s != 0 else None)
    try:
        state = handle.wait(timeout_seconds=0)
        while not state.terminal:
            state = handle.wait(timeout_seconds=ALIVE_S)
            while not detected.empty():
                yield "hang_detected", detected.get()
            if not state.terminal:
                yield ALIVE, None  # where a cancel of a streaming task takes effect
    except BaseException:  # ray.cancel: nothing outlives the attempt
        if hangs is not None:
            hangs.stop()
        handle.cancel(grace_s=min(term_grace_s, 5.0))
        raise
    verdict = hangs.stop() if hangs is not None else None
    while not detected.empty():
        yield "hang_detected", detected.get()
    if verdict is not None:
        yield "hung", ReportedHang.of(verdict)
    yield "finished", handle.exit_code


def resolve_address(given: str | None) -> str:
    """The cluster of ``executor='ray'``: ``given``, else ``$FLASHML_RAY_ADDRESS``, else an
    embedded local Ray; ``InvalidSubmission`` for an address of no known form."""
    source = "ray_address" if given is not None else RAY_ADDRESS_ENV
    value = given if given is not None else (os.environ.get(RAY_ADDRESS_ENV) or "local")
    try:
        return parse_ray_address(value, source=source)
    except BadRayAddress as exc:
        raise InvalidSubmission(str(exc)) from None


def connect_for_a_run(address: str) -> None:
    """Connect before a run makes anything: without the ray extra, ``ModuleUnavailable``
    naming it; a cluster that cannot be reached, ``LaunchError``."""
    import_ray()
    try:
        connect(address)
    except ConnectionError as exc:
        raise LaunchError(f"cannot connect to the Ray cluster at {address}: {exc}") from None


def cluster_cpus(address: str) -> int:
    """The CPUs of the cluster at ``address`` (connecting to it): how many attempts run at once."""
    return total_cpus(connect(address))


class RayLaunchHandle(LaunchHandle):
    """An attempt running as a Ray task. ``execution_id`` is the attempt's pid on its Ray node
    once it started (before: the Ray task's id); ``where`` says on which node."""

    def __init__(self, ray: Any, stream: Any, output_dir: Path, term_grace_s: float, name: str = "") -> None:
        self._ray = ray
        self.name = name
        self._stream = stream
        self.output_dir = output_dir
        self.previous_dir: Path | None = None
        self._term_grace_s = term_grace_s
        self._state: LaunchState | None = None
        self._cancel_requested = False
        self.exit_code: int | None = None
        self.where: dict[str, Any] = {}
        self.extra_pids: Any = set
        # (failure class, evidence words) when Ray lost the attempt (its worker or node died).
        self.reported_failure: tuple[Any, str] | None = None
        # What the attempt's hang watch on its node found, once it stopped the attempt; and who
        # hears of a detection as it happens (the run records HANG_DETECTED).
        self.reported_hang: ReportedHang | None = None
        self.on_hang: Callable[[str], None] | None = None
        # The run's driver waits while a cancel (another thread) waits too: one reads at a time.
        self._reading = threading.Lock()
        self._messages: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        read_stream(ray, stream, self._messages.put, name=f"flashruntime-ray-{name}")

    @property
    def execution_id(self) -> str:
        pid = self.where.get("pid")
        return str(pid) if pid is not None else f"ray:{self.name}"

    def poll(self) -> LaunchState:
        if self._state is None:
            self._read(0)
        return self._state or LaunchState.RUNNING

    def wait(self, timeout_seconds: float | None = None) -> LaunchState:
        deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
        while self._state is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            self._read(POLL_S if left is None else min(POLL_S, left))
        return self._state or LaunchState.RUNNING

    def _read(self, timeout_s: float) -> None:
        """Take the next message of the Ray task, if one arrives within ``timeout_s``."""
        with self._reading:
            if self._state is None:
                self._read_one(timeout_s)

    def _read_one(self, timeout_s: float) -> None:
        try:
            kind, body = self._messages.get(timeout=timeout_s) if timeout_s > 0 else self._messages.get_nowait()
        except queue.Empty:
            return
        if kind == ENDED:
            self._end(None, "the Ray task ended without a result")
            return
        if kind == LOST:
            if self._cancel_requested or is_cancellation(body):
                self._end(None, None)
            else:
                self.reported_failure = classify_ray_error(body)
                failure, words = self.reported_failure
                self._end(None, f"{failure}: {words}")
                self._stop_leftovers()
            return
        if kind == "started":
            self.where = body
            if body.get("previous_dir"):
                self.previous_dir = Path(body["previous_dir"])
        elif kind == "hang_detected":
            if self.on_hang is not None:
                self.on_hang(str(body))
        elif kind == "hung":
            self.reported_hang = body
        elif kind == "finished":
            self._end(body, None)
        elif kind == "refused":
            self._end(None, str(body))

    def _stop_leftovers(self) -> None:
        """Stop, on the node it ran on, what the lost Ray worker left running (its attempt's
        processes, found by their environment marker)."""
        node_id = self.where.get("ray_node_id")
        if not node_id:
            return
        try:
            sweep = on_node(self._ray, stop_leftover_attempt, node_id)
            self._ray.get(sweep.remote(self.output_dir, self._term_grace_s), timeout=self._term_grace_s + 30)
        except Exception as exc:  # the node is gone, and what ran there with it
            self._note(f"what the lost worker left running was not stopped: {exc}")

    def _note(self, text: str) -> None:
        self.output_dir.mkdir(parents=True, exist_ok=True)
        with open(self.output_dir / LOG_NAME, "a", encoding="utf-8") as log:
            log.write(f"[flashruntime] executor='ray': {text}\n")

    def _end(self, exit_code: int | None, note: str | None) -> None:
        if note:
            self._note(note)
        self.exit_code = exit_code
        if self._cancel_requested:
            self._state = LaunchState.CANCELLED
        elif exit_code == 0:
            self._state = LaunchState.SUCCEEDED
        else:
            self._state = LaunchState.FAILED

    def cancel(self, *, grace_s: float | None = None) -> None:
        """Cancel the Ray task (its processes are stopped inside it); kill it if it has not
        ended after ``grace_s`` (default: the launcher's grace) and a few seconds more."""
        if self._state is not None:
            return
        self._cancel_requested = True
        grace = self._term_grace_s if grace_s is None else max(0.0, float(grace_s))
        try:
            self._ray.cancel(self._stream, force=False)
        except Exception:  # it already ended
            pass
        self.wait(grace + 5.0)
        if self._state is None:
            try:
                self._ray.cancel(self._stream, force=True)
            except Exception:
                pass
            self.wait(5.0)
            if self._state is None:
                self._end(None, "the Ray task did not end after a forced cancel")

    @property
    def launched_as(self) -> str:
        """How the run's events name this attempt when it is launched."""
        return f"Ray task {self.name}"

    def logs(self, tail_lines: int = 200) -> str:
        lines = read_log_tail(self.output_dir / LOG_NAME).splitlines()
        return "\n".join(lines[-tail_lines:]) if tail_lines > 0 else ""


class RayLauncher(Launcher):
    """Launches each attempt as a Ray task on the cluster at ``address``, with the local
    launcher's directories (``output_root``, ``checkpoint_dir``)."""

    name = "ray"

    def __init__(self, address: str, output_root: str | Path, *, term_grace_s: float = 10.0,
                 checkpoint_dir: str | Path | None = None, num_gpus: int = 0,
                 hang_timeout_s: float | None = None) -> None:
        self.address = address
        self.hang_timeout_s = hang_timeout_s
        self.local = LocalProcessLauncher(output_root, term_grace_s=term_grace_s, checkpoint_dir=checkpoint_dir)
        self.output_root = self.local.output_root
        self.checkpoint_dir = self.local.checkpoint_dir
        self.term_grace_s = term_grace_s
        self.num_gpus = num_gpus
        self._ray: Any = None
        self._remote: Any = None

    def checkpoint_root(self, job_id: str) -> Path:
        return self.local.checkpoint_root(job_id)

    def attempt_dir(self, job_id: str, attempt_id: str) -> Path:
        return self.local.attempt_dir(job_id, attempt_id)

    def launch(self, spec: Any, job_id: str, attempt_id: str) -> RayLaunchHandle:
        if not spec.argv:
            raise LaunchError("cannot launch an empty command: give argv, e.g. ['python', 'train.py']")
        if self._ray is None:
            self._ray = connect(self.address)
            self._remote = self._ray.remote(run_local_attempt)
        options: dict[str, Any] = {"num_cpus": 1, "num_returns": "streaming", "max_retries": 0,
                                   "name": f"{job_id}/{attempt_id}@{self.output_root.name}"}
        if self.num_gpus:
            options["num_gpus"] = self.num_gpus
        checkpoint = str(self.checkpoint_dir) if self.checkpoint_dir is not None else None
        stream = self._remote.options(**options).remote(
            spec.model_dump(mode="json"), job_id, attempt_id, str(self.output_root), checkpoint, self.term_grace_s,
            self.hang_timeout_s)
        return RayLaunchHandle(self._ray, stream, self.attempt_dir(job_id, attempt_id), self.term_grace_s,
                               name=options["name"])
