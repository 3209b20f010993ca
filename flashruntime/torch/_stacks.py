"""A rank's own stack dump on request: faulthandler registered on ``SELF_DUMP_SIGNAL``, writing
every thread's stack to ``<output dir>/ranks/stack-<rank>.txt``. The hang watch asks for it where
py-spy cannot attach; the rank keeps running. Armed once per process, and only over the signal's
default action, so a handler of the script's own is never replaced. Never raises. The signal
and the file are the contract ``flashruntime.monitor.stacks`` reads (kept apart so a rank never
imports the runtime's monitoring code).
"""

from __future__ import annotations

import faulthandler
import signal
from pathlib import Path
from typing import IO

SELF_DUMP_SIGNAL = getattr(signal, "SIGUSR2", None)
_ARMED: list[IO[str]] = []  # the open dump file, kept for the life of the process
_TRIED = [False]


def self_dump_path(ranks_dir: Path, rank: int) -> Path:
    return Path(ranks_dir) / f"stack-{rank}.txt"


def arm(ranks_dir: Path, rank: int) -> bool:
    """Register the dump of ``rank`` into ``ranks_dir`` (first call only); whether it is armed."""
    if _TRIED[0]:
        return bool(_ARMED)
    _TRIED[0] = True
    try:
        if SELF_DUMP_SIGNAL is None or signal.getsignal(SELF_DUMP_SIGNAL) is not signal.SIG_DFL:
            return False
        handle = open(self_dump_path(ranks_dir, rank), "a", encoding="utf-8")  # noqa: SIM115 - held open
        faulthandler.register(SELF_DUMP_SIGNAL, file=handle, all_threads=True, chain=False)
        _ARMED.append(handle)
        return True
    except Exception:  # noqa: BLE001 - a dump that cannot be armed must never stop training
        return False
