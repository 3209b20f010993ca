"""A preemption notice inside the ranks: a handler for the notice signals (see
``flashruntime.recovery.preemption``) only raises a flag; at each ``checkpoint`` call the
ranks agree on it (one all_reduce(MAX) of one number), so every rank saves the same step,
then each says what it saved and leaves cleanly (``destroy_process_group``, exit 0).

Armed only where flashruntime launched the script (``FLASHML_ATTEMPT_ID`` set), which every
rank of a launch sees alike: the agreement is a collective, and all ranks make it or none.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from flashruntime.files import write_atomic
from flashruntime.rank_files import RANKS_DIR, preempted_path
from flashruntime.recovery.preemption import preempt_settings, signal_name
from flashruntime.torch import _state


@dataclass
class NoticeState:
    """Decided at the first ``arm``; the flag is raised by the signal handler."""

    armed: bool | None = None  # None: not decided yet
    grace_s: float = 0.0
    received: int | None = None  # the first notice signal
    received_at: float | None = None  # time.time() when it came


NOTICE = NoticeState()


def _on_notice(signum: int, frame: Any) -> None:
    if NOTICE.received is None:
        NOTICE.received, NOTICE.received_at = signum, time.time()


def arm() -> bool:
    """Decide once whether this process takes notices, and install the handler for them
    (main thread, over the default action only: a handler of the script's own is left to
    decide). Whether it is armed depends on the environment alone, the same on every rank."""
    if NOTICE.armed is not None:
        return NOTICE.armed
    NOTICE.armed = False
    if not os.environ.get("FLASHML_ATTEMPT_ID"):
        return False
    settings = preempt_settings(os.environ)
    if not settings.signals:
        return False
    NOTICE.grace_s = settings.grace_s
    NOTICE.armed = True
    if threading.current_thread() is threading.main_thread():
        for signum in settings.signals:
            if signal.getsignal(signum) is signal.SIG_DFL:
                signal.signal(signum, _on_notice)
    return True


def agreed() -> bool:
    """Whether any rank has the notice; collective when armed with several ranks."""
    if not arm():
        return False
    flag = NOTICE.received is not None
    if _state.world_size() <= 1:
        return flag
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return flag
    device = _state.device() if dist.get_backend() == "nccl" else "cpu"
    votes = torch.tensor([1 if flag else 0], dtype=torch.int64, device=device)
    dist.all_reduce(votes, op=dist.ReduceOp.MAX)
    return bool(votes.item())


def leave(step: int) -> None:
    """After every rank saved ``step``: record it, end the process group and exit 0."""
    now = time.time()
    record = {
        "rank": _state.rank(), "world_size": _state.world_size(), "pid": os.getpid(), "step": step,
        "signal": None if NOTICE.received is None else signal_name(NOTICE.received),
        "noticed_at": NOTICE.received_at, "saved_at": now, "grace_s": NOTICE.grace_s,
    }
    with contextlib.suppress(OSError):  # the checkpoint is what matters; the record only tells the driver of it
        directory = _state.output_dir() / RANKS_DIR
        directory.mkdir(parents=True, exist_ok=True)
        write_atomic(preempted_path(directory, _state.rank()), json.dumps(record) + "\n")
    heard = "another rank's notice" if record["signal"] is None else f"the preemption notice ({record['signal']})"
    print(f"flashruntime: rank {_state.rank()} saved step {step} after {heard}; leaving", file=sys.stderr,
          flush=True)
    # Leaving anyway: a rank that cannot destroy its group still exits.
    with contextlib.suppress(Exception):
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    raise SystemExit(0)
