"""A run's final figures from wherever its framework wrote them, when the script writes no
``metrics.json``: flashruntime.torch's ``metrics.jsonl``, Hugging Face's ``all_results.json``
(else the log history in ``trainer_state.json``), Lightning's ``metrics.csv``, or a JSON
object the script printed as its last such line. Only files written during the attempt count,
so an earlier run's figures are never credited.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flashruntime.monitor.records import finite_number, json_lines
from flashruntime.workdir_walk import walk

__all__ = ["SOURCES", "final_figures"]

SOURCES = ("metrics.jsonl", "all_results.json", "trainer_state.json", "metrics.csv", "stdout")
_MAX_FILE_BYTES = 32 << 20
_TAG = re.compile(r"^(?:\[[A-Za-z]+[0-9]+\]:[ \t]*)+")


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and finite_number(value) is not None


def _fresh_files(root: Path, name: str, since_ns: int) -> Iterator[Path]:
    """Files called ``name`` below ``root`` (see ``flashruntime.workdir_walk``) written since ``since_ns``."""
    for _directory, entries in walk(root):
        for entry in entries:
            if entry.name != name or entry.is_symlink() or not entry.is_file():
                continue
            try:
                info = entry.stat()
            except OSError:
                continue
            if info.st_mtime_ns >= since_ns and info.st_size <= _MAX_FILE_BYTES:
                yield Path(entry.path)


def _newest(root: Path, name: str, since_ns: int) -> Path | None:
    def written(path: Path) -> int:
        try:
            return path.stat().st_mtime_ns
        except OSError:
            return -1

    return max(_fresh_files(root, name, since_ns), key=lambda p: (written(p), str(p)), default=None)


def _numbers(record: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in record.items() if _number(value)}


def _from_jsonl(path: Path) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for record in json_lines(path):
        figures.update(_numbers(record))
    return figures


def _from_all_results(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    return _numbers(data) if isinstance(data, dict) else {}


def _from_trainer_state(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    figures: dict[str, Any] = {}
    for record in data.get("log_history", []) if isinstance(data, dict) else []:
        if isinstance(record, dict):
            figures.update(_numbers(record))
    return figures


def _from_metrics_csv(path: Path) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            for key, text in row.items():
                if key is None or text in (None, ""):
                    continue
                try:
                    value = float(text)
                except ValueError:
                    continue
                if math.isfinite(value):
                    figures[key] = int(value) if key in ("epoch", "step") and value.is_integer() else value
    return figures


def _from_stdout(log_tail: str) -> dict[str, Any]:
    """The last line of the log that is a JSON object with a number in it (rank tags removed)."""
    for line in reversed(log_tail.splitlines()):
        text = _TAG.sub("", line).strip()
        if not (text.startswith("{") and text.endswith("}")):
            continue
        try:
            data = json.loads(text)
        except ValueError:
            continue
        if isinstance(data, dict) and any(_number(v) for v in data.values()):
            return data
    return {}


def final_figures(workdir: Path, output_dir: Path, log_tail: str, since_ns: int) -> tuple[dict[str, Any], str] | None:
    """``(figures, where they came from)`` from the first source that has any, in the order of
    ``SOURCES``: ``metrics.jsonl`` in ``output_dir`` (the attempt's), then HF's and Lightning's
    files below ``workdir``, then the log; None when none has a figure."""
    readers = (
        ("metrics.jsonl", output_dir, _from_jsonl),
        ("all_results.json", workdir, _from_all_results),
        ("trainer_state.json", workdir, _from_trainer_state),
        ("metrics.csv", workdir, _from_metrics_csv),
    )
    for name, root, read in readers:
        path = _newest(root, name, since_ns)
        if path is None:
            continue
        try:
            figures = read(path)
        except (OSError, ValueError, csv.Error):
            continue
        if figures:
            try:
                shown = path.relative_to(root)
            except ValueError:
                shown = path
            return figures, f"{name} ({shown})"
    figures = _from_stdout(log_tail)
    return (figures, "the last JSON line it printed") if figures else None
