"""A coordinator task's attempt inside a Ray worker: plain functions that the coordinator's
Ray dispatcher turns into Ray tasks (``ray.remote(fn).options(...)``).

``run_task_attempt`` runs one attempt of a coordinator task exactly as a worker agent runs a
lease: the same work directory layout (``<root>/<job>/<task>/<lease>/{inputs,out}``), the same
environment contract, ``spec.json`` and ``inputs.json``. The differences come from not
speaking HTTP: the inputs arrive as bytes (the coordinator read them from its artifact store),
and the log and the output files go back in the messages the generator yields. It yields
``("started", placement)``, then ``("log", bytes)`` whenever the log grew (at most every
``log_every_s``) and ``("alive", None)`` every ``ALIVE_S`` otherwise, then one
``("finished", result)`` or ``("refused", reason)``. The attempt is watched for hangs as a
worker agent watches its tasks (the job's own ``FLASHML_HANG_TIMEOUT_S`` in its env, else the
Ray node's, else the default rule): a hung attempt is stopped, its stacks are appended to its log, and its result says
so (``hung``: which ranks stopped advancing, and where). A cancel (``ray.cancel``) arrives at a
yield: the attempt's processes are stopped before it propagates. A Ray worker killed outright cannot do that; ``stop_leftovers`` (run on the
same node) stops what it left, found by the attempt's environment marker.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from flashruntime.agent.inputs import lease_dirs, prepare_inputs, write_spec
from flashruntime.agent.attempt_files import output_files, start_child
from flashruntime.agent.log_shipper import read_task_log
from flashruntime.agent.task_command import build_command, child_env
from flashruntime.errors import InvalidSubmission, TaskRefused
from flashruntime.launchers.local import read_log_tail, stop_leftover_attempt
from flashruntime.monitor import ResourceSampler, evidence_from_telemetry
from flashruntime.monitor.hang_watch import HangWatch, hang_setting, task_hang_setting
from flashruntime.protocol.v1alpha1 import Lease
from flashruntime.ray_backend.cluster import ALIVE, ALIVE_S, placement

__all__ = [
    "DATASETS_ENV",
    "WORK_DIR_ENV",
    "run_task_attempt",
    "stop_leftovers",
    "work_root",
]

# Where a Ray node keeps attempts' work directories (default: <tmp>/flashruntime-ray).
WORK_DIR_ENV = "FLASHML_RAY_WORK_DIR"
# A Ray node's local datasets, NAME=PATH[,NAME=PATH...]: a task's local_inputs are placed on
# nodes that declare the resource dataset:<NAME> and read from these paths.
DATASETS_ENV = "FLASHML_RAY_DATASETS"
TERM_GRACE_S = 10.0
POLL_S = 0.1


def work_root() -> Path:
    return Path(os.environ.get(WORK_DIR_ENV) or Path(tempfile.gettempdir()) / "flashruntime-ray")


class _ShippedInputs:
    """The input artifacts the dispatcher read, offered as ``prepare_inputs`` downloads them."""

    def __init__(self, blobs: Mapping[str, bytes]) -> None:
        self._blobs = blobs

    def download(self, key: str, path: Path) -> None:
        path.write_bytes(self._blobs[key])


def _datasets() -> dict[str, str]:
    entries = [entry for entry in os.environ.get(DATASETS_ENV, "").split(",") if entry.strip()]
    return dict(entry.strip().split("=", 1) for entry in entries if "=" in entry)


def run_task_attempt(lease_json: dict[str, Any], inputs: dict[str, bytes],
                     log_every_s: float = 5.0) -> Iterator[tuple[str, Any]]:
    """One attempt of a coordinator task (see the module docstring for what it yields)."""
    lease = Lease.model_validate(lease_json)
    where = placement()
    yield "started", where
    dirs = None
    try:
        dirs = lease_dirs(work_root(), lease.job_id, lease.task_id, lease.lease_id)
        # The coordinator checked the submitter's permission to run commands when it accepted
        # the job: a Ray backend is the operator's own, so it runs as a trusted agent does.
        argv, payload_env = build_command(lease.payload, "trusted", dirs)
        params = lease.payload.get("params", {})
        if not isinstance(params, dict):
            raise TaskRefused(f"payload params must be an object, got {params!r}")
        resolved = prepare_inputs(_ShippedInputs(inputs), lease.payload, dirs, _datasets())  # type: ignore[arg-type]
        write_spec(dirs, lease.task_id, params, resolved)
        env = child_env(payload_env, dirs, lease)
        if where["gpu_ids"]:
            env.setdefault("CUDA_VISIBLE_DEVICES", ",".join(where["gpu_ids"]))
        hang_timeout_s = task_hang_setting(payload_env, hang_setting(None, os.environ))
        handle = start_child(argv, env, dirs, TERM_GRACE_S)
    except (TaskRefused, InvalidSubmission, OSError) as exc:
        if dirs is not None:
            shutil.rmtree(dirs.root, ignore_errors=True)
        reason = str(exc) if not isinstance(exc, OSError) else f"Ray worker error preparing the task: {exc}"
        yield "refused", reason
        return
    started = time.monotonic()
    sampler = ResourceSampler(dirs.root, int(handle.execution_id), period_s=2.0)
    sampler.start()
    hangs = HangWatch(handle, lease.lease_id, hang_timeout_s, lambda _type, _message: None).start()
    shipped_at, shipped_size, alive_at = started, 0, started
    try:
        state = handle.wait(timeout_seconds=0)
        while not state.terminal:
            state = handle.wait(timeout_seconds=POLL_S)
            now = time.monotonic()
            if now - shipped_at >= log_every_s:
                size = _size(dirs.log)
                if size != shipped_size:
                    data = read_task_log(dirs.log)
                    if data is not None:
                        yield "log", data
                        alive_at = now
                    shipped_size = size
                shipped_at = now
            if now - alive_at >= ALIVE_S:
                yield ALIVE, None  # where a cancel of a streaming task takes effect
                alive_at = now
    except BaseException:
        # ray.cancel (KeyboardInterrupt), or the generator closed: nothing outlives the attempt.
        hangs.stop()
        handle.cancel(grace_s=2.0)
        sampler.stop()  # stop() may be called twice; its last reading must not outlive the directory
        shutil.rmtree(dirs.root, ignore_errors=True)
        raise
    finally:
        sampler.stop()
    hung = hangs.stop()
    if hung is not None:  # the stacks travel in the log, the only evidence that leaves the node
        with open(dirs.log, "a", encoding="utf-8") as log:
            log.write("\n" + hung.stacks_path.read_text(encoding="utf-8"))
    wall_seconds = time.monotonic() - started
    exit_code = handle.exit_code
    metrics = dirs.out / "metrics.json"
    files = []
    if exit_code == 0 and metrics.is_file() and not metrics.is_symlink():
        files = [(relative, path.read_bytes()) for relative, path in output_files(dirs.out)]
    evidence = evidence_from_telemetry(dirs.telemetry, exit_code=exit_code, wall_seconds=wall_seconds)
    result = {
        "exit_code": exit_code,
        "wall_seconds": wall_seconds,
        "log": read_task_log(dirs.log) or b"",
        "log_tail": read_log_tail(dirs.log),
        "files": files,
        "evidence": {**evidence.model_dump(mode="json"), **where},
        "hung": None if hung is None else hung.evidence(),
    }
    shutil.rmtree(dirs.root, ignore_errors=True)  # the task's checkpoint directory stays for its next attempt
    yield "finished", result


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


def stop_leftovers(job_id: str, task_id: str, lease_id: str) -> list[int]:
    """Stop every process an attempt on this node left behind (its Ray worker was killed),
    found by its environment marker, and remove its work directory; the pids signalled."""
    root = work_root() / job_id / task_id / lease_id
    stopped = sorted(stop_leftover_attempt(root / "out", TERM_GRACE_S))
    shutil.rmtree(root, ignore_errors=True)
    return stopped
