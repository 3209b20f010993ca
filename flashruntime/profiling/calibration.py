"""``CalibrationLedger``: what finished runs measured, by the plan they ran. Each record is
one run's median step time and peak memory (and its failures and wall time) under a plan
key; later plans for the key use the medians over its runs (basis ``ledger``) and the
failure rate for checkpoint advice. SQLite, beside the local runs by default
(``$FLASHML_CALIBRATION_LEDGER`` names another file). ``run_figures`` reads a finished local
run's figures from its directory; ``flash.run`` records every run of a plan that succeeds.
"""

from __future__ import annotations

import json
import os
import sqlite3
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from flashruntime.errors import InvalidProfileRequest, StoreError
from flashruntime.monitor.records import finite_number, step_records
from flashruntime.protocol.profile_v1alpha1 import ProfileResult
from flashruntime.run_dirs import runs_root

__all__ = ["CalibrationLedger", "LedgerRun", "RunFigures", "default_ledger_path", "ledger_disabled", "plan_key",
           "run_figures"]

LEDGER_FILE = "calibration.sqlite"
LEDGER_ENV = "FLASHML_CALIBRATION_LEDGER"
_OFF = frozenset({"off", "0", "false", "no"})
SCHEMA_VERSION = 1


def plan_key(plan_id: str, strategy_family: str, workers: int) -> str:
    """The key runs of one plan are recorded under: ``<plan_id>/<family>/x<workers>``."""
    return f"{plan_id}/{strategy_family}/x{workers}"


def default_ledger_path() -> Path:
    """``$FLASHML_CALIBRATION_LEDGER`` when it names a file, else ``<runs root>/calibration.sqlite``
    (the runs root is ``$FLASHML_RUNS_DIR`` or the user data directory)."""
    configured = os.environ.get(LEDGER_ENV, "").strip()
    if configured and configured.lower() not in _OFF:
        return Path(os.path.expanduser(configured))
    return runs_root() / LEDGER_FILE


def ledger_disabled() -> bool:
    """Whether ``$FLASHML_CALIBRATION_LEDGER`` is ``off`` (or ``0``/``false``/``no``): runs are not recorded."""
    return os.environ.get(LEDGER_ENV, "").strip().lower() in _OFF


@dataclass(frozen=True)
class RunFigures:
    """What a finished local run measured: the median time of one step (None without two timed
    steps in one attempt), the steps that timing came from, the largest ``peak_vram_gb`` its
    metrics carried (None when none did), its failed attempts and its wall time."""

    step_time_s: float | None
    timed_steps: int
    peak_memory_gb: float | None
    failures: int
    wall_s: float | None


def _attempt_records(path: Path) -> list[tuple[int, float, float | None]]:
    """``(step, ts, peak_vram_gb)`` of each record of a ``metrics.jsonl`` with an integer step and a numeric ts."""
    return [(step, ts, finite_number(record.get("peak_vram_gb"))) for step, ts, record in step_records(path)]


def run_figures(run_dir: str | os.PathLike[str]) -> RunFigures:
    """The figures of the local run in ``run_dir``, from its ``run.json`` and each attempt's
    ``metrics.jsonl`` (the torch helper's ``log_metrics`` stamps each record with ``ts``, when
    its step ended). A step's time is the time between two consecutive records of one attempt
    over the steps between them, so logging every N steps still times one step; the first
    interval of an attempt includes its warm-up, which the median discounts. Raises
    ``OSError`` / ``ValueError`` when ``run.json`` cannot be read."""
    document = json.loads((Path(run_dir) / "run.json").read_text(encoding="utf-8"))
    if not isinstance(document, dict):
        raise ValueError(f"{run_dir}/run.json is not a run document")  # noqa: TRY004 - documented: ValueError
    per_step: list[float] = []
    peaks: list[float] = []
    failures = 0
    for row in document.get("attempts") or []:
        if not isinstance(row, dict):
            continue
        failures += row.get("state") == "FAILED"
        output = row.get("output_dir")
        if not isinstance(output, str):
            continue
        previous: tuple[int, float] | None = None
        for step, ts, peak in _attempt_records(Path(output) / "metrics.jsonl"):
            if peak is not None:
                peaks.append(peak)
            if previous is not None and step > previous[0] and ts >= previous[1]:
                per_step.append((ts - previous[1]) / (step - previous[0]))
            previous = (step, ts)
    started, finished = finite_number(document.get("started_at")), finite_number(document.get("finished_at"))
    wall = finished - started if started is not None and finished is not None and finished >= started else None
    positive = [t for t in per_step if t > 0]
    return RunFigures(
        step_time_s=statistics.median(positive) if positive else None,
        timed_steps=len(positive),
        peak_memory_gb=max(peaks) if peaks else None,
        failures=failures,
        wall_s=wall,
    )


@dataclass(frozen=True)
class LedgerRun:
    """One finished run's figures."""

    run_id: str
    step_time_s: float
    peak_memory_gb: float | None
    failures: int
    wall_s: float | None
    recorded_at: float


