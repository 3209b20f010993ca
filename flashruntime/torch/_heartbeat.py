"""Per-rank heartbeat files ``<output dir>/ranks/rank-<rank>.json``.

Each rank says who it is, on which host, the last step it reached and its recent compute
times (see ``_compute_time``), so a viewer or an operator can tell a slow rank from a dead one
and a straggler from its peers. Writes are atomic (temp file + replace), throttled
to one per second unless forced, and never raise into the training loop.
"""

from __future__ import annotations

import json
import os
import socket
import time

from flashruntime.files import write_atomic
from flashruntime.rank_files import RANKS_DIR, heartbeat_path
from flashruntime.torch import _compute_time, _hang, _state

THROTTLE_SECONDS = 1.0


def heartbeat_due(last_beat: float | None, now: float, *, force: bool = False) -> bool:
    """Pure throttle: write when forced, on the first beat, or a second after the last one."""
    return force or last_beat is None or now - last_beat >= THROTTLE_SECONDS


def heartbeat_record(step: int | None, *, ts: float) -> dict[str, object]:
    """The heartbeat document of this process."""
    return {
        "rank": _state.rank(),
        "local_rank": _state.local_rank(),
        "pid": os.getpid(),
        "device": _state.STATE.device,
        "backend": _state.STATE.backend,
        "world_size": _state.world_size(),
        "step": step,
        "ts": ts,
        "host": socket.gethostname(),
        "compute_s": _compute_time.recent(),
    }


def beat(step: int | None = None, *, force: bool = False, now: float | None = None) -> bool:
    """Remember ``step`` (when given) and write the heartbeat file if due.

    Returns whether a file was written. ``now`` is a monotonic reading (tests pass it).
    Every exception is swallowed: a heartbeat must never stop training.
    """
    try:
        state = _state.STATE
        if step is not None:
            state.last_step = int(step)
        moment = time.monotonic() if now is None else now
        if not heartbeat_due(state.last_beat, moment, force=force or _compute_time.take_first_full()):
            return False
        record = heartbeat_record(state.last_step, ts=time.time())
        directory = _state.output_dir() / RANKS_DIR
        directory.mkdir(parents=True, exist_ok=True)
        path = heartbeat_path(directory, _state.rank())
        write_atomic(path, json.dumps(record) + "\n")
        _hang.arm(directory, _state.rank(), path)
        state.last_beat = moment
        return True
    except Exception:
        return False
