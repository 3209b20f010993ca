"""One trial of a scikit-learn sweep: 3-fold CV accuracy of a logistic regression.

Built for ``flashruntime.integrations.sklearn.sweep`` / ``hpo``, which pass every
parameter as ``--<key> <value>``:

    from flashruntime.integrations import sklearn as sk
    run = flash.submit(sk.hpo("examples/sklearn_sweep.py", {"C": [0.01, 1.0], "max_iter": [200]}))
    run.best_trial()   # highest accuracy_mean

Uses the breast-cancer data shipped with scikit-learn (no download) and writes
``metrics.json`` into ``FLASHML_OUTPUT_DIR`` (or the working directory).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--C", type=float, default=1.0, help="inverse regularisation strength")
    parser.add_argument("--max_iter", type=int, default=200, help="solver iterations")
    parser.add_argument("--seed", type=int, default=0, help="fold shuffling seed")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from sklearn.datasets import load_breast_cancer
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x, y = load_breast_cancer(return_X_y=True)
    model = make_pipeline(StandardScaler(), LogisticRegression(C=args.C, max_iter=args.max_iter))
    folds = StratifiedKFold(n_splits=3, shuffle=True, random_state=args.seed)
    scores = cross_val_score(model, x, y, cv=folds, scoring="accuracy")
    metrics = {
        "accuracy_mean": float(scores.mean()),
        "accuracy_std": float(scores.std()),
        "folds": [float(s) for s in scores],
        "C": args.C,
        "max_iter": args.max_iter,
    }
    out = Path(os.environ.get("FLASHML_OUTPUT_DIR") or ".")
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({"accuracy_mean": metrics["accuracy_mean"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