class CalibrationLedger:
    """Runs' measured figures by plan key, in a SQLite file (default ``default_ledger_path()``)."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = default_ledger_path() if path is None else Path(os.path.expanduser(str(path)))
        if self.path.is_dir():
            raise InvalidProfileRequest(
                f"ledger path {str(self.path)!r} is a directory; give a file path such as "
                f"{str(self.path / LEDGER_FILE)!r}"
            )
        self._lock = threading.Lock()

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        db.execute(
            "CREATE TABLE IF NOT EXISTS runs (plan_key TEXT NOT NULL, run_id TEXT NOT NULL, step_time_s REAL NOT NULL,"
            " peak_memory_gb REAL, failures INTEGER NOT NULL, wall_s REAL, recorded_at REAL NOT NULL,"
            " PRIMARY KEY (plan_key, run_id))"
        )
        db.execute("INSERT INTO schema_version (version) SELECT ? WHERE NOT EXISTS (SELECT 1 FROM schema_version)",
                   (SCHEMA_VERSION,))
        return db

    def record(self, key: str, run_id: str, step_time_s: float, *, peak_memory_gb: float | None = None,
               failures: int = 0, wall_s: float | None = None, now: float | None = None) -> None:
        """Record (or replace) ``run_id``'s figures under ``key``."""
        if not isinstance(step_time_s, (int, float)) or isinstance(step_time_s, bool) or not step_time_s > 0:
            raise InvalidProfileRequest(f"step_time_s must be a number of seconds > 0, got {step_time_s!r}")
        if isinstance(failures, bool) or not isinstance(failures, int) or failures < 0:
            raise InvalidProfileRequest(f"failures must be an integer >= 0, got {failures!r}")
        at = time.time() if now is None else now
        try:
            with self._lock:
                db = self._connect()
                try:
                    db.execute("BEGIN IMMEDIATE")
                    db.execute("INSERT OR REPLACE INTO runs VALUES (?, ?, ?, ?, ?, ?, ?)",
                               (key, run_id, float(step_time_s), peak_memory_gb, failures, wall_s, at))
                    db.execute("COMMIT")
                finally:
                    db.close()
        except sqlite3.Error as exc:
            raise StoreError(f"calibration ledger {str(self.path)!r} cannot be written: {exc}") from exc

    def record_run(self, key: str, run_id: str, run_dir: str | os.PathLike[str]) -> RunFigures:
        """Record the figures ``run_figures(run_dir)`` reads under ``key`` and return them;
        nothing is recorded when they hold no step time."""
        figures = run_figures(run_dir)
        if figures.step_time_s is not None:
            self.record(key, run_id, figures.step_time_s, peak_memory_gb=figures.peak_memory_gb,
                        failures=figures.failures, wall_s=figures.wall_s)
        return figures

    def runs(self, key: str) -> list[LedgerRun]:
        """The runs recorded under ``key``, oldest first."""
        if not self.path.exists():
            return []
        try:
            with self._lock:
                db = self._connect()
                try:
                    rows = db.execute(
                        "SELECT run_id, step_time_s, peak_memory_gb, failures, wall_s, recorded_at FROM runs "
                        "WHERE plan_key = ? ORDER BY recorded_at, run_id", (key,)).fetchall()
                finally:
                    db.close()
        except sqlite3.Error as exc:
            raise StoreError(f"calibration ledger {str(self.path)!r} cannot be read: {exc}") from exc
        return [LedgerRun(*row) for row in rows]

    def figures(self, key: str, *, strategy_family: str | None = None, workers: int | None = None,
                minimum_runs: int = 1) -> ProfileResult | None:
        """Medians over the runs of ``key`` as a ``ProfileResult`` with basis ``ledger`` (its
        ``sources`` are the run ids), None with fewer than ``minimum_runs`` runs."""
        runs = self.runs(key)
        if len(runs) < max(1, minimum_runs):
            return None
        memory = [r.peak_memory_gb for r in runs if r.peak_memory_gb is not None]
        return ProfileResult(
            basis="ledger",
            step_time_s=statistics.median(r.step_time_s for r in runs),
            peak_vram_gb=statistics.median(memory) if memory else None,
            measured_steps=len(runs),
            notes=[f"median of {len(runs)} finished run(s)"],
            strategy_family=strategy_family,
            workers=workers,
            sources=[r.run_id for r in runs],
        )

    def observed_mtbf_s(self) -> float | None:
        """Wall time of every recorded run over their failures; None before the first failure."""
        if not self.path.exists():
            return None
        try:
            with self._lock:
                db = self._connect()
                try:
                    wall, failures = db.execute(
                        "SELECT COALESCE(SUM(wall_s), 0), COALESCE(SUM(failures), 0) FROM runs").fetchone()
                finally:
                    db.close()
        except sqlite3.Error as exc:
            raise StoreError(f"calibration ledger {str(self.path)!r} cannot be read: {exc}") from exc
        return wall / failures if failures and wall else None
