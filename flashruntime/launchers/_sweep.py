"""Finding and stopping every process of one attempt.

torchrun starts each rank in its own session, so a signal to the leader's process
group never reaches the ranks. An attempt's processes are therefore the leader's
group plus every process whose *initial* environment carries the attempt's unique
``FLASHML_OUTPUT_DIR=<attempt dir>``, found through /proc on Linux. Elsewhere the
fallback is best effort: the pids the resource sampler last saw in the leader's tree,
signalled with whatever the platform has (no process groups on Windows, where
``os.kill`` terminates outright).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

_PROC = Path("/proc")


def proc_available() -> bool:
    return _PROC.is_dir() and (_PROC / "self" / "environ").exists()


def _load_psutil() -> Any:
    try:
        import psutil
    except Exception:  # noqa: BLE001 - optional (the `monitor` extra); a broken install must not break cleanup
        return None
    return psutil


def _own_group() -> int | None:
    getpgrp = getattr(os, "getpgrp", None)  # POSIX only
    return getpgrp() if getpgrp is not None else None


def _hard_kill() -> int:
    # Windows has no SIGKILL; there os.kill(pid, SIGTERM) is already TerminateProcess.
    return getattr(signal, "SIGKILL", signal.SIGTERM)


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


def live_groups(pids: Iterable[int]) -> dict[int, int | None]:
    """pid -> pgid of those ``pids`` that are alive and not zombies."""
    found: dict[int, int | None] = {}
    for pid in pids:
        fields = _stat_fields(pid)
        if fields is not None and fields[0] not in ("Z", "X"):
            found[pid] = fields[1]
    return found


def _has_marker(pid: int, marker: bytes) -> bool:
    try:
        environ = (_PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return False
    return marker in environ.split(b"\0")


def _running_without_proc(pid: int, psutil: Any) -> bool:
    """Whether ``pid`` is alive and not a zombie, where /proc cannot say: psutil (when
    installed) tells zombies apart; plain ``kill(pid, 0)`` cannot (POSIX only: on Windows
    signal 0 is CTRL_C_EVENT, so without psutil a pid there is never assumed alive)."""
    if psutil is not None:
        try:
            return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
        except (psutil.Error, OSError, ValueError):  # gone, not ours, or not a pid
            return False
    if sys.platform == "win32":
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def attempt_processes(
    marker: bytes, pgids: Iterable[int], extra_pids: Iterable[int] = ()
) -> dict[int, int | None]:
    """Live (non-zombie) processes of the attempt: pid -> pgid (None where the platform
    has no process groups).

    ``marker`` is the exact environment entry, ``pgids`` the process groups known to
    belong to the attempt, ``extra_pids`` pids seen by other means (the sampler's set).
    With /proc the marker scan is the whole answer: a sampler-seen pid that still
    carries the marker is found by it anyway, and one that does not may be a recycled
    pid, never to be signalled (the set may be seconds old). Without /proc the sampler's
    set is the only view there is, so it is taken as is (best effort).
    """
    groups = set(pgids)
    me, my_group = os.getpid(), _own_group()
    found: dict[int, int | None] = {}
    if proc_available():
        uid = os.getuid()
        for entry in _PROC.iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            if pid == me:
                continue
            fields = _stat_fields(pid)
            if fields is None or fields[0] in ("Z", "X"):
                continue
            _state, pgid = fields
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
        return found
    psutil = _load_psutil()
    for pid in extra_pids:
        if pid in found or pid == me or not _running_without_proc(pid, psutil):
            continue
        getpgid = getattr(os, "getpgid", None)  # POSIX only
        try:
            found[pid] = getpgid(pid) if getpgid is not None else None
        except OSError:
            continue
    return found


def _signal_all(processes: dict[int, int | None], sig: int) -> None:
    killpg = getattr(os, "killpg", None)  # POSIX only
    if killpg is not None:
        my_group = _own_group()
        for pgid in {group for group in processes.values() if group is not None}:
            if pgid > 1 and pgid != my_group:
                try:
                    killpg(pgid, sig)
                except OSError:
                    pass
    for pid in processes:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def sweep(
    find: Callable[[], dict[int, int | None]],
    grace_s: float,
    *,
    poll_s: float = 0.05,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> set[int]:
    """SIGTERM every process ``find`` reports, wait up to ``grace_s``, then SIGKILL the
    survivors until none is left (on Windows, without SIGKILL, both are TerminateProcess).
    Returns every pid that was signalled."""
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
        _signal_all(processes, _hard_kill())
        sleep(poll_s)
        processes = find()
        touched |= set(processes)
    return touched
