"""sgd_trainer: deterministic batches, checkpoint cadence and atomic files, bit-identical
resume, kill_at_step through the real CLI, and the errors users read."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from flashml_workloads import sgd_trainer as sgd
from tests._support import REPO_ROOT, run_core_only

METRIC_KEYS = {"task_id", "steps", "started_from_step", "resumed", "final_loss", "weights", "bias"}


def write_csv(path: Path, n: int = 30, *, header: bool = True, seed: int = 5) -> Path:
    """Two features, label 1 where f1 - 0.5·f2 > 0 (linearly separable, both classes present)."""
    rng = random.Random(seed)
    lines = ["f1,f2,label"] if header else []
    for _ in range(n):
        a, b = rng.uniform(-2, 2), rng.uniform(-2, 2)
        lines.append(f"{a:.6f},{b:.6f},{1 if a - 0.5 * b > 0 else 0}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def spec(dataset: Path, resume: Path | None = None, **params) -> dict:
    inputs = {"dataset": str(dataset)}
    if resume is not None:
        inputs["resume"] = str(resume)
    return {"task_id": "trial-000", "params": params, "inputs": inputs}


def ckpts(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "ckpt").iterdir()) if (out / "ckpt").exists() else []


def cli(spec_doc: dict, tmp_path: Path, out: Path, name: str) -> subprocess.CompletedProcess[str]:
    spec_file = tmp_path / f"{name}.json"
    spec_file.write_text(json.dumps(spec_doc), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "flashml_workloads.sgd_trainer", "--spec", str(spec_file),
                           "--out", str(out)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
                          check=False)


def reference_weights(x, y, steps, lr):
    """An independent reading of zero init, batch s = rows (s·4 + j) mod n, mean gradient."""
    w, b = [0.0] * len(x[0]), 0.0
    for s in range(steps):
        rows = [(s * 4 + j) % len(x) for j in range(4)]
        errors = [1 / (1 + math.exp(-(b + sum(wk * v for wk, v in zip(w, x[i], strict=True))))) - y[i] for i in rows]
        w = [wk - lr * sum(e * x[i][k] for e, i in zip(errors, rows, strict=True)) / 4 for k, wk in enumerate(w)]
        b -= lr * sum(errors) / 4
    return w, b


def test_training_is_deterministic_and_follows_the_spec_batches(tmp_path):
    data = write_csv(tmp_path / "d.csv", n=7)  # 7 rows: batches wrap around the end
    first = sgd.run_trainer(spec(data, steps=9, lr=0.3), tmp_path / "a")
    second = sgd.run_trainer(spec(data, steps=9, lr=0.3), tmp_path / "b")
    assert first == second
    assert set(first) == METRIC_KEYS
    assert json.loads((tmp_path / "a" / "metrics.json").read_text()) == first
    x, y = sgd.load_dataset(data)
    w, b = reference_weights(x, y, 9, 0.3)
    assert first["weights"] == pytest.approx(w, rel=1e-12, abs=1e-15)
    assert first["bias"] == pytest.approx(b, rel=1e-12, abs=1e-15)
    assert (first["task_id"], first["steps"], first["started_from_step"]) == ("trial-000", 9, 0)
    assert first["resumed"] is False


def test_final_loss_is_the_mean_log_loss_over_the_whole_dataset_and_training_lowers_it(tmp_path):
    data = write_csv(tmp_path / "d.csv", n=40)
    metrics = sgd.run_trainer(spec(data, steps=200), tmp_path / "out")
    x, y = sgd.load_dataset(data)
    weights, bias = metrics["weights"], metrics["bias"]
    probabilities = [1 / (1 + math.exp(-(bias + sum(w * v for w, v in zip(weights, row, strict=True))))) for row in x]
    expected = sum(-math.log(p if label else 1 - p) for p, label in zip(probabilities, y, strict=True)) / len(x)
    assert metrics["final_loss"] == pytest.approx(expected, rel=1e-12)
    assert sgd.log_loss(x, y, [0.0, 0.0], 0.0) == pytest.approx(math.log(2))
    assert metrics["final_loss"] < 0.5 * math.log(2)  # zero init starts at log 2; separable data trains well


def test_checkpoints_every_n_steps_but_never_at_the_final_step(tmp_path):
    data = write_csv(tmp_path / "d.csv")
    sgd.run_trainer(spec(data, steps=300, checkpoint_every=100), tmp_path / "a")
    assert ckpts(tmp_path / "a") == ["step-000100.json", "step-000200.json"]
    sgd.run_trainer(spec(data, steps=25, checkpoint_every=10), tmp_path / "b")
    assert ckpts(tmp_path / "b") == ["step-000010.json", "step-000020.json"]
    sgd.run_trainer(spec(data, steps=99), tmp_path / "c")  # default checkpoint_every = 100
    assert ckpts(tmp_path / "c") == []
    state = json.loads((tmp_path / "b" / "ckpt" / "step-000020.json").read_text())
    assert set(state) == {"step", "weights", "bias"} and state["step"] == 20 and len(state["weights"]) == 2
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["ckpt", "metrics.json"]  # no temp files left
    assert sgd.checkpoint_name(7) == "step-000007.json"


@pytest.mark.parametrize("resume_step", [100, 200])
def test_resuming_from_a_checkpoint_is_bit_identical_to_an_uninterrupted_run(tmp_path, resume_step):
    data = write_csv(tmp_path / "d.csv", n=23)
    full = sgd.run_trainer(spec(data, steps=250, checkpoint_every=100, lr=0.37), tmp_path / "full")
    ckpt = tmp_path / "full" / "ckpt" / sgd.checkpoint_name(resume_step)
    resumed = sgd.run_trainer(spec(data, resume=ckpt, steps=250, checkpoint_every=100, lr=0.37), tmp_path / "again")
    assert resumed["weights"] == full["weights"] and resumed["bias"] == full["bias"]  # exact float equality
    assert [w.hex() for w in resumed["weights"]] == [w.hex() for w in full["weights"]]
    assert resumed["final_loss"] == full["final_loss"]
    assert (resumed["started_from_step"], resumed["resumed"], resumed["steps"]) == (resume_step, True, 250)
    # checkpoints after the resume point are written again, byte for byte the same
    expected = [name for name in ckpts(tmp_path / "full") if int(name[5:11]) > resume_step]
    assert ckpts(tmp_path / "again") == expected
    for name in expected:
        assert (tmp_path / "again" / "ckpt" / name).read_bytes() == (tmp_path / "full" / "ckpt" / name).read_bytes()


def test_a_seed_makes_runs_repeat_and_different_seeds_differ(tmp_path):
    data = write_csv(tmp_path / "d.csv", n=23)
    first = sgd.run_trainer(spec(data, steps=30, seed=7), tmp_path / "a")
    again = sgd.run_trainer(spec(data, steps=30, seed=7), tmp_path / "b")
    other = sgd.run_trainer(spec(data, steps=30, seed=8), tmp_path / "c")
    unseeded = sgd.run_trainer(spec(data, steps=30), tmp_path / "d")
    assert [w.hex() for w in first["weights"]] == [w.hex() for w in again["weights"]] and first == again
    assert first["weights"] != other["weights"] and first["final_loss"] != other["final_loss"]
    assert unseeded["weights"] not in (first["weights"], other["weights"])
    assert set(first) == METRIC_KEYS
    # without a seed a run is what it always was: rows in file order, from zero weights
    x, y = sgd.load_dataset(data)
    w, _ = reference_weights(x, y, 30, 0.1)
    assert unseeded["weights"] == pytest.approx(w, rel=1e-12) and first["weights"] != pytest.approx(w, rel=1e-6)


def test_a_seeded_run_resumes_bit_identically_and_only_under_its_seed(tmp_path):
    data = write_csv(tmp_path / "d.csv", n=23)
    full = sgd.run_trainer(spec(data, steps=25, checkpoint_every=10, seed=3), tmp_path / "full")
    ckpt = tmp_path / "full" / "ckpt" / sgd.checkpoint_name(20)
    assert json.loads(ckpt.read_text())["seed"] == 3
    resumed = sgd.run_trainer(spec(data, resume=ckpt, steps=25, checkpoint_every=10, seed=3), tmp_path / "again")
    assert [w.hex() for w in resumed["weights"]] == [w.hex() for w in full["weights"]]
    for seed in (4, None):
        params = {"steps": 25} if seed is None else {"steps": 25, "seed": seed}
        with pytest.raises(ValueError, match=rf"written by a run with seed 3, but params.seed is {seed}; .*resume "
                                             "with the seed of the run that wrote the checkpoint"):
            sgd.run_trainer(spec(data, resume=ckpt, **params), tmp_path / "other")


def test_resume_at_the_last_step_only_rewrites_the_metrics(tmp_path):
    data = write_csv(tmp_path / "d.csv")
    state = {"step": 50, "weights": [0.25, -1.5], "bias": 0.125}
    (tmp_path / "c.json").write_text(json.dumps(state))
    metrics = sgd.run_trainer(spec(data, resume=tmp_path / "c.json", steps=50), tmp_path / "out")
    assert (metrics["weights"], metrics["bias"], metrics["started_from_step"]) == ([0.25, -1.5], 0.125, 50)


@pytest.mark.parametrize(("kill", "left"), [(150, ["step-000100.json"]), (200, ["step-000100.json"]),
                                            (40, [])])
def test_kill_at_step_crashes_with_code_3_before_that_steps_checkpoint(tmp_path, kill, left):
    data = write_csv(tmp_path / "d.csv")
    with pytest.raises(sgd.SimulatedCrash) as crash:
        sgd.run_trainer(spec(data, steps=250, checkpoint_every=100, kill_at_step=kill), tmp_path / "out")
    assert isinstance(crash.value, SystemExit) and crash.value.code == 3 and crash.value.step == kill
    assert ckpts(tmp_path / "out") == left and not (tmp_path / "out" / "metrics.json").exists()


def test_kill_at_step_through_the_cli_then_resume_through_the_cli_finishes_identical(tmp_path):
    data = write_csv(tmp_path / "d.csv", n=31)
    params = {"steps": 250, "checkpoint_every": 100, "lr": 0.2}
    uninterrupted = sgd.run_trainer(spec(data, **params), tmp_path / "reference")

    crashed = cli(spec(data, **params, kill_at_step=170), tmp_path, tmp_path / "out1", "crash")
    assert crashed.returncode == 3, crashed.stderr
    assert "sgd_trainer: SimulatedCrash: kill_at_step=170" in crashed.stderr
    assert ckpts(tmp_path / "out1") == ["step-000100.json"]
    assert sorted(p.name for p in (tmp_path / "out1").iterdir()) == ["ckpt"]  # no metrics, no temp files
    last = tmp_path / "out1" / "ckpt" / "step-000100.json"
    assert json.loads(last.read_text())["step"] == 100  # a complete, loadable checkpoint
    assert last.read_bytes() == (tmp_path / "reference" / "ckpt" / "step-000100.json").read_bytes()

    # kill_at_step stays in the params: a resumed run ignores it
    resumed = cli(spec(data, resume=last, **params, kill_at_step=170), tmp_path, tmp_path / "out2", "resume")
    assert resumed.returncode == 0, resumed.stderr
    metrics = json.loads((tmp_path / "out2" / "metrics.json").read_text())
    assert json.loads(resumed.stdout) == metrics
    assert (metrics["started_from_step"], metrics["resumed"]) == (100, True)
    assert metrics["weights"] == uninterrupted["weights"] and metrics["bias"] == uninterrupted["bias"]
    assert ckpts(tmp_path / "out2") == ["step-000200.json"]


def test_main_in_process_returns_3_for_a_kill_and_1_for_an_error(tmp_path, capsys):
    data = write_csv(tmp_path / "d.csv")
    good = tmp_path / "kill.json"
    good.write_text(json.dumps(spec(data, steps=10, kill_at_step=5)))
    assert sgd.main(["--spec", str(good), "--out", str(tmp_path / "o")]) == 3
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(spec(data, steps=0)))
    assert sgd.main(["--spec", str(bad), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert "sgd_trainer: ValueError: sgd_trainer: params.steps is 0; it must be an integer >= 1" in err
    assert sgd.main(["--spec", str(tmp_path / "missing.json"), "--out", str(tmp_path / "o")]) == 1
    assert "sgd_trainer: FileNotFoundError: " in capsys.readouterr().err


def test_runs_with_the_standard_library_only(tmp_path):
    data = write_csv(tmp_path / "d.csv")
    (tmp_path / "s.json").write_text(json.dumps(spec(data, steps=30, checkpoint_every=10)))
    code = (f"from flashml_workloads.sgd_trainer import main\n"
            f"raise SystemExit(main(['--spec', {str(tmp_path / 's.json')!r}, '--out', {str(tmp_path / 'o')!r}]))")
    done = run_core_only(code, allowed=("flashml_workloads",))
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "o" / "metrics.json").read_text())["steps"] == 30


def test_header_row_is_optional_and_numeric_labels_may_be_written_as_floats(tmp_path):
    with_header = write_csv(tmp_path / "h.csv")
    without = write_csv(tmp_path / "n.csv", header=False)
    floats = tmp_path / "f.csv"
    floats.write_text("\n" + without.read_text().replace(",1\n", ",1.0\n").replace(",0\n", ",0e0\n") + "\n\n")
    runs = [sgd.run_trainer(spec(p, steps=20), tmp_path / p.stem) for p in (with_header, without, floats)]
    assert runs[0] == runs[1] == runs[2]


@pytest.mark.parametrize(("content", "message"), [
    ("a,b,y\n1,2,0\n3,4,2\n", r"line 3 has label '2'; logistic regression needs 0/1 labels"),
    ("1,2,0\n3,4,yes\n", r"line 2 has a non-numeric field"),
    ("1,2,0\n3,4,-1\n", r"label '-1'"),
    ("1,2,0\n3,0\n", r"line 2 has 2 columns, the first row has 3"),
    ("1,2,0\nnan,4,1\n", r"line 2 has a NaN or infinite value"),
    ("a,b,y\n", r"has no data rows"),
    ("0\n1\n", r"has 1 column; give at least one feature column"),
])
def test_bad_datasets_are_refused_with_the_line_and_the_fix(tmp_path, content, message):
    (tmp_path / "d.csv").write_text(content)
    with pytest.raises(ValueError, match=message):
        sgd.run_trainer(spec(tmp_path / "d.csv", steps=5), tmp_path / "out")
    assert not (tmp_path / "out" / "metrics.json").exists()


@pytest.mark.parametrize(("params", "message"), [
    ({}, r"params\.steps is required"),
    ({"steps": 0}, r"params\.steps is 0; it must be an integer >= 1"),
    ({"steps": "10"}, r"params\.steps is '10'"),
    ({"steps": True}, r"params\.steps is True"),
    ({"steps": 10, "lr": 0}, r"params\.lr is 0; it must be a finite number > 0"),
    ({"steps": 10, "lr": float("nan")}, r"params\.lr is nan"),
    ({"steps": 10, "checkpoint_every": 0}, r"params\.checkpoint_every is 0"),
    ({"steps": 10, "kill_at_step": 11}, r"kill_at_step is 11 but steps is 10"),
    ({"steps": 10, "kill_at_step": 0}, r"kill_at_step is 0"),
    ({"steps": 10, "checkpoint_evry": 5}, r"unknown params \['checkpoint_evry'\]; the accepted params are"),
    ({"steps": 10, "seed": "7"}, r"params\.seed is '7'; it must be an integer"),
    ({"steps": 10, "seed": True}, r"params\.seed is True"),
])
def test_bad_params_are_refused(tmp_path, params, message):
    data = write_csv(tmp_path / "d.csv")
    with pytest.raises(ValueError, match=message):
        sgd.run_trainer({"task_id": "t", "params": params, "inputs": {"dataset": str(data)}}, tmp_path / "out")


def test_bad_inputs_are_refused(tmp_path):
    data = write_csv(tmp_path / "d.csv")
    with pytest.raises(ValueError, match=r"inputs\.dataset is required"):
        sgd.run_trainer({"params": {"steps": 3}, "inputs": {}}, tmp_path / "out")
    with pytest.raises(ValueError, match=r"is not a file"):
        sgd.run_trainer(spec(tmp_path / "nope.csv", steps=3), tmp_path / "out")
    resume = tmp_path / "r.json"
    cases = [
        ("{not json", r"is not a readable JSON checkpoint"),
        (json.dumps({"step": 1, "weights": [0.0, 0.0]}), r'must be a JSON object with "step", "weights" and "bias"'),
        (json.dumps({"step": 11, "weights": [0.0, 0.0], "bias": 0.0}), r"step 11; it must be an integer in 0\.\.steps"),
        (json.dumps({"step": 1, "weights": [0.0], "bias": 0.0}), r"has 1 weights but the dataset has 2 feature"),
        (json.dumps({"step": 1, "weights": [0.0, "x"], "bias": 0.0}), r"list of finite numbers"),
        (json.dumps({"step": 1, "weights": [0.0, 0.0], "bias": None}), r"has bias None"),
    ]
    for content, message in cases:
        resume.write_text(content)
        with pytest.raises(ValueError, match=message):
            sgd.run_trainer(spec(data, resume=resume, steps=10), tmp_path / "out")


def test_divergence_is_reported_instead_of_writing_non_finite_weights(tmp_path):
    data = tmp_path / "d.csv"
    data.write_text("1e300,1\n-1e300,0\n")
    with pytest.raises(ValueError, match=r"training diverged .*; lower lr"):
        sgd.run_trainer(spec(data, steps=8, lr=1e10), tmp_path / "out")
    assert not (tmp_path / "out" / "metrics.json").exists()
