"""Live progress of a local run on a terminal: attempt, state, elapsed time and the
last step/loss the script logged to metrics.jsonl."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, TextIO


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


def progress_line(run: Any, now: float | None = None) -> str:
    now = time.time() if now is None else now
    attempts = run.attempts
    elapsed = (run.finished_at or now) - run.started_at
    if not attempts:
        return f"{run.state}  {elapsed:6.1f}s"
    current = attempts[-1]
    text = f"[{current['attempt_id']}] {current['state']}  {elapsed:6.1f}s"
    record = last_metrics(current["output_dir"])
    if record:
        if "step" in record:
            text += f"  step {record['step']}"
        loss = record.get("loss")
        if isinstance(loss, (int, float)):
            text += f"  loss {loss:.4g}"
    return text


def watch(run: Any, stream: TextIO, period_s: float = 0.5) -> None:
    """Redraw one status line until the run is terminal."""
    width = 0
    while not run.wait(period_s).terminal:
        line = progress_line(run)
        stream.write("\r" + line.ljust(width))
        stream.flush()
        width = max(width, len(line))
    stream.write("\r" + progress_line(run).ljust(width) + "\n")
    stream.flush()
