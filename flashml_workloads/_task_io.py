"""Files and CLI of the task modules, standard library only: the labelled CSV
they read, the JSON they write, and the ``--spec spec.json --out OUTDIR`` entry point.

``data_rows`` does the part every CSV reader agrees on (blank lines, an optional header,
at least one feature column, no ragged rows); each module then parses its labels its own
way (``sgd_trainer``: 0/1; ``sklearn_trial``: class names). ``write_json_atomic`` is how
``metrics.json`` and checkpoints are written, so a worker never uploads half a file.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["data_rows", "is_number", "task_main", "write_json_atomic"]


def is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def data_rows(path: str | Path, prog: str, label_hint: str) -> list[tuple[int, list[str]]]:
    """``(line number, fields)`` of every data row of ``path``.

    Blank lines are skipped; the first non-blank line is a header, and skipped, when one of
    its feature fields is not a number. No rows, fewer than two columns, or a row whose
    column count differs from the first row's → ``ValueError`` naming ``prog``, the file and
    the line (``label_hint`` says what the last column must hold).
    """
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"{prog}: inputs.dataset {str(file)!r} is not a file; give a CSV path")
    with file.open(newline="", encoding="utf-8") as handle:
        lines = [(number, row) for number, row in enumerate(csv.reader(handle), start=1)
                 if row and any(field.strip() for field in row)]
    if lines and not all(is_number(field) for field in lines[0][1][:-1]):
        lines = lines[1:]  # a header row
    if not lines:
        raise ValueError(f"{prog}: dataset {str(file)!r} has no data rows; give a CSV with a row per sample")
    width = len(lines[0][1])
    if width < 2:
        raise ValueError(
            f"{prog}: dataset {str(file)!r} line {lines[0][0]} has {width} column; give at least one feature "
            f"column and {label_hint} as the last column"
        )
    for number, row in lines:
        if len(row) != width:
            raise ValueError(
                f"{prog}: dataset {str(file)!r} line {number} has {len(row)} columns, the first row has {width}; "
                "every row needs the same columns"
            )
    return lines


def write_json_atomic(path: Path, document: Mapping[str, Any]) -> None:
    """Write ``document`` to a temporary file beside ``path``, fsync it, rename it over ``path``
    and fsync the directory: a crash leaves either the old file or the complete new one, never a
    torn one. NaN is refused. (``flashruntime.files.write_atomic``'s rule, here again because task
    modules import nothing but the standard library.)"""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(document, handle, allow_nan=False)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    try:
        directory = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(directory)
    except OSError:
        pass
    finally:
        os.close(directory)


def task_main(
    name: str,
    argv: Sequence[str] | None,
    run: Callable[[dict[str, Any], Path], Mapping[str, Any]],
    *,
    out_help: str = "output directory (metrics.json)",
    exit_codes: Mapping[type[BaseException], int] | None = None,
    summary: Callable[[Mapping[str, Any]], Any] | None = None,
    write_metrics: bool = False,
) -> int:
    """The task-module CLI: ``python -m flashml_workloads.<name> --spec spec.json --out OUTDIR``.

    ``run(spec, out)`` does the work and leaves ``OUTDIR/metrics.json`` (or, with
    ``write_metrics``, returns the metrics for this function to write, atomically); the
    metrics (or ``summary`` of them) are printed as JSON. A failure prints ``<name>: <Type>: <message>``
    to stderr, the reason the worker agent reports, and exits 1, or the code ``exit_codes``
    maps its exception type to.
    """
    parser = argparse.ArgumentParser(prog=f"python -m flashml_workloads.{name}")
    parser.add_argument("--spec", required=True, help="spec.json: {task_id, params, inputs}")
    parser.add_argument("--out", required=True, help=out_help)
    args = parser.parse_args(argv)
    try:
        spec = json.loads(Path(args.spec).read_text(encoding="utf-8"))
        if not isinstance(spec, dict):
            raise ValueError(f"{args.spec} must hold a JSON object {{task_id, params, inputs}}")
        metrics = run(spec, Path(args.out))
        if write_metrics:
            write_json_atomic(Path(args.out) / "metrics.json", metrics)
    except BaseException as exc:  # the CLI's contract is an exit code plus a readable reason
        code = next((code for kind, code in (exit_codes or {}).items() if isinstance(exc, kind)), None)
        if code is None and not isinstance(exc, Exception):
            raise  # KeyboardInterrupt and friends keep their meaning
        print(f"{name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1 if code is None else code
    print(json.dumps(summary(metrics) if summary is not None else metrics, sort_keys=True))
    return 0
