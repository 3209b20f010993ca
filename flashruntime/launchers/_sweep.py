"""Finding and stopping every process of one attempt.

torchrun starts each rank in its own session, so a signal to the leader's process
group never reaches the ranks. An attempt's processes are therefore the leader's
group plus every process whose *initial* environment carries the attempt's unique
``FLASHML_OUTPUT_DIR=<attempt dir>``, found through /proc on Linux.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path

_PROC = Path("/proc")


def proc_available() -> bool:
    return _PROC.is_dir() and (_PROC / "self" / "environ").exists()


def _stat_fields(pid: int) -> tuple[str, int] | None:
    """(state, pgid) of a live process, or None when it is gone."""
    try:
        raw = (_PROC / str(pid) / "stat").read_bytes().decode(errors="replace")
    except OSError:
        return None
    # comm may contain spaces and parentheses: fields resume after the last ')'.
    rest = raw[raw.rfind(")") + 2:].split()
    try:
        return rest[0], int(rest[2])
    except (IndexError, ValueError):
        return None


def _has_marker(pid: int, marker: bytes) -> bool:
    try:
        environ = (_PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return False
    return marker in environ.split(b"\0")


def attempt_processes(marker: bytes, pgids: Iterable[int], extra_pids: Iterable[int] = ()) -> dict[int, int]:
    """Live (non-zombie) processes of the attempt: pid -> pgid.

    ``marker`` is the exact environment entry, ``pgids`` the process groups known to
    belong to the attempt, ``extra_pids`` pids seen by other means (non-Linux fallback).
    """
    groups = set(pgids)
    me, my_group = os.getpid(), os.getpgrp()
    found: dict[int, int] = {}
    uid = os.getuid()
    with_proc = proc_available()
    if with_proc:
        for entry in _PROC.iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            if pid == me:
                continue
            fields = _stat_fields(pid)
            if fields is None or fields[0] in ("Z", "X"):
                continue
            state, pgid = fields
            if pgid in groups and pgid != my_group:
                found[pid] = pgid
                continue
            try:
                if entry.stat().st_uid != uid:
                    continue
            except OSError:
                continue
            if _has_marker(pid, marker):
                found[pid] = pgid
    for pid in extra_pids:
        if pid in found or pid == me:
            continue
        if with_proc:
            fields = _stat_fields(pid)
            if fields is None or fields[0] in ("Z", "X"):  # kill(pid, 0) succeeds on a zombie
                continue
        try:
            os.kill(pid, 0)
            found[pid] = os.getpgid(pid)
        except OSError:
            continue
    return found


def _signal_all(processes: dict[int, int], sig: int) -> None:
    my_group = os.getpgrp()
    for pgid in set(processes.values()):
        if pgid > 1 and pgid != my_group:
            try:
                os.killpg(pgid, sig)
            except OSError:
                pass
    for pid in processes:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def sweep(
    find: Callable[[], dict[int, int]],
    grace_s: float,
    *,
    poll_s: float = 0.05,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> set[int]:
    """SIGTERM every process ``find`` reports, wait up to ``grace_s``, then SIGKILL the
    survivors until none is left. Returns every pid that was signalled."""
    processes = find()
    touched = set(processes)
    if not processes:
        return touched
    _signal_all(processes, signal.SIGTERM)
    deadline = clock() + grace_s
    while processes and clock() < deadline:
        sleep(poll_s)
        processes = find()
        touched |= set(processes)
    kill_deadline = clock() + 30.0  # a process that survives SIGKILL this long is beyond our reach
    while processes and clock() < kill_deadline:
        _signal_all(processes, signal.SIGKILL)
        sleep(poll_s)
        processes = find()
        touched |= set(processes)
    return touched
