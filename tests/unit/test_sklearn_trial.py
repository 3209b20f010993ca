"""sklearn_trial: stratified 3-fold CV of logreg and rf on a small synthetic CSV,
determinism, the params echo, the errors users read, and the hint when scikit-learn is missing."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from flashml_workloads import sklearn_trial as st
from tests._support import CORE_ALLOWED, run_core_only

METRIC_KEYS = {"task_id", "params", "accuracy_mean", "accuracy_folds", "n_samples", "train_seconds"}
CENTRES = {"setosa": (0.0, 0.0), "versicolor": (4.0, 0.0), "virginica": (0.0, 4.0)}


def write_csv(path: Path, per_class: int = 20, seed: int = 3) -> Path:
    """Three well-separated Gaussian blobs with a header row and text labels, like iris."""
    rng = random.Random(seed)
    lines = ["x1,x2,species"]
    for _ in range(per_class):
        for label, (cx, cy) in CENTRES.items():
            lines.append(f"{rng.gauss(cx, 0.7):.5f},{rng.gauss(cy, 0.7):.5f},{label}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def spec(dataset: Path, **params) -> dict:
    return {"task_id": "trial-001", "params": params, "inputs": {"dataset": str(dataset)}}


def check_metrics(metrics: dict, n: int) -> None:
    assert set(metrics) == METRIC_KEYS
    assert len(metrics["accuracy_folds"]) == 3
    assert all(0.0 <= a <= 1.0 for a in metrics["accuracy_folds"])
    assert metrics["accuracy_mean"] == pytest.approx(sum(metrics["accuracy_folds"]) / 3, rel=1e-12)
    assert 0.0 <= metrics["accuracy_mean"] <= 1.0
    assert metrics["n_samples"] == n and metrics["task_id"] == "trial-001"
    assert isinstance(metrics["train_seconds"], float) and metrics["train_seconds"] >= 0.0


def test_logreg_scores_three_stratified_folds(tmp_path):
    pytest.importorskip("sklearn")
    metrics = st.run_trial(spec(write_csv(tmp_path / "d.csv"), model="logreg", C=0.5))
    check_metrics(metrics, 60)
    assert metrics["params"] == {"model": "logreg", "C": 0.5}
    assert metrics["accuracy_mean"] > 0.9  # separated blobs: a fitted model, not a guess (chance is 1/3)
    # C near zero flattens the model towards the prior: a worse score proves C reaches the estimator
    weak = st.run_trial(spec(tmp_path / "d.csv", model="logreg", C=1e-6))
    assert weak["accuracy_mean"] < metrics["accuracy_mean"]


def test_rf_fills_its_defaults_and_echoes_the_params(tmp_path):
    pytest.importorskip("sklearn")
    data = write_csv(tmp_path / "d.csv")
    metrics = st.run_trial(spec(data, model="rf", n_estimators=8, max_depth=3))
    check_metrics(metrics, 60)
    assert metrics["params"] == {"model": "rf", "n_estimators": 8, "max_depth": 3}
    assert metrics["accuracy_mean"] > 0.9
    defaults = st.run_trial(spec(data, model="rf"))
    assert defaults["params"] == {"model": "rf", "n_estimators": 50, "max_depth": None}


def test_model_defaults_to_logreg_with_c_1(tmp_path):
    pytest.importorskip("sklearn")
    metrics = st.run_trial(spec(write_csv(tmp_path / "d.csv")))
    assert metrics["params"] == {"model": "logreg", "C": 1.0}


@pytest.mark.parametrize("params", [{"model": "logreg", "C": 2.0}, {"model": "rf", "n_estimators": 6}])
def test_two_runs_give_the_same_scores(tmp_path, params):
    pytest.importorskip("sklearn")
    data = write_csv(tmp_path / "d.csv", per_class=12, seed=11)
    noisy = data.read_text().splitlines()
    # overlapping classes, so fold assignment and rf randomness both move the scores
    noisy += [f"{2.0 + 0.01 * i},{2.0 - 0.01 * i},{list(CENTRES)[i % 3]}" for i in range(15)]
    data.write_text("\n".join(noisy) + "\n")
    first, second = st.run_trial(spec(data, **params)), st.run_trial(spec(data, **params))
    first.pop("train_seconds"), second.pop("train_seconds")
    assert first == second


def test_folds_are_stratified_shuffled_with_seed_0_and_the_forest_uses_random_state_0(tmp_path):
    pytest.importorskip("sklearn")
    import numpy as np
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.model_selection import StratifiedKFold, cross_val_score

    data = write_csv(tmp_path / "d.csv", per_class=15, seed=8)
    lines = data.read_text().splitlines()
    lines += [f"{1.5 + 0.02 * i},{1.5},{list(CENTRES)[i % 3]}" for i in range(12)]  # overlap: folds matter
    data.write_text("\n".join(lines) + "\n")
    x, y = st.load_dataset(data)
    expected = cross_val_score(RandomForestClassifier(n_estimators=7, max_depth=2, random_state=0), np.asarray(x),
                               np.asarray(y), cv=StratifiedKFold(n_splits=3, shuffle=True, random_state=0))
    metrics = st.run_trial(spec(data, model="rf", n_estimators=7, max_depth=2))
    assert metrics["accuracy_folds"] == [float(a) for a in expected]
    assert metrics["n_samples"] == 57


def test_cli_writes_metrics_json_to_out(tmp_path, capsys):
    pytest.importorskip("sklearn")
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec(write_csv(tmp_path / "d.csv"), model="logreg", C=10.0)))
    assert st.main(["--spec", str(spec_file), "--out", str(tmp_path / "out")]) == 0
    written = json.loads((tmp_path / "out" / "metrics.json").read_text())
    check_metrics(written, 60)
    assert written["params"] == {"model": "logreg", "C": 10.0}
    assert json.loads(capsys.readouterr().out) == written
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["metrics.json"]


def test_numeric_labels_and_a_missing_header_work(tmp_path):
    pytest.importorskip("sklearn")
    text = write_csv(tmp_path / "d.csv").read_text().splitlines()[1:]
    for index, name in enumerate(CENTRES):
        text = [line.replace(name, ("0", "1.0", "2e0")[index]) for line in text]
    (tmp_path / "n.csv").write_text("\n".join(text) + "\n")
    named = st.run_trial(spec(tmp_path / "d.csv", model="rf", n_estimators=5))
    numeric = st.run_trial(spec(tmp_path / "n.csv", model="rf", n_estimators=5))
    assert numeric["accuracy_folds"] == named["accuracy_folds"]  # same classes, same folds


@pytest.mark.parametrize(("params", "message"), [
    ({"model": "svm"}, r"params\.model is 'svm'; use one of \['logreg', 'rf'\]"),
    ({"model": "logreg", "C": 0}, r"params\.C is 0; it must be a finite number > 0"),
    ({"model": "logreg", "C": "1"}, r"params\.C is '1'"),
    ({"model": "logreg", "C": float("inf")}, r"params\.C is inf"),
    ({"model": "rf", "n_estimators": 0}, r"params\.n_estimators is 0; it must be an integer >= 1"),
    ({"model": "rf", "n_estimators": 2.5}, r"params\.n_estimators is 2\.5"),
    ({"model": "rf", "max_depth": 0}, r"params\.max_depth is 0; it must be an integer >= 1, or null"),
    ({"model": "logreg", "gamma": 1}, r"unknown params \['gamma'\]; the accepted params are \['model', 'C',"),
])
def test_bad_params_are_refused_before_anything_runs(tmp_path, params, message):
    with pytest.raises(ValueError, match=message):
        st.run_trial(spec(tmp_path / "never-read.csv", **params))


def test_the_other_models_params_are_accepted_so_one_grid_can_mix_models():
    assert st.resolve_params({"model": "rf", "C": 0.1}) == {"model": "rf", "C": 0.1, "n_estimators": 50,
                                                            "max_depth": None}
    assert st.resolve_params({"C": 3, "max_depth": 2}) == {"model": "logreg", "C": 3, "max_depth": 2}


@pytest.mark.parametrize(("content", "message"), [
    ("x,y\n1,a\n2,a\n3,a\n", r"has a single class \['a'\]"),
    ("1,a\n2,a\n3,a\n4,b\n5,b\n", r"classes \['b'\] with fewer than 3 rows"),
    ("1,2,a\n3,b\n", r"line 2 has 2 columns, the first row has 3"),
    ("1,2,a\n3,x,b\n", r"line 2 has a feature that is not a finite number"),
    ("1,2,a\nnan,1,b\n", r"line 2 has a feature that is not a finite number"),
    ("x,y\n\n", r"has no data rows"),
    ("a\nb\n", r"has 1 column"),
])
def test_bad_datasets_are_refused(tmp_path, content, message):
    (tmp_path / "d.csv").write_text(content)
    with pytest.raises(ValueError, match=message):
        st.run_trial(spec(tmp_path / "d.csv"))


def test_bad_inputs_are_refused_and_the_cli_exits_1(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"inputs\.dataset is required"):
        st.run_trial({"task_id": "t", "params": {}, "inputs": {}})
    with pytest.raises(ValueError, match=r"is not a file"):
        st.run_trial(spec(tmp_path / "missing.csv"))
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec(tmp_path / "d.csv", model="svm")))
    assert st.main(["--spec", str(spec_file), "--out", str(tmp_path / "out")]) == 1
    assert "sklearn_trial: ValueError: sklearn_trial: params.model is 'svm'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_without_scikit_learn_the_error_names_the_extra(tmp_path):
    write_csv(tmp_path / "d.csv")
    (tmp_path / "spec.json").write_text(json.dumps(spec(tmp_path / "d.csv", model="logreg", C=1.0)))
    code = ("import flashml_workloads.sklearn_trial as st\n"
            f"raise SystemExit(st.main(['--spec', {str(tmp_path / 'spec.json')!r}, '--out', {str(tmp_path / 'o')!r}]))")
    done = run_core_only(code, allowed=(*CORE_ALLOWED, "numpy"), refuse=("sklearn",))
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("sklearn_trial: ModuleNotFoundError: sklearn_trial needs numpy and scikit-learn")
    assert "pip install 'flashruntime[sklearn]'" in done.stderr
    assert not (tmp_path / "o").exists()
    # and the module itself imports with neither numpy nor scikit-learn
    bare = run_core_only("import flashml_workloads.sklearn_trial as st; print(st.resolve_params({'C': 2}))")
    assert bare.returncode == 0 and "'model': 'logreg'" in bare.stdout, bare.stderr
