"""Every rank's Python stack, as evidence of a hang: ``py-spy dump`` where py-spy is installed
(the ``monitor`` extra) and may attach; else the dump a rank running the torch helper writes
itself on ``SELF_DUMP_SIGNAL`` (faulthandler, registered by ``flashruntime.torch``), which
needs no ptrace and leaves the rank running; else a line saying why there is none. A stopped
rank (SIGSTOP) runs no handler, but py-spy still reads it without pausing it (``--nonblocking``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from flashruntime.rank_files import SELF_DUMP_SIGNAL, self_dump_path

__all__ = [
    "SELF_DUMP_SIGNAL",
    "STACKS_NAME",
    "RankStack",
    "dump_stacks",
    "py_spy_path",
    "render_stacks",
    "self_dump_path",
]

STACKS_NAME = "hang-stacks.txt"  # in the attempt directory
PY_SPY_TIMEOUT_S = 20.0
SELF_DUMP_WAIT_S = 3.0
_POLL_S = 0.05


@dataclass(frozen=True)
class RankStack:
    """One process's stack dump: how it was taken and its text (or why there is none)."""

    rank: int | None
    pid: int
    method: str  # "py-spy", "py-spy --nonblocking", "faulthandler" or "none"
    text: str


def py_spy_path() -> str | None:
    """The py-spy installed beside this Python (a virtual environment's), else on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


def _has_frames(text: str) -> bool:
    return any(line.startswith("Thread ") for line in text.splitlines())


def _py_spy(exe: str, pids: list[int], extra: list[str], timeout_s: float) -> dict[int, str | tuple[str]]:
    """``py-spy dump`` of every pid at once: pid -> its dump, or (why not,)."""
    running: dict[int, subprocess.Popen[bytes]] = {}
    for pid in pids:
        try:
            running[pid] = subprocess.Popen([exe, "dump", *extra, "--pid", str(pid)], stdout=subprocess.PIPE,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        except OSError as exc:
            for process in running.values():
                process.kill()
                process.communicate()
            return {p: (f"py-spy could not start: {exc}",) for p in pids}
    deadline = time.monotonic() + timeout_s
    results: dict[int, str | tuple[str]] = {}
    for pid, process in running.items():
        try:
            out, _ = process.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            results[pid] = (f"py-spy took longer than {timeout_s:g} s",)
            continue
        text = out.decode(errors="replace")
        if process.returncode == 0 and _has_frames(text):
            results[pid] = text
        else:
            last = next((line for line in reversed(text.splitlines()) if line.startswith("Error")), text.strip()[-300:])
            results[pid] = (f"py-spy exit {process.returncode}: {last}",)
    return results


def _self_dump(pid: int, path: Path, wait_s: float, clock: Callable[[], float],
               sleep: Callable[[float], None]) -> str | None:
    """Ask ``pid`` for its own dump into ``path`` and return what it wrote (None: nothing came)."""
    if SELF_DUMP_SIGNAL is None or not path.is_file():
        return None
    try:
        before = path.stat().st_size
        os.kill(pid, SELF_DUMP_SIGNAL)
    except OSError:
        return None
    deadline, size, settled = clock() + wait_s, before, 0
    while clock() < deadline:
        sleep(_POLL_S)
        try:
            now_size = path.stat().st_size
        except OSError:
            return None
        if now_size > before and now_size == size:
            settled += 1
            if settled >= 2:  # unchanged for two polls: the dump is complete
                break
        else:
            settled = 0
        size = now_size
    if size <= before:
        return None
    with open(path, "rb") as handle:
        handle.seek(before)
        return handle.read(size - before).decode(errors="replace")


def dump_stacks(processes: Mapping[int, int | None], ranks_dir: Path, *, py_spy: str | None = None,
                use_py_spy: bool = True, timeout_s: float = PY_SPY_TIMEOUT_S, self_dump_wait_s: float = SELF_DUMP_WAIT_S,
                clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                ) -> list[RankStack]:
    """The stack of every process ``processes`` names (pid -> rank, None for a process that is
    no rank), in rank order. ``ranks_dir``: the attempt's ``ranks/``, where the torch helper's
    own dumps go. ``use_py_spy=False`` goes straight to the fallback. Never raises."""
    pids = sorted(processes, key=lambda pid: (processes[pid] is None, processes[pid] or 0, pid))
    exe = (py_spy or py_spy_path()) if use_py_spy else None
    found: dict[int, RankStack] = {}
    why: dict[int, str] = {}
    if exe is not None:
        for extra, method in (([], "py-spy"), (["--nonblocking"], "py-spy --nonblocking")):
            left = [pid for pid in pids if pid not in found]
            if not left:
                break
            for pid, result in _py_spy(exe, left, extra, timeout_s).items():
                if isinstance(result, str):
                    found[pid] = RankStack(processes[pid], pid, method, result)
                else:
                    why[pid] = result[0]
    else:
        reason = "py-spy is not installed (pip install 'flashruntime[monitor]')" if use_py_spy else "py-spy not used"
        why = dict.fromkeys(pids, reason)
    for pid in pids:
        if pid in found:
            continue
        rank = processes[pid]
        text = None if rank is None else _self_dump(pid, self_dump_path(ranks_dir, rank), self_dump_wait_s, clock,
                                                    sleep)
        if text:
            found[pid] = RankStack(rank, pid, "faulthandler", text)
        else:
            helper = "" if rank is None else "; no dump of its own either (it does not run flashruntime.torch, or is stopped)"
            found[pid] = RankStack(rank, pid, "none", f"no stack: {why.get(pid, 'unknown')}{helper}")
    return [found[pid] for pid in pids]


def render_stacks(stacks: list[RankStack], header: str) -> str:
    """The evidence file: ``header``, then each process's dump under a line naming it."""
    blocks = [header.rstrip("\n"), ""]
    for stack in stacks:
        who = "process" if stack.rank is None else f"rank {stack.rank}"
        blocks.append(f"===== {who} (pid {stack.pid}) — {stack.method} =====")
        blocks.append(stack.text.rstrip("\n"))
        blocks.append("")
    return "\n".join(blocks) + "\n"
