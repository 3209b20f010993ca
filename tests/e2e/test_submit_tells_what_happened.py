"""``flashruntime submit`` as a user sees it on the terminal, through the installed console
script: the job's own output as it runs, the failure summary, commands that cannot start
failing at once, sweep tables and parallel trials, and where runs are kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

CONSOLE_SCRIPT = Path(sys.executable).with_name("flashruntime")
PY = sys.executable

TRIAL = """
import json, os, sys
lr = float(sys.argv[1])
print(f"trial with lr={lr}", flush=True)
with open(os.path.join(os.environ["FLASHML_OUTPUT_DIR"], "metrics.json"), "w") as f:
    json.dump({"loss": round(abs(lr - 0.05), 6), "lr_seen": lr}, f)
"""

# Two trials that each wait for the other to have started: they can only both finish when
# they run at the same time (and exit 3 after a generous wait otherwise).
RENDEZVOUS = """
import os, sys, time
here, other = sys.argv[1], sys.argv[2]
open(os.path.join(sys.argv[3], here), "w").close()
deadline = time.monotonic() + 120
while not os.path.exists(os.path.join(sys.argv[3], other)):
    if time.monotonic() > deadline:
        sys.exit(3)
    time.sleep(0.05)
print(f"{here} met {other}", flush=True)
"""


def _flashruntime(*args: str, cwd: Path, runs_dir: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FLASHML_RUNS_DIR": str(runs_dir)}
    env.pop("CI", None)  # a user's shell: the live run page stays off through --no-watch instead
    return subprocess.run([str(CONSOLE_SCRIPT), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def _run_json(output_line: str) -> dict[str, Any]:
    directory = output_line.removeprefix("output: ").strip()
    return json.loads((Path(directory) / "run.json").read_text())


def _output_dir(stdout: str) -> str:
    return next(line for line in stdout.splitlines() if line.startswith("output: "))


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "hello.py").write_text('print("hello from the script", flush=True)\n')
    (tmp_path / "bad.py").write_text('print("starting", flush=True)\nfrom os import nothere\n')
    (tmp_path / "trial.py").write_text(TRIAL)
    (tmp_path / "meet.py").write_text(RENDEZVOUS)
    return tmp_path


def test_the_scripts_output_streams_to_the_terminal_and_quiet_or_json_keep_it_off_stdout(
        project: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    shown = _flashruntime("submit", f"{PY} hello.py", "--no-watch", cwd=project, runs_dir=runs)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == "hello from the script"
    assert lines[1] == "state: SUCCEEDED"

    quiet = _flashruntime("submit", f"{PY} hello.py", "--no-watch", "--quiet", cwd=project, runs_dir=runs)
    assert quiet.returncode == 0 and "hello from the script" not in quiet.stdout + quiet.stderr

    as_json = _flashruntime("submit", f"{PY} hello.py", "--no-watch", "--json", cwd=project, runs_dir=runs)
    assert json.loads(as_json.stdout)["state"] == "SUCCEEDED"  # stdout: one JSON object, nothing else
    assert "hello from the script" in as_json.stderr


def test_a_failed_run_ends_with_its_failure_summary(project: Path, tmp_path: Path) -> None:
    result = _flashruntime("submit", f"{PY} bad.py", "--no-watch", "--max-restarts", "2", cwd=project,
                           runs_dir=tmp_path / "runs")
    assert result.returncode == 1
    assert "starting" in result.stdout  # the script's own output, before it failed
    summary = result.stderr
    assert "Run FAILED." in summary
    assert "attempt   task-000 (1 of 1), exit 1" in summary
    assert "failure   application_error (ImportError at line start)" in summary
    assert "decision  fail_job — deterministic application error" in summary
    assert "error     ImportError: cannot import name 'nothere' from 'os'" in summary
    assert 'bad.py", line 2, in <module>' in summary  # the traceback's last lines
    assert "/local/task-000/launcher.log" in summary
    assert len(_run_json(_output_dir(result.stdout))["attempts"]) == 1


def test_a_script_that_does_not_exist_is_launched_once_and_says_why(project: Path, tmp_path: Path) -> None:
    result = _flashruntime("submit", f"{PY} nothere.py", "--no-watch", "--max-restarts", "2", cwd=project,
                           runs_dir=tmp_path / "runs")
    assert result.returncode == 1
    run = _run_json(_output_dir(result.stdout))
    assert [a["attempt_id"] for a in run["attempts"]] == ["task-000"]
    assert "failure   application_error (python could not open the script: exit 2)" in result.stderr
    assert "can't open file" in result.stderr


@pytest.mark.parametrize(("mode", "best_lr"), [("min", 0.05), ("max", 0.2)])
def test_a_sweep_ends_with_its_table_best_first(project: Path, tmp_path: Path, mode: str, best_lr: float) -> None:
    result = _flashruntime(
        "submit", f"{PY} trial.py {{lr}}", "--task-params", '[{"lr": 0.01}, {"lr": 0.05}, {"lr": 0.2}]',
        "--metric", "loss", "--mode", mode, "--no-watch", cwd=project, runs_dir=tmp_path / "runs",
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["trial", "lr"])
    rows = lines[header + 1:header + 4]
    assert len(rows) == 3 and lines[header + 4] == "state: SUCCEEDED"
    assert rows[0].startswith("*") and f" {best_lr} " in rows[0]  # the best trial first, marked
    assert all("SUCCEEDED" in row for row in rows)
    assert json.loads(lines[header + 6].removeprefix("best: "))["params"] == {"lr": best_lr}
    # progress: each trial's start, in order of trial number
    assert "flashruntime: trial 1/3 local-000 started (lr=0.01)" in result.stdout
    assert "flashruntime: trial 3/3 local-002 started (lr=0.2)" in result.stdout

    as_json = _flashruntime(
        "submit", f"{PY} trial.py {{lr}}", "--task-params", '[{"lr": 0.01}, {"lr": 0.05}, {"lr": 0.2}]',
        "--metric", "loss", "--mode", mode, "--no-watch", "--json", "--quiet", cwd=project,
        runs_dir=tmp_path / "runs",
    )
    document = json.loads(as_json.stdout)
    assert document["best"]["params"] == {"lr": best_lr}
    assert [row["params"]["lr"] for row in document["table"]][0] == best_lr
    assert len(document["table"]) == 3


def test_parallel_trials_run_at_the_same_time(project: Path, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    result = _flashruntime(
        "submit", f"{PY} meet.py {{me}} {{other}} {marks}",
        "--task-params", '[{"me": "a", "other": "b"}, {"me": "b", "other": "a"}]',
        "--parallel", "2", "--no-watch", cwd=project, runs_dir=tmp_path / "runs",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[local-000] a met b" in result.stdout and "[local-001] b met a" in result.stdout  # trial-id prefixes
    trials = _run_json(_output_dir(result.stdout))["sweep"]["trials"]
    first, second = trials
    assert first["started_at"] < second["finished_at"] and second["started_at"] < first["finished_at"]


def test_a_failed_trial_does_not_stop_the_sweep_unless_fail_fast(project: Path, tmp_path: Path) -> None:
    params = '[{"lr": "oops"}, {"lr": 0.05}, {"lr": 0.2}]'  # the first trial fails: float("oops")
    every = _flashruntime("submit", f"{PY} trial.py {{lr}}", "--task-params", params, "--metric", "loss",
                          "--no-watch", "--quiet", cwd=project, runs_dir=tmp_path / "runs")
    assert every.returncode == 1
    states = {t["trial_id"]: t["state"] for t in _run_json(_output_dir(every.stdout))["sweep"]["trials"]}
    assert states == {"local-000": "FAILED", "local-001": "SUCCEEDED", "local-002": "SUCCEEDED"}
    assert "Run FAILED: 1 of 3 trials failed." in every.stderr
    assert "trial local-000 (lr='oops')" in every.stderr and "ValueError: could not convert" in every.stderr

    fast = _flashruntime("submit", f"{PY} trial.py {{lr}}", "--task-params", params, "--metric", "loss",
                         "--fail-fast", "--no-watch", cwd=project, runs_dir=tmp_path / "runs")
    assert fast.returncode == 1
    run = _run_json(_output_dir(fast.stdout))
    states = {t["trial_id"]: t["state"] for t in run["sweep"]["trials"]}
    assert states == {"local-000": "FAILED", "local-001": "CANCELLED", "local-002": "CANCELLED"}
    assert [a["attempt_id"] for a in run["attempts"]] == ["task-000"]
    assert "stopping the sweep (fail_fast)" in fast.stdout
    assert "flashruntime: [local-000] task-000: application_error" in fast.stdout  # the trial named first


def test_runs_are_kept_in_the_runs_directory_and_listed_from_there(project: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    result = _flashruntime("submit", f"{PY} hello.py", "--no-watch", "--quiet", cwd=project, runs_dir=runs)
    directory = Path(_output_dir(result.stdout).removeprefix("output: "))
    assert directory.parent == runs
    listed = _flashruntime("runs", "--json", cwd=project, runs_dir=runs)
    assert [row["path"] for row in json.loads(listed.stdout)] == [str(directory)]
