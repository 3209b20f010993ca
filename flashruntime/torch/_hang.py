"""What the hang watch needs from a rank: its own stack dump on request, and word that it is
exiting. The dump: faulthandler registered on ``SELF_DUMP_SIGNAL``, writing every thread's stack
to ``<output dir>/ranks/stack-<rank>.txt``, asked for where py-spy cannot attach; the rank keeps
running. It is armed only over the signal's default action, so a handler of the script's own is
never replaced. The word: at exit, the rank's heartbeat gains ``"exiting": true``, so the
teardown of a rank that finished (destroying its process group, freeing its memory) is never
taken for a hang. Armed once per process, by its first heartbeat; never raises. The signal and
the file are named in ``flashruntime.rank_files``, which ``flashruntime.monitor.stacks`` reads too.
"""

from __future__ import annotations

import atexit
import faulthandler
import json
import signal
from pathlib import Path
from typing import IO

from flashruntime.files import write_atomic
from flashruntime.rank_files import SELF_DUMP_SIGNAL, self_dump_path

_DUMP_FILE: list[IO[str]] = []  # the open dump file, kept for the life of the process
_ARMED = [False]


def arm(ranks_dir: Path, rank: int, heartbeat: Path) -> None:
    """Register the dump of ``rank`` into ``ranks_dir`` and the last word into ``heartbeat`` (first call only)."""
    if _ARMED[0]:
        return
    _ARMED[0] = True
    atexit.register(_say_exiting, Path(heartbeat))
    try:
        if SELF_DUMP_SIGNAL is None or signal.getsignal(SELF_DUMP_SIGNAL) is not signal.SIG_DFL:
            return
        handle = open(self_dump_path(ranks_dir, rank), "a", encoding="utf-8")  # noqa: SIM115 - held open
        faulthandler.register(SELF_DUMP_SIGNAL, file=handle, all_threads=True, chain=False)
        _DUMP_FILE.append(handle)
    except Exception:  # noqa: BLE001, S110 - a dump that cannot be armed must never stop training
        pass


def dump_armed() -> bool:
    return bool(_DUMP_FILE)


def _say_exiting(heartbeat: Path) -> None:
    try:
        record = json.loads(heartbeat.read_text(encoding="utf-8"))
        if isinstance(record, dict):
            write_atomic(heartbeat, json.dumps({**record, "exiting": True}) + "\n")
    except Exception:  # noqa: BLE001, S110 - the process is ending; nothing may stop that
        pass
