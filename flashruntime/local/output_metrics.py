"""While an attempt runs: the step and loss its script prints (a framework's log line or
progress bar, see ``flashruntime.monitor.progress``) become ``framework-metrics.jsonl`` in
the attempt directory, the run page's curves for a script that logs no ``metrics.jsonl``.
A script that writes ``metrics.jsonl`` (the torch helper's) is left alone.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from flashruntime.launchers.local import LOG_NAME
from flashruntime.monitor.progress import FRAMEWORK_METRICS_NAME, OutputProgress
from flashruntime.periodic import Periodic

__all__ = ["OutputMetrics"]

PERIOD_S = 1.0
_CHUNK = 1 << 20


class OutputMetrics:
    """Follow ``<attempt_dir>/launcher.log`` and append what it reports to the curves file."""

    def __init__(self, attempt_dir: Path, *, period_s: float = PERIOD_S) -> None:
        self._dir = Path(attempt_dir)
        self._offset = 0
        self._partial = b""
        self._progress = OutputProgress()
        self._periodic = Periodic(self.read, period_s, "flashruntime-output-metrics")

    def start(self) -> OutputMetrics:
        self._periodic.start()
        return self

    def stop(self) -> None:
        """Stop, after reading what the attempt printed last."""
        self._periodic.stop()

    def read(self) -> None:
        """Fold the log's new complete lines into the curves file (nothing when the script keeps
        its own metrics.jsonl). Never raises: curves never fail an attempt."""
        try:
            if (self._dir / "metrics.jsonl").exists():
                return
            with open(self._dir / LOG_NAME, "rb") as log:
                log.seek(self._offset)
                data = log.read(_CHUNK)
            self._offset += len(data)
            complete, _, self._partial = (self._partial + data).rpartition(b"\n")
            self._partial = self._partial[-_CHUNK:]  # a bar redrawn with carriage returns only: its end
            records = self._progress.feed(complete.decode(errors="replace").splitlines()) if complete else []
            if records:
                now = time.time()
                with open(self._dir / FRAMEWORK_METRICS_NAME, "a", encoding="utf-8") as out:
                    out.write("".join(json.dumps({**record, "ts": now}) + "\n" for record in records))
        except Exception:  # noqa: BLE001 - curves never fail an attempt
            return
