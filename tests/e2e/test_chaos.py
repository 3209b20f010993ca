"""``flashruntime chaos`` through the installed console script, on the CPU DDP example with
real torchrun and gloo: a rank killed after the newest checkpoint was corrupted. The run
must succeed from the checkpoint before the corrupted one, reach the fault-free run's
result, and report figures that ``run.json`` and the metrics confirm."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests._support import REPO_ROOT

pytestmark = [pytest.mark.torch, pytest.mark.slow]
pytest.importorskip("torch")

CONSOLE_SCRIPT = Path(sys.executable).with_name("flashruntime")
EXAMPLE = REPO_ROOT / "examples" / "ddp_train.py"
COMMAND = (f"torchrun --nproc-per-node 2 --nnodes 1 --standalone --local-addr 127.0.0.1 {EXAMPLE} "
           "--steps 50 --checkpoint-every 10 --sleep-per-step 0.05")


def _first_ts(metrics: Path) -> float:
    return json.loads(metrics.read_text().splitlines()[0])["ts"]


def test_a_killed_rank_and_a_corrupted_checkpoint_are_survived_and_reported_truthfully(tmp_path: Path) -> None:
    env = {**os.environ, "FLASHML_RUNS_DIR": str(tmp_path / "runs")}
    done = subprocess.run(
        [str(CONSOLE_SCRIPT), "chaos", COMMAND, "--corrupt-checkpoint", "25", "--kill-rank", "1@25",
         "--output-dir", str(tmp_path / "out"), "--json", "--quiet"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    run = json.loads((tmp_path / "out" / "chaos" / "run.json").read_text())
    reference = json.loads((tmp_path / "out" / "reference" / "run.json").read_text())

    # Both faults fired in the first attempt, the corruption first: step 20 was the newest checkpoint.
    assert [(f["kind"], f["done"]) for f in report["faults"]] == [("corrupt_checkpoint", True), ("kill_rank", True)]
    assert report["faults"][0]["detail"].startswith("step 20, part ")
    assert run["state"] == "SUCCEEDED" and [a["attempt_id"] for a in run["attempts"]] == ["task-000", "task-000-r1"]
    resumed = [e["message"] for e in run["events"] if e["type"] == "RESUME_SELECTED"]
    assert resumed == [resumed[0]] and resumed[0].startswith("task-000-r1 resumes from step 10 ")  # not 20

    # The result is the fault-free run's.
    loss, fault_free = run["trials"][-1]["final_loss"], reference["trials"][-1]["final_loss"]
    assert abs(loss - fault_free) <= 1e-6 and run["trials"][-1]["start_step"] == 10
    assert report["result"]["equal"] is True and report["result"]["values"]["final_loss"]["with_faults"] == loss

    # The report's figures, recomputed here from run.json and the attempts' metrics.
    (recovery,) = report["goodput"]["recoveries"]
    killed = next(f for f in run["chaos"]["injected"] if f["kind"] == "kill_rank")
    first, second = run["attempts"]
    assert recovery["mttd_s"] == pytest.approx(first["finished_at"] - killed["ts"])
    assert recovery["mttr_s"] == pytest.approx(_first_ts(Path(second["output_dir"]) / "metrics.jsonl")
                                               - first["finished_at"])
    assert recovery["resumed_from_step"] == 10
    steps_logged = [json.loads(line)["step"] for line in
                    (Path(first["output_dir"]) / "metrics.jsonl").read_text().splitlines()]
    assert recovery["steps_recomputed"] == sum(1 for step in steps_logged if step > 10) > 0
    goodput = report["goodput"]
    assert goodput["wall_s"] == pytest.approx(run["finished_at"] - run["started_at"])
    assert goodput["goodput"] == pytest.approx(goodput["useful_s"] / goodput["wall_s"])
    assert 0 < goodput["goodput"] < 1 and goodput["steps"] == 50

    shown = subprocess.run([str(CONSOLE_SCRIPT), "runs", "--show", str(tmp_path / "out" / "chaos")], env=env,
                           capture_output=True, text=True, timeout=120, check=False)
    assert shown.returncode == 0 and "MTTD" in shown.stdout and f"{goodput['goodput']:.1%}" in shown.stdout


def test_a_preemption_is_saved_relaunched_without_a_restart_and_ends_at_the_fault_free_result(tmp_path: Path) -> None:
    env = {**os.environ, "FLASHML_RUNS_DIR": str(tmp_path / "runs")}
    done = subprocess.run(
        [str(CONSOLE_SCRIPT), "chaos", COMMAND, "--preempt", "25:120", "--max-restarts", "0",
         "--output-dir", str(tmp_path / "out"), "--json", "--quiet"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    run = json.loads((tmp_path / "out" / "chaos" / "run.json").read_text())
    reference = json.loads((tmp_path / "out" / "reference" / "run.json").read_text())

    (fault,) = report["faults"]
    assert (fault["kind"], fault["done"]) == ("preempt", True) and fault["detail"].startswith("SIGTERM to pid(s) ")
    # No restart was allowed, and none was spent: the preempted attempt was relaunched all the same.
    assert run["state"] == "SUCCEEDED" and [a["state"] for a in run["attempts"]] == ["PREEMPTED", "SUCCEEDED"]
    preempted = run["attempts"][0]["preempted"]
    assert preempted["within_grace"] is True and preempted["ranks_saved"] == [0, 1]
    saved = preempted["saved_step"]
    assert saved in (25, 26)
    (message,) = [e["message"] for e in run["events"] if e["type"] == "ATTEMPT_PREEMPTED"]
    assert f"every rank (2) saved step {saved}" in message and "relaunched to resume from step" in message
    assert not [e for e in run["events"] if e["type"] in ("FAILURE_CLASSIFIED", "RUN_PREEMPTED")]
    resumed = [e["message"] for e in run["events"] if e["type"] == "RESUME_SELECTED"]
    assert resumed[-1].startswith(f"task-000-r1 resumes from step {saved} ")

    first = run["attempts"][0]
    reached = max(json.loads(line)["step"] for line in
                  (Path(first["output_dir"]) / "metrics.jsonl").read_text().splitlines())
    assert reached - saved <= 1  # steps the preemption lost
    loss, fault_free = run["trials"][-1]["final_loss"], reference["trials"][-1]["final_loss"]
    assert abs(loss - fault_free) <= 1e-6 and report["result"]["equal"] is True
    assert report["goodput"]["preempted_s"] == pytest.approx(preempted["ended_in_s"]) and preempted["ended_in_s"] > 0
