"""``ResourceSampler``: a daemon thread appending machine and process-tree samples.

Ticks immediately, then every ``period_s``, and once more when stopped, so an attempt
shorter than one period still gets a CPU reading over its life. With psutil each tick
covers the root pid and all its descendants (process objects cached so per-process CPU
is measured between ticks) and the machine's CPU use since the sampler's previous
reading; without it only the root appears, with nulls, and ``limited`` is true.
Sampling must never hurt the job it watches, so every exception is swallowed.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from flashruntime.monitor.gpus import query_gpus

TELEMETRY_NAME = "telemetry.jsonl"


def _load_psutil() -> Any:
    try:
        import psutil
    except Exception:
        return None
    return psutil


def _cpu_percent(before: Any, after: Any) -> float | None:
    """Machine CPU use between two ``psutil.cpu_times()`` readings, counted as psutil's
    ``cpu_percent`` counts it; None when no CPU time passed between them.

    The sampler keeps its own previous reading instead of calling ``psutil.cpu_percent``,
    whose baseline is per calling thread and shared with anything else in the process."""
    delta = {name: max(0.0, getattr(after, name) - getattr(before, name)) for name in after._fields}
    total = sum(delta.values()) - delta.get("guest", 0.0) - delta.get("guest_nice", 0.0)  # in user/nice already
    if total <= 0:
        return None
    busy = total - delta.get("idle", 0.0) - delta.get("iowait", 0.0)
    return round(min(100.0, max(0.0, 100.0 * busy / total)), 1)


def _load_avg() -> list[float] | None:
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except (AttributeError, OSError):
        return None


class ResourceSampler:
    """Samples ``root_pid`` and its descendants into ``<output_dir>/telemetry.jsonl``."""

    def __init__(self, output_dir: str | os.PathLike[str], root_pid: int, period_s: float = 2.0) -> None:
        self.output_dir = Path(output_dir)
        self.root_pid = int(root_pid)
        self.period_s = float(period_s)
        self.path = self.output_dir / TELEMETRY_NAME
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._psutil: Any = None
        self._psutil_loaded = False
        self._procs: dict[int, Any] = {}  # pid -> psutil.Process, kept so cpu_percent has a baseline
        self._cpu_times: Any = None  # the previous psutil.cpu_times(): the machine's CPU use is measured from it
        self._last_pids: set[int] = set()

    # lifecycle ---------------------------------------------------------------
    def start(self) -> None:
        """Start the daemon thread (first tick immediately); a second call does nothing."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name=f"flashruntime-sampler-{self.root_pid}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop ticking and join the thread; a no-op if never started."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _loop(self) -> None:
        while True:
            self.tick()
            if self._stop.wait(self.period_s):
                self.tick()  # the closing reading: covers the time since the last tick
                return

    # sampling ----------------------------------------------------------------
    def last_seen_pids(self) -> set[int]:
        """The root and descendant pids seen by the last tick that could still see the tree (a copy).

        A tick that finds the root gone (or a zombie, its children already orphaned)
        leaves the set as it was: the launcher's non-Linux sweep reads it exactly then,
        to find descendants that outlived the root. Without psutil it is the root alone.
        """
        with self._lock:
            return set(self._last_pids)

    def tick(self) -> dict[str, Any] | None:
        """Take one sample now and append it; returns the record (None if it failed)."""
        try:
            record = self.sample()
            self.output_dir.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(record) + "\n")
            return record
        except Exception:
            return None

    def sample(self) -> dict[str, Any]:
        """One telemetry record (not written)."""
        if not self._psutil_loaded:
            self._psutil, self._psutil_loaded = _load_psutil(), True
        psutil = self._psutil
        machine = self._machine(psutil)
        if psutil is not None:
            processes, tree_visible = self._processes(psutil)
        else:
            processes, tree_visible = [self._bare_root()], True
        if tree_visible:
            with self._lock:
                self._last_pids = {row["pid"] for row in processes}
        return {"ts": time.time(), "machine": machine, "processes": processes}

    def _machine(self, psutil: Any) -> dict[str, Any]:
        machine: dict[str, Any] = {
            "hostname": socket.gethostname(),
            "cpu_count": os.cpu_count(),
            "load_avg": _load_avg(),
            "cpu_percent": None,
            "mem_total": None,
            "mem_used": None,
            "limited": psutil is None,
        }
        if psutil is not None:
            try:
                times = psutil.cpu_times()
                if self._cpu_times is None:
                    self._cpu_times = times  # the first reading is the baseline: nothing measured yet
                else:
                    machine["cpu_percent"] = _cpu_percent(self._cpu_times, times)
                    if machine["cpu_percent"] is not None:
                        self._cpu_times = times
            except Exception:
                pass
            try:
                memory = psutil.virtual_memory()
                machine["mem_total"], machine["mem_used"] = int(memory.total), int(memory.used)
            except Exception:
                pass
        machine["gpus"] = query_gpus()
        return machine

    def _bare_root(self) -> dict[str, Any]:
        return {"pid": self.root_pid, "ppid": None, "cmd": None, "cpu_percent": None, "rss_bytes": None,
                "create_time": None, "status": None}

    def _processes(self, psutil: Any) -> tuple[list[dict[str, Any]], bool]:
        """Rows of the root's tree, and whether that tree was visible: False once the
        root is gone or a zombie, when its orphans no longer descend from it."""
        try:
            root = self._cached(psutil, self.root_pid)
            tree = [root, *root.children(recursive=True)]
            tree_visible = root.status() != psutil.STATUS_ZOMBIE
        except Exception:
            self._procs.clear()
            return [], False  # the root is gone: nothing of its tree can be attributed any more
        rows: list[dict[str, Any]] = []
        seen: set[int] = set()
        for proc in tree:
            try:
                cached, first_sighting = self._cached_with_flag(psutil, proc)
                rows.append(self._row(cached, first_sighting))
                seen.add(cached.pid)
            except Exception:
                continue
        for pid in list(self._procs):
            if pid not in seen:
                del self._procs[pid]
        return rows, tree_visible

    def _cached(self, psutil: Any, pid: int) -> Any:
        proc = self._procs.get(pid)
        if proc is not None and proc.is_running():
            return proc
        return psutil.Process(pid)

    def _cached_with_flag(self, psutil: Any, proc: Any) -> tuple[Any, bool]:
        cached = self._procs.get(proc.pid)
        # is_running() compares create times, so a recycled pid counts as a new process.
        if cached is not None and cached.is_running():
            return cached, False
        self._procs[proc.pid] = proc
        return proc, True

    @staticmethod
    def _row(proc: Any, first_sighting: bool) -> dict[str, Any]:
        with proc.oneshot():
            percent = proc.cpu_percent(interval=None)
            try:
                cmdline = proc.cmdline()
                cmd = " ".join(cmdline) if cmdline else proc.name()
            except Exception:
                cmd = None
            return {
                "pid": proc.pid,
                "ppid": proc.ppid(),
                "cmd": cmd,
                "cpu_percent": None if first_sighting else percent,
                "rss_bytes": int(proc.memory_info().rss),
                "create_time": proc.create_time(),
                "status": proc.status(),
            }
