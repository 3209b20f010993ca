"""A preemption of the attempts this process drives: the notice signal is forwarded to each
attempt's ranks (torchrun's workers, or the command itself), the attempt gets the grace
budget to save and end by itself, whatever is left is then killed, and the attempt's record
says what its ranks saved. What follows is the driver's: a local run ends, and a re-run with
the same output directory resumes; an agent hands the checkpoint over and gives its lease back.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flashruntime.checkpoint.local import latest_valid_manifest
from flashruntime.launchers import LaunchState
from flashruntime.launchers.local import LocalLaunchHandle
from flashruntime.monitor.records import json_object
from flashruntime.rank_files import RANKS_DIR, preempted_paths
from flashruntime.recovery.preemption import signal_name

__all__ = ["PREEMPTED", "Notice", "notice_targets"]

PREEMPTED = "PREEMPTED"  # an attempt row's state once the notice reached it
_PROC = Path("/proc")
_TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")
_RESUME_LOCAL = "the restart budget is untouched; submit again with the same output_dir to resume from step {step}"
_RESUME_NEWEST_LOCAL = "submit again with the same output_dir to resume from the newest checkpoint it kept"


def _cmdline(pid: int) -> list[str]:
    try:
        raw = (_PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _parent(pid: int) -> int | None:
    try:
        raw = (_PROC / str(pid) / "stat").read_bytes().decode(errors="replace")
    except OSError:
        return None
    rest = raw[raw.rfind(")") + 2:].split()  # comm may hold spaces and parentheses
    try:
        return int(rest[1])
    except (IndexError, ValueError):
        return None


def is_torchrun(argv: list[str]) -> bool:
    """``torchrun ...``, ``python .../torchrun ...`` (its script's shebang) or ``python -m torch.distributed.run``."""
    head = [os.path.basename(part) for part in argv[:2]]
    if "torchrun" in head:
        return True
    return any(argv[i] == "-m" and argv[i + 1] in _TORCHRUN_MODULES for i in range(min(len(argv) - 1, 3)))


def _is_bwrap(argv: list[str]) -> bool:
    return bool(argv) and os.path.basename(argv[0]) == "bwrap"


def notice_targets(leader: int, processes: set[int], *, cmdline: Callable[[int], list[str]] = _cmdline,
                   parent: Callable[[int], int | None] = _parent) -> list[int]:
    """Who gets the notice: the command, seen through the sandbox's launcher (``bwrap``, which
    forwards no signal, and its init in the task's pid namespace), or, when the command is
    torchrun, torchrun's own workers (a signal torchrun does not handle would end it and
    orphan them; one it does handle, it answers by stopping them itself). Never the rest of
    the tree: a data loader's worker process dies of a SIGTERM and takes its rank down with it.
    A torchrun with no worker yet (still in its rendezvous) is told itself."""
    seen = {leader}
    while _is_bwrap(cmdline(leader)):
        children = sorted(pid for pid in processes if pid not in seen and parent(pid) == leader)
        if len(children) != 1:
            break
        leader = children[0]
        seen.add(leader)
    if is_torchrun(cmdline(leader)):
        workers = sorted(pid for pid in processes if pid != leader and parent(pid) == leader)
        if workers:
            return workers
    return [leader]


class Notice:
    """One preemption notice (``signum``) and what became of each attempt it reached.
    ``clock`` is monotonic seconds (tests pass a fake one)."""

    def __init__(self, signum: int, grace_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.signum = signum
        self.grace_s = grace_s
        self.clock = clock
        self.deadline = clock() + grace_s
        # id(handle) -> the handle, the pids told, when, when it ended, whether it had to be killed
        self._reached: dict[int, dict[str, Any]] = {}

    @property
    def name(self) -> str:
        return signal_name(self.signum)

    def remaining(self) -> float:
        return max(0.0, self.deadline - self.clock())

    def reached(self, handle: Any) -> bool:
        return id(handle) in self._reached

    def forward(self, handle: Any) -> None:
        """Send the notice to ``handle``'s ranks, once; an attempt on another machine (a Ray
        task), or one that has ended, is not reached and is cancelled as before."""
        if not isinstance(handle, LocalLaunchHandle) or self.reached(handle) or handle.poll().terminal:
            return
        pids = notice_targets(int(handle.execution_id), handle.processes())
        told: list[int] = []
        # Reached before any rank is told: one that saves and leaves at once ends an attempt
        # its driver must already see as preempted.
        self._reached[id(handle)] = {"handle": handle, "told": told, "at": self.clock(), "ended": None,
                                     "killed": False}
        for pid in pids:
            try:
                os.kill(pid, self.signum)
            except OSError:  # gone meanwhile
                continue
            told.append(pid)

    def ended_before(self, handle: Any) -> None:
        """``handle`` ended before the notice could be forwarded (its ranks got the platform's
        signal themselves): reported like a reached attempt that was told nothing."""
        if not self.reached(handle):
            now = self.clock()
            self._reached[id(handle)] = {"handle": handle, "told": [], "at": now, "ended": now, "killed": False}

    def told(self, handle: Any) -> list[int]:
        """The pids the notice was sent to for ``handle`` (reached ones only)."""
        return list(self._reached[id(handle)]["told"])

    def killed(self, handle: Any) -> None:
        """``handle`` is being killed without the rest of its grace (a second interrupt says hurry)."""
        if self.reached(handle):
            self._reached[id(handle)]["killed"] = True

    def settle(self, handle: Any) -> LaunchState:
        """Wait, until the grace runs out, for a reached attempt to end by itself; kill what is
        left then. Returns its terminal state (CANCELLED where the kill was needed)."""
        entry = self._reached[id(handle)]
        state = handle.wait(self.remaining())
        if not state.terminal:
            entry["killed"] = True
            handle.cancel(grace_s=0)  # the grace is spent: the platform's kill is due now
            state = handle.poll()
            state = state if state.terminal else LaunchState.CANCELLED
        if entry["ended"] is None:
            entry["ended"] = self.clock()
        return state

    def report(self, handle: Any, attempt_id: str, checkpoint_dir: Path | None, *,
               resume_from: str = _RESUME_LOCAL, resume_newest: str = _RESUME_NEWEST_LOCAL) -> tuple[dict[str, Any], str]:
        """The ``preempted`` section of the attempt's row and the event's message: the step
        every rank saved (from their records and the verified manifest), and whether the
        attempt ended within the grace. The message ends with what resumes it: ``resume_from``
        (formatted with ``step``) after a save, else ``resume_newest``."""
        entry = self._reached[id(handle)]
        told = entry["told"]
        ended_at = self.clock() if entry["ended"] is None else entry["ended"]
        ended_in_s = round(max(0.0, ended_at - entry["at"]), 3)
        within = not entry["killed"] and ended_at <= self.deadline
        records = _rank_records(Path(handle.output_dir))
        world = max((int(r.get("world_size") or 1) for r in records), default=0)
        steps = {r.get("step") for r in records}
        saved_step = next(iter(steps)) if records and len(records) == world and len(steps) == 1 else None
        manifest = None
        if isinstance(saved_step, int):
            root = checkpoint_dir if checkpoint_dir is not None else Path(handle.output_dir).parent / "ckpt"
            manifest = latest_valid_manifest(root, pattern=f"step-{saved_step:06d}")
            if manifest is None:
                saved_step = None  # the ranks said so, but nothing verifies: no step to resume from
        row = {
            "signal": self.name, "grace_s": self.grace_s, "forwarded_to": told, "ended_in_s": ended_in_s,
            "within_grace": within, "saved_step": saved_step,
            "manifest_id": None if manifest is None else manifest.manifest_id,
            "ranks_saved": sorted(int(r["rank"]) for r in records if isinstance(r.get("rank"), int)),
        }
        whom = "no process (it had ended)" if not told else (
            f"pid {told[0]}" if len(told) == 1 else f"{len(told)} ranks (pids {', '.join(map(str, told))})")
        ending = (f"it ended by itself after {ended_in_s:g} s, within the {self.grace_s:g} s grace" if within else
                  f"it was killed when the {self.grace_s:g} s grace ran out")
        if saved_step is not None:
            saved = (f"every rank ({world}) saved step {saved_step} ({manifest.manifest_id}); "
                     + resume_from.format(step=saved_step))
        else:
            saved = "no save after the notice was reported; " + resume_newest
        return row, f"{attempt_id} preempted by {self.name}: forwarded to {whom}; {ending}; {saved}"


def _rank_records(attempt_dir: Path) -> list[dict[str, Any]]:
    return [record for path in preempted_paths(attempt_dir / RANKS_DIR) if (record := json_object(path)) is not None]
