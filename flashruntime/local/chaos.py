"""Chaos mode: faults injected into a real local run on purpose, and a report of what the
run did about them.

A ``ChaosPlan`` lists faults, each fired once, in the first attempt that reaches its step
(``at_step``, or a step drawn from ``between`` with the plan's ``seed``):

- ``kill_rank``: SIGKILL one rank (found by its heartbeat file, which the torch helper
  writes, else by the ``RANK`` it was started with), as a crashed GPU or an OOM kill would;
- ``lose_rank``: SIGKILL one rank and take its slot away, for ``seconds`` when given, else for
  the rest of the run, as a GPU that fell off the bus would: an elastic run (``ranks=(min,
  max)``) continues on the ranks left and grows back once the slot returns (below ``min``, its
  relaunch waits for a slot whose return is known);
- ``kill_attempt``: SIGKILL the attempt's leader (torchrun, or the plain command), as a
  lost machine would; the launcher's sweep then reaps the ranks;
- ``hang_rank``: stop one rank (SIGSTOP) for ``seconds``, then let it go on (SIGCONT);
- ``hang_forever``: stop one rank (SIGSTOP) until the hang watch detects it and stops the
  attempt (see ``flashruntime.monitor.hang_watch``);
- ``slow``: for ``seconds``, stop every rank for ``factor`` of each 200 ms, as a
  throttled or shared machine would;
- ``preempt``: send the attempt's ranks the preemption notice (the first signal of
  ``FLASHML_PREEMPT_SIGNAL``) with ``seconds`` of grace, as a spot reclaim would, and kill
  what is left when the grace is over; the attempt ends PREEMPTED and, as if the machine were
  replaced at once, is relaunched without spending a restart;
- ``corrupt_checkpoint``: flip a byte in a part of the newest valid checkpoint, so its
  sha256 no longer verifies and a resume must pick the one before it; for a script that
  keeps its own checkpoints, in the newest of those (``flashruntime.checkpoint.frameworks``).

A step is reached when the torch helper reports it (heartbeats, ``metrics.jsonl``), or, for
a script that keeps its own checkpoints, when it has saved one of that step.

Faults due at the same step fire in the plan's order (so a checkpoint corrupted "at the
kill" is corrupted first). Each injection is recorded in ``run.json`` (``chaos.injected``)
and as a ``CHAOS_INJECTED`` event; the goodput ledger then times detection and recovery
from it.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from flashruntime.checkpoint.frameworks import checkpoint_files, newest
from flashruntime.checkpoint.local import MANIFEST_NAME, latest_valid_manifest
from flashruntime.local.framework_resume import FrameworkCheckpoints
from flashruntime.monitor.exits import rank_of
from flashruntime.monitor.preemption import Notice
from flashruntime.monitor.records import json_object, last_step_record
from flashruntime.rank_files import RANKS_DIR, heartbeat_paths
from flashruntime.recovery.preemption import SIGNAL_ENV, preempt_settings

__all__ = ["ChaosInjector", "ChaosPlan", "Fault"]

FaultKind = Literal["kill_rank", "lose_rank", "kill_attempt", "hang_rank", "slow", "corrupt_checkpoint",
                    "hang_forever", "preempt"]
POLL_S = 0.05
FRAMEWORK_POLL_S = 0.5  # a script's own checkpoints are looked for this often (a directory walk)
_SLOW_PERIOD_S = 0.2


class Fault(BaseModel):
    """One fault: what, when (``at_step``, else a step drawn from ``between``), and how."""

    kind: FaultKind
    at_step: int | None = Field(default=None, ge=1)
    between: tuple[int, int] | None = None  # a random step in [low, high], drawn with the plan's seed
    rank: int = Field(default=0, ge=0)  # kill_rank, lose_rank, hang_rank, hang_forever
    seconds: float = Field(default=5.0, gt=0, le=3600)  # hang_rank, slow; preempt: the grace; lose_rank: when given
    factor: float = Field(default=0.5, gt=0, lt=1)  # slow: the share of each period the ranks are stopped

    @model_validator(mode="after")
    def _when(self) -> Fault:
        if self.at_step is None and self.between is None:
            raise ValueError(f"a {self.kind} fault needs at_step=N or between=(low, high)")
        if self.between is not None and not 1 <= self.between[0] <= self.between[1]:
            raise ValueError(f"between must be (low, high) with 1 <= low <= high, got {self.between}")
        return self

    def slot_returns(self) -> bool:
        """A ``lose_rank`` slot comes back after ``seconds`` only when they were given."""
        return "seconds" in self.model_fields_set

    def describe(self, step: int) -> str:
        what = {
            "kill_rank": f"SIGKILL rank {self.rank}",
            "lose_rank": f"SIGKILL rank {self.rank} and take its slot away for "
                         f"{f'{self.seconds:g} s' if self.slot_returns() else 'the rest of the run'}",
            "kill_attempt": "SIGKILL the attempt's leader",
            "hang_rank": f"stop rank {self.rank} for {self.seconds:g} s",
            "hang_forever": f"stop rank {self.rank} until the hang is detected",
            "slow": f"stop every rank {self.factor:.0%} of the time for {self.seconds:g} s",
            "corrupt_checkpoint": "corrupt a part of the newest valid checkpoint",
            "preempt": f"send the preemption notice with {self.seconds:g} s of grace",
        }[self.kind]
        return f"{self.kind} at step {step}: {what}"


class ChaosPlan(BaseModel):
    """The faults to inject into one run, and the seed that draws their random steps."""

    faults: list[Fault] = Field(min_length=1)
    seed: int = 0

    def steps(self) -> list[int]:
        """The step each fault fires at, in plan order (random ones drawn with ``seed``)."""
        draw = random.Random(self.seed)
        return [fault.at_step if fault.at_step is not None else draw.randint(*fault.between)  # type: ignore[misc]
                for fault in self.faults]


def _last_step(attempt_dir: Path) -> int | None:
    """The newest step the attempt reported: its ranks' heartbeats and rank 0's last record."""
    steps = []
    for beat in heartbeat_paths(attempt_dir / RANKS_DIR):
        record = json_object(beat)
        if record and isinstance(record.get("step"), int):
            steps.append(record["step"])
    last = last_step_record(attempt_dir / "metrics.jsonl")
    if last is not None:
        steps.append(last["step"])
    return max(steps) if steps else None


def _rank_pids(attempt_dir: Path, handle: Any = None) -> dict[int, int]:
    """Each rank's pid: from the torch helper's heartbeats, else (a script without it) from the
    attempt's processes, by the ``RANK`` / ``LOCAL_RANK`` each was started with."""
    pids = {}
    for beat in heartbeat_paths(attempt_dir / RANKS_DIR):
        record = json_object(beat)
        if record and isinstance(record.get("rank"), int) and isinstance(record.get("pid"), int):
            pids[record["rank"]] = record["pid"]
    processes = getattr(handle, "processes", None)
    if not pids and callable(processes):
        for pid in sorted(processes()):
            rank = rank_of(pid)
            if rank is not None:
                pids.setdefault(rank, pid)  # the first (lowest) pid of a rank: the rank, not its workers
    return pids


