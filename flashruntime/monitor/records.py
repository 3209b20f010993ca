"""Reading the JSON-lines files a run leaves (``metrics.jsonl``, ``telemetry.jsonl``): every
line that is a JSON object, and the numbers in it. A torn last line, foreign text, or a file
that cannot be read yields nothing rather than an error: these files are evidence, written
while the process that writes them may die."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from typing import Any

__all__ = ["finite_number", "json_lines", "step_records"]


def finite_number(value: object) -> float | None:
    """``value`` as a float when it is a finite int or float (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def json_lines(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Each line of the file that is a JSON object, in file order (streamed)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue  # a torn last line, or not JSON
                if isinstance(record, dict):
                    yield record
    except OSError:
        return


def step_records(path: str | os.PathLike[str]) -> Iterator[tuple[int, float, dict[str, Any]]]:
    """``(step, ts, record)`` of each record of a ``metrics.jsonl`` with an integer step and a
    finite numeric ts, in file order (streamed)."""
    for record in json_lines(path):
        step, ts = record.get("step"), finite_number(record.get("ts"))
        if isinstance(step, int) and not isinstance(step, bool) and ts is not None:
            yield step, ts, record


def json_object(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The JSON object in the file at ``path``; None when it cannot be read or holds anything else."""
    try:
        with open(path, encoding="utf-8") as handle:
            value = json.load(handle)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def last_step_record(path: str | os.PathLike[str], tail_bytes: int = 4096) -> dict[str, Any] | None:
    """The last record with an integer ``step`` among the final ``tail_bytes`` of a
    ``metrics.jsonl``, read from its end; None when there is none (or no file)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - tail_bytes))
            lines = handle.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int) and not isinstance(record["step"], bool):
            return record
    return None
