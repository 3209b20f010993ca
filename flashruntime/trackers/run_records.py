"""What a local run recorded, read once for every tracker: ``read_run(run_dir)`` turns its
``run.json`` into the parts a tracker shows as runs of their own (a sweep: one per trial;
otherwise the run itself), each with its attempts' step files (``metrics.jsonl``, else the
curves read from the output, ``framework-metrics.jsonl``), final figures and parameters.
``figures`` and ``step_records`` read the numbers of one record and of one steps file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flashruntime.monitor.progress import FRAMEWORK_METRICS_NAME
from flashruntime.monitor.records import finite_number, json_lines

__all__ = ["RecordedPart", "RecordedRun", "figures", "read_run", "step_records", "steps_file"]

_NOT_FIGURES = frozenset({"step", "ts", "params"})


def figures(record: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    """(name, value) of each finite number of ``record``, nested objects flattened as ``a/b``;
    a step record's ``step`` and ``ts`` and a trial's ``params`` are not figures."""
    for key, value in record.items():
        if not prefix and key in _NOT_FIGURES:
            continue
        if isinstance(value, dict):
            yield from figures(value, f"{prefix}{key}/")
        elif (number := finite_number(value)) is not None:
            yield f"{prefix}{key}", number


def steps_file(attempt_dir: Path) -> Path:
    """The attempt's ``metrics.jsonl``, else the curves read from its output."""
    chosen = attempt_dir / "metrics.jsonl"
    return chosen if chosen.is_file() else attempt_dir / FRAMEWORK_METRICS_NAME


def step_records(path: Path | None) -> Iterator[tuple[int, float | None, dict[str, Any]]]:
    """(step, wall time or None, record) of each record of ``path`` (JSON lines) with an
    integer step, in file order; nothing for None or a file that cannot be read."""
    if path is None:
        return
    for record in json_lines(path):
        step = record.get("step")
        if isinstance(step, int) and not isinstance(step, bool):
            yield step, finite_number(record.get("ts")), record


@dataclass(frozen=True)
class RecordedPart:
    """One trial of a sweep (``trial_id`` set), or a whole run that is not a sweep."""

    trial_id: str | None
    attempt_dirs: tuple[Path, ...]  # in the order the attempts ran
    final: dict[str, Any] | None  # metrics.json of the accepted attempt
    params: dict[str, Any] | None
    state: str | None
    started_at: float | None
    ended_at: float

    @property
    def steps_files(self) -> list[Path]:
        return [steps_file(directory) for directory in self.attempt_dirs]


@dataclass(frozen=True)
class RecordedRun:
    run_dir: Path
    document: dict[str, Any]  # run.json as read
    sweep: dict[str, Any] | None
    parts: tuple[RecordedPart, ...]

    @property
    def name(self) -> str:
        return self.run_dir.name


def _attempt_dirs(attempts: Iterable[dict[str, Any]]) -> tuple[Path, ...]:
    return tuple(Path(row["output_dir"]) for row in attempts if isinstance(row.get("output_dir"), str))


def _mapping(value: object) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def read_run(run_dir: str | os.PathLike[str]) -> RecordedRun:
    """The run in ``run_dir`` as its ``run.json`` records it (``OSError`` / ``ValueError`` when
    there is none or it is not JSON)."""
    run_dir = Path(run_dir)
    document = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    if not isinstance(document, dict):
        raise ValueError(f"{run_dir / 'run.json'} holds no run: expected a JSON object")  # noqa: TRY004 - a file's content
    attempts = [row for row in document.get("attempts") or () if isinstance(row, dict)]
    started = finite_number(document.get("started_at"))
    ended = finite_number(document.get("finished_at")) or started or 0.0
    sweep = _mapping(document.get("sweep"))
    if sweep is None:
        trials = [trial for trial in document.get("trials") or () if isinstance(trial, dict)]
        state = document.get("state") if isinstance(document.get("state"), str) else None
        whole = RecordedPart(None, _attempt_dirs(attempts), trials[-1] if trials else None, None, state, started,
                             ended)
        return RecordedRun(run_dir, document, None, (whole,))
    parts = []
    for trial in sweep.get("trials") or ():
        if not isinstance(trial, dict):
            continue
        trial_id = str(trial.get("trial_id"))
        mine = [row for row in attempts if row.get("job_id") == trial_id]
        state = trial.get("state") if isinstance(trial.get("state"), str) else None
        parts.append(RecordedPart(trial_id, _attempt_dirs(mine), _mapping(trial.get("metrics")),
                                  _mapping(trial.get("params")), state, finite_number(trial.get("started_at")),
                                  finite_number(trial.get("finished_at")) or ended))
    return RecordedRun(run_dir, document, sweep, tuple(parts))