def _flip_middle_byte(path: Path) -> int:
    with open(path, "r+b") as handle:
        size = handle.seek(0, os.SEEK_END)
        middle = size // 2
        handle.seek(middle)
        byte = handle.read(1) or b"\0"
        handle.seek(middle)
        handle.write(bytes([byte[0] ^ 0xFF]))
        handle.flush()
        os.fsync(handle.fileno())
    return middle


def _signal(pid: int, signum: int) -> bool:
    try:
        os.kill(pid, signum)
    except OSError:
        return False
    return True


class ChaosInjector:
    """Fires ``plan``'s faults into ``run``'s attempts from a background thread."""

    def __init__(self, run: Any, plan: ChaosPlan, checkpoint_root: Any) -> None:
        self._run = run
        self._plan = plan
        self._checkpoint_root = checkpoint_root  # job_id -> the job's checkpoint directory
        self._due = list(zip(plan.steps(), plan.faults))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="flashruntime-chaos", daemon=True)
        self._timers: list[threading.Thread] = []
        self._framework_looked: dict[str, float] = {}
        self._framework_steps: dict[str, int | None] = {}

    def start(self) -> ChaosInjector:
        self._run.recorder.set_chaos({"plan": self._plan.model_dump(mode="json"),
                                      "steps": [step for step, _ in self._due], "injected": []})
        self._run.recorder.on_end(self._stop.set)
        self._thread.start()
        return self

    def _framework_step(self, job_id: str) -> int | None:
        """The step of the newest checkpoint the script itself saved (for a script without the
        torch helper), looked for at most every ``FRAMEWORK_POLL_S``."""
        now = time.monotonic()
        if now - self._framework_looked.get(job_id, 0.0) < FRAMEWORK_POLL_S:
            return self._framework_steps.get(job_id)
        self._framework_looked[job_id] = now
        framework = self._framework(job_id)
        newest_one = newest(c for c in framework.find() if framework.written_by_this_run(c))
        step = None if newest_one is None else newest_one.step
        self._framework_steps[job_id] = step
        return step

    def _framework(self, job_id: str) -> FrameworkCheckpoints:
        source = Path(os.path.expanduser(self._run.workload.source.path))
        return FrameworkCheckpoints([source, Path(self._checkpoint_root(job_id))], self._run.checkpoint_patterns,
                                    self._run.output_dir / job_id, since_ns=int(self._run.started_at * 1e9))

    def _loop(self) -> None:
        while self._due and not self._stop.wait(POLL_S):
            for attempt_id, handle in self._run.recorder.active:
                attempt_dir = Path(handle.output_dir)
                reached = _last_step(attempt_dir)
                if reached is None:
                    row = next((r for r in self._run.attempts if r["attempt_id"] == attempt_id), {})
                    reached = self._framework_step(str(row.get("job_id", "local")))
                while self._due and reached is not None and reached >= self._due[0][0]:
                    step, fault = self._due.pop(0)
                    self._inject(fault, step, reached, attempt_id, handle, attempt_dir)

    def _inject(self, fault: Fault, step: int, reached: int, attempt_id: str, handle: Any, attempt_dir: Path) -> None:
        row = next((r for r in self._run.attempts if r["attempt_id"] == attempt_id), {})
        detail = ""
        done = True
        if fault.kind == "kill_rank":
            pid = _rank_pids(attempt_dir, handle).get(fault.rank)
            done = pid is not None and _signal(pid, signal.SIGKILL)
            detail = f"pid {pid}" if done else f"no process of rank {fault.rank} was found"
        elif fault.kind == "lose_rank":
            capacity = self._run.capacity
            pid = _rank_pids(attempt_dir, handle).get(fault.rank)
            if capacity is not None and pid is not None:  # first: the relaunch the kill causes must not find it
                capacity.withdraw(f"rank {fault.rank}'s slot lost (chaos lose_rank)",
                                  fault.seconds if fault.slot_returns() else None)
            done = pid is not None and _signal(pid, signal.SIGKILL)
            detail = f"pid {pid}" if done else f"no process of rank {fault.rank} was found"
        elif fault.kind == "kill_attempt":
            done = _signal(int(handle.execution_id), signal.SIGKILL)
            detail = f"pid {handle.execution_id}"
        elif fault.kind == "hang_rank":
            pid = _rank_pids(attempt_dir, handle).get(fault.rank)
            done = pid is not None and _signal(pid, signal.SIGSTOP)
            if done:
                self._later(fault.seconds, lambda: _signal(pid, signal.SIGCONT))  # type: ignore[arg-type]
            detail = f"pid {pid}" if done else f"no process of rank {fault.rank} was found"
        elif fault.kind == "hang_forever":  # the hang watch's stop continues it, to act on its SIGTERM
            pid = _rank_pids(attempt_dir, handle).get(fault.rank)
            done = pid is not None and _signal(pid, signal.SIGSTOP)
            detail = f"pid {pid}" if done else f"no process of rank {fault.rank} was found"
        elif fault.kind == "slow":
            pids = sorted(_rank_pids(attempt_dir, handle).values()) or [int(handle.execution_id)]
            self._later(0.0, lambda: self._throttle(pids, fault.seconds, fault.factor))
            detail = f"pids {pids}"
        elif fault.kind == "corrupt_checkpoint":
            detail, done = self._corrupt(str(row.get("job_id", "local")))
        elif fault.kind == "preempt":
            detail, done = self._preempt(handle, fault.seconds)
        self._run.recorder.add_chaos_injection({
            "kind": fault.kind, "step": step, "reached_step": reached, "attempt_id": attempt_id, "ts": time.time(),
            "done": done, "detail": detail,
        })
        verb = "injected" if done else "could not be injected"
        self._run.record_event("CHAOS_INJECTED", f"{attempt_id}: {fault.describe(step)} — {verb} ({detail})")

    def _corrupt(self, job_id: str) -> tuple[str, bool]:
        root = Path(self._checkpoint_root(job_id))
        manifest = latest_valid_manifest(root)
        if manifest is None or not manifest.parts:
            return self._corrupt_framework_checkpoint(job_id, root)
        step_dir = next((path.parent for path in sorted(root.glob(f"step-*/{MANIFEST_NAME}"))
                         if (json_object(path) or {}).get("manifest_id") == manifest.manifest_id), None)
        part = manifest.parts[0]
        path = None if step_dir is None else step_dir / part.key
        if path is None or not path.is_file():
            return f"part {part.key} of step {manifest.step} not found", False
        middle = _flip_middle_byte(path)
        return f"step {manifest.step}, part {part.key}, byte {middle}", True

    def _corrupt_framework_checkpoint(self, job_id: str, root: Path) -> tuple[str, bool]:
        """No checkpoint of the torch helper: flip a byte in the largest file of the newest
        checkpoint the script saved itself (the one its own resume would load)."""
        framework = self._framework(job_id)
        chosen = newest(c for c in framework.find() if framework.written_by_this_run(c))
        files = [] if chosen is None else checkpoint_files(chosen)
        if not files:
            return f"no valid checkpoint under {root} and none the script saved itself yet", False
        path = max(files, key=lambda p: (p.stat().st_size, str(p)))
        middle = _flip_middle_byte(path)
        return f"{framework.describe(chosen)}, file {path.name}, byte {middle}", True

    def _preempt(self, handle: Any, grace_s: float) -> tuple[str, bool]:
        """Send the ranks the notice and settle the attempt when the grace is over; the attempt
        loop sees the notice on the handle and relaunches without spending a restart."""
        signals = preempt_settings(os.environ).signals
        if not signals:
            return f"{SIGNAL_ENV} is none: no signal is a notice", False
        notice = Notice(signals[0], grace_s)
        handle.chaos_notice = notice  # before the signal: a rank may save and leave at once
        notice.forward(handle)
        if not notice.reached(handle):
            return "the attempt had ended", False
        self._later(0.0, lambda: notice.settle(handle))
        told = notice.told(handle)
        return f"{notice.name} to pid(s) {', '.join(map(str, told)) or 'none'}", bool(told)

    def _later(self, delay: float, action: Any) -> None:
        def run() -> None:
            if delay:
                time.sleep(delay)
            action()

        timer = threading.Thread(target=run, name="flashruntime-chaos-timer", daemon=True)
        timer.start()
        self._timers.append(timer)

    def _throttle(self, pids: list[int], seconds: float, factor: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not self._stop.is_set():
            for pid in pids:
                _signal(pid, signal.SIGSTOP)
            time.sleep(_SLOW_PERIOD_S * factor)
            for pid in pids:
                _signal(pid, signal.SIGCONT)
            time.sleep(_SLOW_PERIOD_S * (1 - factor))


def compare_results(chaos: dict[str, Any] | None, reference: dict[str, Any] | None, *, metric: str | None,
                    tolerance: float) -> dict[str, Any]:
    """Whether the run with faults reached the fault-free run's result: ``metric`` of both
    ``metrics.json`` (else every floating-point value they share), each within
    ``tolerance``. Integer values (steps, the step a run started from) are not results."""
    if chaos is None or reference is None:
        missing = "the run with faults" if chaos is None else "the fault-free run"
        return {"equal": False, "values": {}, "why": f"{missing} wrote no metrics.json"}
    if metric is not None:
        keys = [metric]
    else:
        keys = sorted(key for key, value in reference.items()
                      if isinstance(value, float) and isinstance(chaos.get(key), float))
    if not keys:
        return {"equal": False, "values": {}, "why": "no floating-point value to compare; name one with --metric"}
    values = {}
    for key in keys:
        a, b = chaos.get(key), reference.get(key)
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))
        difference = abs(float(a) - float(b)) if numeric else None  # type: ignore[arg-type]
        values[key] = {"with_faults": a, "without": b, "difference": difference,
                       "equal": difference is not None and difference <= tolerance}
    return {"equal": all(v["equal"] for v in values.values()), "values": values, "why": None}


