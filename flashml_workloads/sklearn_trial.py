"""Hyperparameter-trial task module: 3-fold cross-validated accuracy of one model.

``python -m flashml_workloads.sklearn_trial --spec spec.json --out OUTDIR`` scores one trial of a
``hyperparameter_search`` job — a logistic regression or a random forest — on the
``dataset`` CSV with stratified 3-fold CV and writes ``OUTDIR/metrics.json``. numpy and
scikit-learn (extra ``sklearn``) are imported inside functions.
"""

from __future__ import annotations

import math
import sys
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flashml_workloads._task_io import data_rows, task_main

__all__ = ["FOLDS", "MODELS", "SEED", "build_model", "load_dataset", "main", "resolve_params", "run_trial"]

FOLDS = 3
SEED = 0
# Each model's params and their defaults; `model` itself defaults to "logreg".
MODELS: dict[str, dict[str, Any]] = {
    "logreg": {"C": 1.0},
    "rf": {"n_estimators": 50, "max_depth": None},
}
_DEFAULT_MODEL = "logreg"
_LOGREG_MAX_ITER = 1000
_PROG = "sklearn_trial"
_INSTALL_HINT = "pip install 'flashruntime[sklearn]'"


def _accepted_keys() -> list[str]:
    return ["model", *sorted({key for defaults in MODELS.values() for key in defaults})]


def resolve_params(raw: Any) -> dict[str, Any]:
    """Check a trial's params → the params echoed in ``metrics.json``: the given ones, with the
    chosen model's defaults filled in.

    ``model`` is ``"logreg"`` (default; ``C`` > 0, default 1.0) or ``"rf"`` (``n_estimators`` >= 1,
    default 50; ``max_depth`` >= 1 or null for unlimited, default null). Params of the other model are
    accepted and ignored, so one grid may mix both models; any other key is refused."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"{_PROG}: params must be a JSON object, got {type(raw).__name__}")
    unknown = sorted(str(key) for key in raw if key not in _accepted_keys())
    if unknown:
        raise ValueError(f"{_PROG}: unknown params {unknown}; the accepted params are {_accepted_keys()}")
    model = raw.get("model", _DEFAULT_MODEL)
    if model not in MODELS:
        raise ValueError(
            f"{_PROG}: params.model is {model!r}; use one of {sorted(MODELS)} (default {_DEFAULT_MODEL!r})"
        )
    params = {**dict(raw), "model": model}
    for key, default in MODELS[model].items():
        params.setdefault(key, default)
    if model == "logreg":
        c = params["C"]
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) or c <= 0:
            raise ValueError(
                f"{_PROG}: params.C is {c!r}; it must be a finite number > 0 (inverse regularisation strength; "
                "default 1.0)"
            )
    else:
        trees, depth = params["n_estimators"], params["max_depth"]
        if isinstance(trees, bool) or not isinstance(trees, int) or trees < 1:
            raise ValueError(f"{_PROG}: params.n_estimators is {trees!r}; it must be an integer >= 1 (default 50)")
        if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 1):
            raise ValueError(
                f"{_PROG}: params.max_depth is {depth!r}; it must be an integer >= 1, or null for unlimited depth "
                "(the default)"
            )
    return params


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def load_dataset(path: str | Path) -> tuple[list[list[float]], list[Any]]:
    """Read a CSV of numeric feature columns with the class label in the last column → ``(x, y)``.

    Blank lines are skipped. The first non-blank line is a header, and skipped, when one of its
    feature fields is not a number. Labels are class names: stripped text, or numbers when every
    label is a number (so ``1`` and ``1.0`` are one class). Non-finite features and rows whose
    column count differs from the first row's are refused."""
    file = Path(path)
    x: list[list[float]] = []
    labels: list[str] = []
    for number, row in data_rows(file, _PROG, "the label"):
        features = [_number(field) for field in row[:-1]]
        if any(value is None for value in features):
            raise ValueError(
                f"{_PROG}: dataset {str(file)!r} line {number} has a feature that is not a finite number ({row!r}); "
                "every column but the last must be numeric"
            )
        x.append([float(value) for value in features])  # type: ignore[arg-type]
        labels.append(row[-1].strip())
    numeric = [_number(label) for label in labels]
    y: list[Any] = labels if any(value is None for value in numeric) else numeric
    return x, y


