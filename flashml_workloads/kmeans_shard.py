"""K-means task module: the assignment half of one Lloyd iteration over one shard.

``python -m flashml_workloads.kmeans_shard --spec spec.json --out OUTDIR`` reads the ``shard``
input (a CSV of float rows, no header), assigns every row to its nearest centroid from the
``centroids`` param, and writes the per-centroid partial sums and counts plus the shard's
inertia to ``OUTDIR/metrics.json``; ``kmeans_driver.reduce_partials`` turns the partials of
every shard into the next centroids. Standard library only.
"""

from __future__ import annotations

import csv
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flashml_workloads._task_io import task_main

__all__ = ["METRIC_KEYS", "SUMS_DECIMALS", "assign", "check_centroids", "main", "partial_of", "read_rows",
           "run_shard"]

METRIC_KEYS = ("task_id", "sums", "counts", "inertia", "n")
SUMS_DECIMALS = 10


def _finite_number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where} is {value!r}; it must be a number")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{where} is {value!r}; it must be finite (no NaN or infinity)")
    return number


def check_centroids(raw: Any, name: str = "params.centroids") -> list[list[float]]:
    """Centroids → a non-empty list of equally long, non-empty rows of finite floats (``name`` labels errors)."""
    if isinstance(raw, (str, bytes)) or not isinstance(raw, (list, tuple)) or not raw:
        raise ValueError(f"{name} is {raw!r}; give a non-empty list of centroid rows, e.g. [[0.0, 1.0], [2.0, 3.0]]")
    centroids: list[list[float]] = []
    for j, row in enumerate(raw):
        if not isinstance(row, (list, tuple)) or not row:
            raise ValueError(f"{name}[{j}] is {row!r}; each centroid must be a non-empty list of numbers")
        if centroids and len(row) != len(centroids[0]):
            raise ValueError(
                f"{name}[{j}] has {len(row)} coordinates but {name}[0] has {len(centroids[0])}; "
                "every centroid needs the same dimension"
            )
        centroids.append([_finite_number(v, f"{name}[{j}][{d}]") for d, v in enumerate(row)])
    return centroids


def read_rows(path: str | Path, dim: int | None = None) -> list[list[float]]:
    """The float rows of a headerless CSV; blank lines are skipped.

    Rows must all have the same number of columns (``dim`` when given), and every cell must be
    a finite number; otherwise ``ValueError`` names the line and column.
    """
    return [row for _, row in _numbered_rows(path, dim)]


def _numbered_rows(path: str | Path, dim: int | None) -> list[tuple[int, list[float]]]:
    """``read_rows`` with the CSV line number of every row, so later checks can name it."""
    rows: list[tuple[int, list[float]]] = []
    expected: int | None = None
    first_line: int | None = None
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        for cells in reader:
            line = reader.line_num
            if not cells or all(not cell.strip() for cell in cells):
                continue
            if dim is not None and len(cells) != dim:
                raise ValueError(
                    f"shard line {line} has {len(cells)} values but the centroids have {dim} coordinates; "
                    "every row needs one value per centroid coordinate"
                )
            if expected is not None and len(cells) != expected:
                raise ValueError(
                    f"shard line {line} has {len(cells)} values but line {first_line} has {expected}; "
                    "every row needs the same number of columns"
                )
            row = []
            for col, cell in enumerate(cells, start=1):
                try:
                    value = float(cell)
                except ValueError:
                    raise ValueError(
                        f"shard line {line}, column {col} is {cell!r}, which is not a number; the shard is a CSV "
                        "of float rows without a header"
                    ) from None
                if not math.isfinite(value):
                    raise ValueError(f"shard line {line}, column {col} is {cell!r}; values must be finite")
                row.append(value)
            if expected is None:
                expected, first_line = len(row), line
            rows.append((line, row))
    return rows


def assign(rows: Sequence[Sequence[float]], centroids: Sequence[Sequence[float]]) -> tuple[list[int], list[float]]:
    """Nearest centroid of every row by squared Euclidean distance (ties → the lowest index);
    → ``(labels, squared distances)``. A distance beyond float64 counts as ``inf`` (it loses to
    any finite one); a row with no finite distance gets label 0 and distance ``inf``."""
    labels, distances = [], []
    for row in rows:
        best, best_d2 = 0, math.inf
        for j, centroid in enumerate(centroids):
            try:
                d2 = math.fsum((x - c) * (x - c) for x, c in zip(row, centroid))
            except OverflowError:  # finite squares whose exact sum leaves float64
                d2 = math.inf
            if d2 < best_d2:  # strict: an equal distance keeps the lower index
                best, best_d2 = j, d2
        labels.append(best)
        distances.append(best_d2)
    return labels, distances


def run_shard(spec: Mapping[str, Any]) -> dict[str, Any]:
    """One shard's partial: ``{task_id, sums, counts, inertia, n}`` (sums rounded to 10 dp)."""
    params = spec.get("params") or {}
    inputs = spec.get("inputs") or {}
    if not isinstance(params, Mapping) or "centroids" not in params:
        raise ValueError("params.centroids is missing; the driver supplies the current centroids")
    centroids = check_centroids(params["centroids"])
    if not isinstance(inputs, Mapping) or not inputs.get("shard"):
        raise ValueError("input 'shard' is missing; give the local path of the shard CSV as inputs.shard")
    numbered = _numbered_rows(inputs["shard"], dim=len(centroids[0]))
    return partial_of(numbered, centroids, str(spec.get("task_id") or ""))


def partial_of(numbered: Sequence[tuple[int, list[float]]], centroids: list[list[float]],
               task_id: str = "", where: str = "shard line") -> dict[str, Any]:
    """The partial of rows already read (each with its number, for messages) against checked
    ``centroids``: what ``run_shard`` writes as ``metrics.json``."""
    rows = [row for _, row in numbered]
    labels, distances = assign(rows, centroids)
    for (line, _), d2 in zip(numbered, distances):
        if not math.isfinite(d2):
            raise ValueError(
                f"{where} {line}: the squared distance from this row to its nearest centroid overflows "
                f"float64 (coordinates more than about 1e154 apart); rescale the data, e.g. standardise each column"
            )
    members: list[list[list[float]]] = [[] for _ in centroids]
    for row, label in zip(rows, labels):
        members[label].append(row)
    dim = len(centroids[0])
    sums = [[_fsum([row[d] for row in group], f"column {d + 1} of the rows nearest params.centroids[{j}]")
             for d in range(dim)] for j, group in enumerate(members)]
    return {
        "task_id": task_id,
        "sums": [[round(total, SUMS_DECIMALS) for total in group] for group in sums],
        "counts": [len(group) for group in members],
        "inertia": _fsum(distances, "the squared distances (inertia)"),
        "n": len(rows),
    }


def _fsum(values: list[float], what: str) -> float:
    """``math.fsum`` of finite values, refusing a total beyond float64 (metrics.json holds no infinity)."""
    try:
        return math.fsum(values)
    except OverflowError:
        raise ValueError(
            f"shard: the sum of {what} overflows float64; rescale the data, e.g. standardise each column"
        ) from None


def main(argv: list[str] | None = None) -> int:
    """Task-module CLI: ``--spec spec.json --out OUTDIR``; 0 on success, 1 on failure."""
    return task_main("kmeans_shard", argv, lambda spec, _out: run_shard(spec), write_metrics=True,
                     summary=lambda metrics: {key: metrics[key] for key in ("task_id", "counts", "inertia", "n")})


if __name__ == "__main__":
    sys.exit(main())
