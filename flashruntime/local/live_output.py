"""The job's own output on the terminal while it runs.

Every attempt writes its stdout and stderr to its ``launcher.log`` (the launcher never
pipes them through this process, so an attempt never depends on us to make progress).
``LiveOutput`` follows those files and copies each complete line to a stream: ranks
keep torchrun's ``[default0]:`` tags, and trials running side by side get their trial
id in front. The run's recovery events (a failure's class, the decision, the resume
step, a trial starting and ending) are printed between them, marked ``flashruntime:``.
Once the run ends, the last lines are copied before ``Run.wait()`` returns.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any, TextIO

from flashruntime.launchers.local import LOG_NAME
from flashruntime.local.run import trial_id

__all__ = ["EVENTS_SHOWN", "LiveOutput", "tidy_lines"]

POLL_S = 0.1
_ATTEMPT_OF_A_TRIAL = re.compile(r"task-([0-9]{3,})(?:-r[0-9]+)?[: ]")
_CHUNK = 1 << 20  # read at most this much of one log per pass, so every attempt gets its turn
_TAGS_AT_START = re.compile(r"^(?:\[[A-Za-z]+[0-9]+\]:)+")
_TRAILING_TAGS = re.compile(r"(?:\[[A-Za-z]+[0-9]+\]:)+$")
# torchrun's own tags, where another rank's line begins glued to the end of one that had no
# line break (a stack of tags, "[default0]:[rank0]:", is one prefix: never split inside it).
_GLUED_TAG = re.compile(r"(?<=[^:])(?=\[(?:default|rank)[0-9]+\]:)")
_ONLY_TAGS = re.compile(r"^(?:\[[A-Za-z]+[0-9]+\]:)+\s*$")


def tidy_lines(lines: list[str]) -> list[str]:
    """The lines as a terminal would leave them. A carriage return (a progress bar's update)
    keeps what follows the last one. torchrun's tee turns each carriage return into a line
    break and glues the next rank's line to the end of a line that had none: such a line is
    split where the other rank's tag begins, a tag left at a line's end is dropped, and so is a
    line that is nothing but a tag."""
    tidy = []
    for line in (piece for whole in lines for piece in _GLUED_TAG.split(whole)):
        if "\r" in line:
            tags = _TAGS_AT_START.match(line)
            shown = line.rstrip("\r").rsplit("\r", 1)[-1]
            line = (tags.group(0) if tags and not shown.startswith(tags.group(0)) else "") + shown
        stripped = _TRAILING_TAGS.sub("", line) if not _ONLY_TAGS.match(line) else line
        if _ONLY_TAGS.match(stripped):
            continue
        tidy.append(stripped)
    return tidy
# The events a user watching the terminal needs; the others are in run.json.
EVENTS_SHOWN = frozenset({
    "FAILURE_CLASSIFIED", "RECOVERY_ACTION_SELECTED", "RESUME_SELECTED", "LAUNCH_FAILED",
    "SWEEP_STARTED", "TRIAL_STARTED", "TRIAL_FINISHED", "SWEEP_STOPPED", "OUTPUT_UNATTRIBUTABLE", "CHAOS_INJECTED",
    "STRAGGLER_DETECTED",
    "HANG_DETECTED",
})


class LiveOutput:
    """Copy ``run``'s attempts' output and recovery events onto ``stream`` as they come."""

    def __init__(self, run: Any, stream: TextIO, *, prefix_trials: bool = False, sweep: bool = False,
                 period_s: float = POLL_S) -> None:
        self._run = run
        self._stream = stream
        self._prefix_trials = prefix_trials
        self._sweep = sweep
        self._period_s = period_s
        self._offsets: dict[str, int] = {}
        self._partial: dict[str, bytes] = {}
        self._finished: set[str] = set()
        self._events_seen = 0
        self._broken = False  # the reader went away (| head): stop writing, never fail the run
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="flashruntime-live-output", daemon=True)

    def start(self) -> LiveOutput:
        self._run.recorder.on_end(self.close)
        self._thread.start()
        return self

    def close(self) -> None:
        """Copy what is left and stop following (idempotent). Called as the run ends, under
        the run's lock: the follower thread may be waiting for that lock, so it is not
        joined; it finds nothing left to copy and ends."""
        self._stop.set()
        self.pump()

    def _follow(self) -> None:
        while not self._stop.wait(self._period_s):
            self.pump()
            if self._run.state.terminal:
                break
        self.pump()

    def pump(self) -> None:
        """One pass: new events in order, each after the lines of the attempts launched before
        it (so a failure's class follows its traceback, and a trial's start precedes its
        output), then the new complete lines of every attempt not yet finished."""
        attempts = self._run.attempts  # snapshots, taken before our own lock (never both at once)
        events = self._run.events
        with self._lock:
            for event in events[self._events_seen:]:  # a stale, shorter snapshot yields none
                if event.get("type") not in EVENTS_SHOWN:
                    continue
                self._copy_attempts([row for row in attempts if (row.get("started_at") or 0) <= event["ts"]])
                self._write(f"flashruntime: {self._event_text(str(event.get('message')))}\n")
            # A pass that took its snapshot before another one ran never goes back over its events.
            self._events_seen = max(self._events_seen, len(events))
            self._copy_attempts(attempts)

    def _event_text(self, message: str) -> str:
        """In a sweep, an attempt's event names its trial first: ``[local-001] task-001: ...``."""
        match = _ATTEMPT_OF_A_TRIAL.match(message) if self._sweep else None
        return f"[{trial_id(int(match.group(1)))}] {message}" if match else message

    def _copy_attempts(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            attempt_id = row["attempt_id"]
            if attempt_id in self._finished:
                continue
            finished = row.get("state") != "RUNNING"
            self._copy(attempt_id, Path(row["output_dir"]) / LOG_NAME, row.get("job_id"), finished)
            if finished:
                self._finished.add(attempt_id)

    def _copy(self, attempt_id: str, path: Path, job_id: str | None, to_the_end: bool) -> None:
        prefix = f"[{job_id}] " if self._prefix_trials and job_id else ""
        offset = self._offsets.get(attempt_id, 0)
        while True:
            try:
                with open(path, "rb") as log:
                    log.seek(offset)
                    data = log.read(_CHUNK)
            except OSError:
                return  # not created yet
            if not data:
                break
            offset += len(data)
            read_all = len(data) < _CHUNK
            data = self._partial.pop(attempt_id, b"") + data
            complete, _, rest = data.rpartition(b"\n")
            if rest:
                self._partial[attempt_id] = rest
            if complete or data.endswith(b"\n"):
                self._write_lines(complete.decode(errors="replace").split("\n"), prefix)
            if not to_the_end or read_all:
                break
        self._offsets[attempt_id] = offset
        if to_the_end and attempt_id in self._partial:  # a last line without its newline
            self._write_lines([self._partial.pop(attempt_id).decode(errors="replace")], prefix)

    def _write_lines(self, lines: list[str], prefix: str) -> None:
        self._write("".join(f"{prefix}{line}\n" for line in tidy_lines(lines)))

    def _write(self, text: str) -> None:
        if self._broken or not text:
            return
        try:
            try:
                self._stream.write(text)
            except UnicodeEncodeError:  # a terminal that cannot show every character
                encoding = getattr(self._stream, "encoding", None) or "ascii"
                self._stream.write(text.encode(encoding, errors="replace").decode(encoding))
            self._stream.flush()
        except (BrokenPipeError, ValueError, OSError):
            self._broken = True