def _check_classes(y: list[Any], path: str) -> None:
    counts = Counter(y)
    if len(counts) < 2:
        raise ValueError(
            f"{_PROG}: dataset {path!r} has a single class {list(counts)}; classification needs two or more"
        )
    small = sorted(str(label) for label, count in counts.items() if count < FOLDS)
    if small:
        raise ValueError(
            f"{_PROG}: dataset {path!r} has classes {small} with fewer than {FOLDS} rows; stratified {FOLDS}-fold CV "
            f"needs at least {FOLDS} rows of every class"
        )


def _sklearn() -> Any:
    """Import numpy and scikit-learn, or say how to install them."""
    try:
        import numpy
        import sklearn  # noqa: F401
    except ImportError as exc:
        raise ModuleNotFoundError(
            f"{_PROG} needs numpy and scikit-learn, which are not installed ({exc}); install them with "
            f"{_INSTALL_HINT}",
            name=exc.name,
        ) from exc
    return numpy


def build_model(params: Mapping[str, Any]) -> Any:
    """The estimator for resolved ``params``: ``StandardScaler → LogisticRegression(C, max_iter=1000)``
    or ``RandomForestClassifier(n_estimators, max_depth)``, both with ``random_state=0``."""
    _sklearn()
    if params["model"] == "logreg":
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        return make_pipeline(
            StandardScaler(),
            LogisticRegression(C=float(params["C"]), max_iter=_LOGREG_MAX_ITER, random_state=SEED),
        )
    from sklearn.ensemble import RandomForestClassifier

    return RandomForestClassifier(
        n_estimators=params["n_estimators"], max_depth=params["max_depth"], random_state=SEED,
    )


def run_trial(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Score one trial; → the metrics (``main`` writes them to ``OUTDIR/metrics.json``).

    Stratified 3-fold CV shuffled with seed 0. Keys: ``task_id``, ``params`` (see ``resolve_params``),
    ``accuracy_mean``, ``accuracy_folds`` (one per fold, in fold order), ``n_samples`` and
    ``train_seconds`` (wall seconds of fitting and scoring all folds). Raises ``ValueError`` on bad
    params or inputs, ``ModuleNotFoundError`` without numpy/scikit-learn."""
    if not isinstance(spec, Mapping):
        raise ValueError(f"{_PROG}: the spec must be a JSON object with task_id, params and inputs")
    task_id = spec.get("task_id")
    if task_id is not None and not isinstance(task_id, str):
        raise ValueError(f"{_PROG}: task_id is {task_id!r}; it must be a string (or absent)")
    params = resolve_params(spec.get("params") or {})
    inputs = spec.get("inputs") or {}
    dataset = inputs.get("dataset") if isinstance(inputs, Mapping) else None
    if not isinstance(dataset, str) or not dataset:
        raise ValueError(
            f"{_PROG}: inputs.dataset is required: give the local path of a CSV (label in the last column)"
        )
    x, y = load_dataset(dataset)
    _check_classes(y, dataset)
    numpy = _sklearn()
    from sklearn.model_selection import StratifiedKFold, cross_val_score

    model = build_model(params)
    folds = StratifiedKFold(n_splits=FOLDS, shuffle=True, random_state=SEED)
    started = time.perf_counter()
    scores = cross_val_score(model, numpy.asarray(x, dtype=float), numpy.asarray(y), cv=folds, scoring="accuracy")
    train_seconds = time.perf_counter() - started
    accuracy_folds = [float(score) for score in scores]
    return {
        "task_id": task_id,
        "params": params,
        "accuracy_mean": float(numpy.mean(scores)),
        "accuracy_folds": accuracy_folds,
        "n_samples": len(x),
        "train_seconds": train_seconds,
    }


def main(argv: list[str] | None = None) -> int:
    """Task-module CLI: ``--spec spec.json --out OUTDIR``; 0 on success, 1 on failure."""
    return task_main("sklearn_trial", argv, lambda spec, _out: run_trial(spec), write_metrics=True)


if __name__ == "__main__":
    sys.exit(main())
