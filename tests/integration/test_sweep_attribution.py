"""A sweep never gives one trial another's result: trials that write ``metrics.json`` into
their working directory, side by side, each report their own figure (the figure of the
same arguments run alone), and the SDK and the command pick the same best trial."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import flashruntime as flash
from flashruntime.launchers import LaunchState
from flashruntime.workloads.command import CommandWorkload, OutputSpec, Source
from tests._support import REPO_ROOT

PY = sys.executable

# A sweep script as people write them: arguments in, metrics.json into the working directory.
# Its pace depends on the learning rate, so trials running side by side finish out of order
# and overwrite each other's file in a shared directory.
TRAIN = """
import argparse, json, time
parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, required=True)
args = parser.parse_args()
weights = [1.0, -2.0, 0.5]
for step in range(200):
    weights = [w - args.lr * 2 * w for w in weights]
loss = sum(w * w for w in weights) * 10
json.dump({"final_loss": round(loss, 6), "lr": args.lr}, open("metrics.json", "w"))
time.sleep(0.3 if args.lr < 0.005 else 1.2)
json.dump({"final_loss": round(loss, 6), "lr": args.lr}, open("metrics.json", "w"))
with open("data/seen.txt") as f:
    assert f.read() == "project data"
"""

LRS = [0.0001, 0.001, 0.01, 0.1]


def _project(tmp_path: Path) -> Path:
    source = tmp_path / "project"
    (source / "data").mkdir(parents=True)
    (source / "train.py").write_text(TRAIN)
    (source / "data" / "seen.txt").write_text("project data")
    (source / "metrics.json").write_text(json.dumps({"final_loss": 999.0}))  # an old run's file, never credited
    return source


def _alone(source: Path, lr: float, tmp_path: Path) -> float:
    work = tmp_path / f"alone-{lr}"
    work.mkdir()
    (work / "data").symlink_to(source / "data")
    subprocess.run([PY, str(source / "train.py"), "--lr", str(lr)], cwd=work, check=True, timeout=60)
    return json.loads((work / "metrics.json").read_text())["final_loss"]


def test_a_parallel_sweep_writing_metrics_json_into_its_working_directory_reports_each_trials_own_figure(
        tmp_path: Path) -> None:
    source = _project(tmp_path)
    workload = CommandWorkload(command="python train.py --lr {lr}", source=Source(path=str(source)),
                               task_params=[{"lr": lr} for lr in LRS],
                               outputs=OutputSpec(primary_metric="final_loss"))
    run = flash.submit(workload, output_dir=tmp_path / "out", watch=False, quiet=True, max_concurrent_trials=2)
    assert run.state is LaunchState.SUCCEEDED, run.logs()
    alone = {lr: _alone(source, lr, tmp_path) for lr in LRS}
    assert len(set(alone.values())) == len(LRS)  # every trial's figure tells it apart
    by_lr = {trial["params"]["lr"]: trial["final_loss"] for trial in run.trials}
    assert by_lr == alone
    assert run.best_trial()["params"] == {"lr": 0.1}  # a loss: the lowest wins
    table = {row["params"]["lr"]: row["metric"] for row in run.trial_table()}
    assert table == alone
    assert json.loads((source / "metrics.json").read_text()) == {"final_loss": 999.0}  # the source is untouched
    workdir = tmp_path / "out" / "local-001" / "workdir"
    assert (workdir / "train.py").is_symlink() and (workdir / "metrics.json").is_file()


SHARED_DIR = """
import json, os, sys, time
lr = float(sys.argv[1])
os.makedirs("outputs", exist_ok=True)
time.sleep(0.2 if lr < 0.05 else 0.8)
json.dump({"score": lr}, open("outputs/metrics.json", "w"))
time.sleep(0.8 if lr < 0.05 else 0.1)
"""


def test_a_file_written_into_an_existing_directory_of_the_source_is_each_trials_own(tmp_path: Path) -> None:
    source = tmp_path / "project"
    (source / "outputs").mkdir(parents=True)  # already there: the view makes it a directory of its own
    (source / "t.py").write_text(SHARED_DIR)
    workload = CommandWorkload(command=[PY, "t.py", "{lr}"], source=Source(path=str(source)),
                               task_params=[{"lr": 0.01}, {"lr": 0.1}],
                               outputs=OutputSpec(collect=["out*/metrics.json"], primary_metric="score"))
    run = flash.submit(workload, output_dir=tmp_path / "out", watch=False, quiet=True, max_concurrent_trials=2)
    copies = [tmp_path / "out" / f"local-00{n}" / f"task-00{n}" / "outputs" / "metrics.json" for n in (0, 1)]
    assert [json.loads(copy.read_text())["score"] for copy in copies] == [0.01, 0.1]
    assert not (source / "outputs" / "metrics.json").exists()
    assert not [e for e in run.events if e["type"] == "OUTPUT_UNATTRIBUTABLE"]


def test_a_file_written_into_a_linked_directory_by_trials_running_at_once_is_never_credited(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flashruntime.local import trial_workdir

    monkeypatch.setattr(trial_workdir, "MAX_ENTRIES", 0)  # a project too large to mirror: directories linked whole
    source = tmp_path / "project"
    (source / "outputs").mkdir(parents=True)
    (source / "t.py").write_text(SHARED_DIR)
    workload = CommandWorkload(command=[PY, "t.py", "{lr}"], source=Source(path=str(source)),
                               task_params=[{"lr": 0.01}, {"lr": 0.1}],
                               outputs=OutputSpec(collect=["out*/metrics.json"], primary_metric="score"))
    run = flash.submit(workload, output_dir=tmp_path / "out", watch=False, quiet=True, max_concurrent_trials=2)
    refused = [e["message"] for e in run.events if e["type"] == "OUTPUT_UNATTRIBUTABLE"]
    assert len(refused) == 2
    assert "outputs/metrics.json lies in a directory of the source that every trial running at once writes to" \
        in refused[0]
    assert "$FLASHML_OUTPUT_DIR" in refused[0]


SCORE = "import json, sys; json.dump({'loss': float(sys.argv[1]), 'accuracy': float(sys.argv[2])}, open('metrics.json', 'w'))"
PARAMS = [{"loss": 0.5, "acc": 0.7}, {"loss": 0.2, "acc": 0.6}, {"loss": 0.9, "acc": 0.9}]


def _cli_best(source: Path, out: Path, metric: str, mode: str | None) -> dict[str, object]:
    args = [PY, "-m", "flashruntime.cli", "submit", f"{PY} s.py {{loss}} {{acc}}", "--source", str(source),
            "--task-params", json.dumps(PARAMS), "--metric", metric, "--output-dir", str(out), "--json", "--quiet",
            "--no-watch"]
    if mode is not None:
        args += ["--mode", mode]
    result = subprocess.run(args, capture_output=True, text=True, cwd=REPO_ROOT, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("metric", ["loss", "accuracy"])
@pytest.mark.parametrize("mode", [None, "min", "max"])
def test_the_sdk_and_the_command_pick_the_same_best_trial(tmp_path: Path, metric: str, mode: str | None) -> None:
    source = tmp_path / "project"
    source.mkdir()
    (source / "s.py").write_text(SCORE)
    workload = CommandWorkload(command=f"{PY} s.py {{loss}} {{acc}}", source=Source(path=str(source)),
                               task_params=PARAMS)
    run = flash.submit(workload, output_dir=tmp_path / "sdk", watch=False, quiet=True, metric=metric, mode=mode)
    cli = _cli_best(source, tmp_path / "cli", metric, mode)
    expected_mode = mode or ("min" if metric == "loss" else "max")
    values = [trial[metric] for trial in run.trials]
    expected = (min if expected_mode == "min" else max)(values)
    assert run.mode == cli["mode"] == expected_mode
    assert run.best_trial()[metric] == cli["best"][metric] == expected
    assert run.best_trial() == cli["best"]