def render_report(report: dict[str, Any]) -> str:
    """The chaos report as text (``flashruntime chaos`` prints it)."""
    from flashruntime.goodput.run import GoodputLedger, Recovery, ledger_lines

    def line(label: str, text: str) -> str:
        return f"  {label.ljust(10)}{text}"

    lines = [f"Chaos report: {report['run_dir']}"]
    for fault in report["faults"]:
        verb = "injected" if fault["done"] else "NOT injected"
        lines.append(line("fault", f"{fault['kind']} at step {fault['step']} in {fault['attempt_id']}: {verb} "
                                   f"({fault['detail']})"))
    for missed in report["not_reached"]:
        lines.append(line("fault", f"{missed['kind']} at step {missed['step']}: not injected, the run never "
                                   "reached that step"))
    restarts = report["goodput"]["restarts"]
    lines.append(line("outcome", f"{report['state']} after {restarts} restart{'s' if restarts != 1 else ''}"))
    ledger = dict(report["goodput"])
    ledger["recoveries"] = tuple(Recovery(**r) for r in ledger["recoveries"])
    lines += ledger_lines(GoodputLedger(**ledger))
    result = report.get("result")
    if result is None:
        lines.append(line("result", "not compared (--no-compare)"))
    elif result["why"]:
        lines.append(line("result", f"not comparable: {result['why']}"))
    else:
        for key, value in result["values"].items():
            verdict = "equal" if value["equal"] else "DIFFERENT"
            difference = "-" if value["difference"] is None else f"{value['difference']:.3g}"
            lines.append(line("result", f"{key} {value['with_faults']!r} with faults, {value['without']!r} without "
                                        f"(|difference| {difference}, tolerance {report['tolerance']:g}): {verdict}"))
    return "\n".join(lines)
