"""Live progress of a local run on a terminal: one status line (attempt or trial k/N,
state, elapsed time, the last step/loss logged to metrics.jsonl or printed by the script's
framework) redrawn below the job's own output."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from flashruntime.launchers.local import LOG_NAME
from flashruntime.monitor.progress import progress_from_output


def last_metrics(attempt_dir: str | Path) -> dict[str, Any] | None:
    """The last complete JSON line of ``<attempt_dir>/metrics.jsonl`` (reads only the tail)."""
    path = Path(attempt_dir) / "metrics.jsonl"
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 8192))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            return record
    return None


def _output_tail(attempt_dir: str | Path, size: int = 8192) -> str:
    try:
        with open(Path(attempt_dir) / LOG_NAME, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - size))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _step_and_loss(attempt: dict[str, Any]) -> str:
    """The last step and loss: from metrics.jsonl (the torch helper's), else from what the
    script printed (a framework's log line or progress bar)."""
    record = last_metrics(attempt["output_dir"]) or progress_from_output(_output_tail(attempt["output_dir"]))
    text = ""
    if record:
        if "step" in record:
            text += f"  step {record['step']}"
        loss = record.get("loss")
        if isinstance(loss, (int, float)) and not isinstance(loss, bool):
            text += f"  loss {loss:.4g}"
    return text


def progress_line(run: Any, now: float | None = None) -> str:
    now = time.time() if now is None else now
    elapsed = (run.finished_at or now) - run.started_at
    sweep = run.sweep
    if sweep is not None:
        return _sweep_line(run, sweep, elapsed)
    attempts = run.attempts
    if not attempts:
        return f"{run.state}  {elapsed:6.1f}s"
    current = attempts[-1]
    return f"[{current['attempt_id']}] {current['state']}  {elapsed:6.1f}s" + _step_and_loss(current)


def _sweep_line(run: Any, sweep: dict[str, Any], elapsed: float) -> str:
    trials = sweep["trials"]
    total = len(trials)
    done = sum(1 for t in trials if t["state"] not in ("PENDING", "RUNNING"))
    running = [t for t in trials if t["state"] == "RUNNING"]
    if run.state.terminal:
        return f"{run.state}  trials {done}/{total} done  {elapsed:6.1f}s"
    if len(running) == 1 and sweep["max_concurrent_trials"] == 1:
        trial = running[0]
        text = f"trial {trial['index'] + 1}/{total} [{trial['trial_id']}] RUNNING  {elapsed:6.1f}s"
    else:
        text = f"trials {done}/{total} done, {len(running)} running  {elapsed:6.1f}s"
    if running:
        rows = {a["attempt_id"]: a for a in run.attempts}
        ids = running[-1]["attempt_ids"]
        if ids and ids[-1] in rows:
            text += _step_and_loss(rows[ids[-1]])
    return text


class Terminal:
    """The job's output lines on ``lines``, with a status line redrawn on ``status`` (a TTY)
    below them: a line is written by clearing the status line, writing, and redrawing it.
    Quacks like a text stream for ``LiveOutput``."""

    def __init__(self, lines: TextIO, status: TextIO | None) -> None:
        self._lines = lines
        self._status_stream = status
        self._status = ""
        self._width = 0
        self._lock = threading.Lock()

    @property
    def encoding(self) -> str | None:
        return getattr(self._lines, "encoding", None)

    def write(self, text: str) -> int:
        with self._lock:
            self._clear()
            self._lines.write(text)
            self._lines.flush()
            self._draw()
        return len(text)

    def flush(self) -> None:
        self._lines.flush()

    def status(self, text: str) -> None:
        with self._lock:
            self._status = text
            self._draw()

    def end_status(self, text: str) -> None:
        """The status line's last state, left on screen."""
        with self._lock:
            self._status = text
            self._draw()
            if self._status_stream is not None:
                self._status_stream.write("\n")
                self._status_stream.flush()
            self._status, self._width = "", 0

    def _clear(self) -> None:
        if self._status_stream is not None and self._width:
            self._status_stream.write("\r" + " " * self._width + "\r")
            self._status_stream.flush()
            self._width = 0

    def _draw(self) -> None:
        if self._status_stream is not None and self._status:
            self._status_stream.write("\r" + self._status)
            self._status_stream.flush()
            self._width = len(self._status)


def watch(run: Any, terminal: Terminal, period_s: float = 0.5) -> None:
    """Redraw the status line until the run is terminal."""
    while not run.wait(period_s).terminal:
        terminal.status(progress_line(run))
    terminal.end_status(progress_line(run))
