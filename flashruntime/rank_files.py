"""The files a rank running ``flashruntime.torch`` writes under its attempt's ``ranks/``, named
in one place: its heartbeat ``rank-<r>.json``, the record of the save it made on a
preemption notice ``rank-<r>.preempted.json``, and the stack dump it writes itself on
``SELF_DUMP_SIGNAL``, ``stack-<r>.txt``. The torch helper writes them; the runtime's watchers
and the run page read them, a heartbeat being only a ``rank-<r>.json``. Standard library only:
a rank imports this, never the runtime's monitoring code.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

__all__ = [
    "RANKS_DIR",
    "SELF_DUMP_SIGNAL",
    "heartbeat_path",
    "heartbeat_paths",
    "preempted_path",
    "preempted_paths",
    "self_dump_path",
]

RANKS_DIR = "ranks"  # under the attempt's output directory
SELF_DUMP_SIGNAL = getattr(signal, "SIGUSR2", None)
_HEARTBEAT = re.compile(r"rank-(\d+)\.json")
_PREEMPTED = re.compile(r"rank-(\d+)\.preempted\.json")


def heartbeat_path(ranks_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(ranks_dir) / f"rank-{rank}.json"


def preempted_path(ranks_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(ranks_dir) / f"rank-{rank}.preempted.json"


def self_dump_path(ranks_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(ranks_dir) / f"stack-{rank}.txt"


def _matching(ranks_dir: str | os.PathLike[str], name: re.Pattern[str]) -> list[Path]:
    try:
        entries = os.listdir(ranks_dir)
    except OSError:
        return []
    found = [(int(match.group(1)), entry) for entry in entries if (match := name.fullmatch(entry))]
    return [Path(ranks_dir) / entry for _, entry in sorted(found)]


def heartbeat_paths(ranks_dir: str | os.PathLike[str]) -> list[Path]:
    """Every rank's heartbeat under ``ranks_dir``, in rank order (none when it does not exist)."""
    return _matching(ranks_dir, _HEARTBEAT)


def preempted_paths(ranks_dir: str | os.PathLike[str]) -> list[Path]:
    """Every rank's record of its preemption save under ``ranks_dir``, in rank order."""
    return _matching(ranks_dir, _PREEMPTED)
