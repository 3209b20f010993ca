"""``examples/sklearn_sweep.py`` runs the exact argv ``integrations.sklearn.hpo`` builds and
writes the metric the sweep ranks by; a real subprocess per trial."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flashruntime.integrations import sklearn as sk
from tests._support import REPO_ROOT

SCRIPT = REPO_ROOT / "examples" / "sklearn_sweep.py"


def _run(argv: list[str], cwd: Path, out: Path | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "FLASHML_OUTPUT_DIR"}
    if out is not None:
        env["FLASHML_OUTPUT_DIR"] = str(out)
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(((out or cwd) / "metrics.json").read_text())


def test_each_trial_of_an_hpo_grid_writes_its_accuracy(tmp_path: Path) -> None:
    pytest.importorskip("sklearn")
    workload = sk.hpo(str(SCRIPT), {"C": [0.0001, 1.0], "max_iter": [300]}, python=sys.executable)
    results = []
    for index, params in enumerate(workload.task_params or []):
        metrics = _run(workload.argv(params), tmp_path, tmp_path / f"trial-{index}")
        assert (metrics["C"], metrics["max_iter"]) == (params["C"], params["max_iter"])
        assert len(metrics["folds"]) == 3 and 0.0 < metrics["accuracy_mean"] <= 1.0
        results.append(metrics)
    # Near-zero C all but removes the features' weight; a sane C must classify better.
    assert results[1]["accuracy_mean"] > results[0]["accuracy_mean"]
    again = _run(workload.argv(workload.task_params[1]), tmp_path, None)  # type: ignore[index]
    assert again["accuracy_mean"] == results[1]["accuracy_mean"]  # deterministic folds; written to the cwd
