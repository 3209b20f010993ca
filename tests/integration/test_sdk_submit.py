"""flash.submit through real processes: collection, run.json, recovery decisions,
fan-out sweeps, cancel and launch errors."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import flashruntime as flash
from flashruntime.errors import LaunchError
from flashruntime.launchers import LaunchState
from flashruntime.sdk import Run, submit
from flashruntime.workloads.command import CommandWorkload, OutputSpec, Source
from tests._support import REPO_ROOT, pid_alive

PY = sys.executable

WRITE_METRICS = """
import json, os, sys
value = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
json.dump({"score": value * 2}, open("metrics.json", "w"))
print("wrote", value)
"""

IMPORT_ERROR = "import flashruntime_no_such_module_xyz\n"

# Kills itself with SIGKILL on the first attempt only; writes a metric on the restart.
CRASH_ONCE = """
import json, os, signal
if not os.environ["FLASHML_ATTEMPT_ID"].endswith("-r1"):
    os.kill(os.getpid(), signal.SIGKILL)
json.dump({"ok": 1}, open(os.path.join(os.environ["FLASHML_OUTPUT_DIR"], "metrics.json"), "w"))
"""


def _script(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / "src" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _types(run: Run) -> list[str]:
    return [e["type"] for e in run.events]


def test_success_collects_metrics_and_writes_run_json(tmp_path: Path) -> None:
    script = _script(tmp_path, "train.py", WRITE_METRICS)
    run = submit(CommandWorkload(command=[PY, str(script), "3"], source=Source(path=str(script.parent))),
                 output_dir=tmp_path / "out", watch=False)
    assert run.state is LaunchState.SUCCEEDED and run.finished_at is not None
    assert run.trials == [{"score": 6.0}]
    attempt_dir = tmp_path / "out" / "local" / "task-000"
    assert run.artifacts == [attempt_dir / "metrics.json"]
    doc = json.loads(run.run_json_path.read_text())
    assert doc["contract"] == "viewer_v1" and doc["state"] == "SUCCEEDED" and doc["checkpoint_dir"] is None
    assert doc["workload"] == {"command": [PY, str(script), "3"], "mode": "local", "source": str(script.parent)}
    assert [a["attempt_id"] for a in doc["attempts"]] == ["task-000"]
    assert doc["attempts"][0]["state"] == "SUCCEEDED" and doc["attempts"][0]["exit_code"] == 0
    assert doc["attempts"][0]["job_id"] == "local" and doc["attempts"][0]["output_dir"] == str(attempt_dir)
    assert _types(run) == ["LAUNCH_STARTED", "ATTEMPT_FINISHED"]
    assert run.events[1]["message"] == "task-000 finished SUCCEEDED (exit 0)"
    assert "wrote 3.0" in run.logs()
    assert not list((tmp_path / "out").glob(".run.json.*.tmp"))


def test_stale_outputs_are_never_credited(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    stale = source / "metrics.json"
    stale.write_text(json.dumps({"score": 99}))
    old = time.time() - 3600
    os.utime(stale, (old, old))
    run = submit(CommandWorkload(command=[PY, "-c", "print('no metrics written')"], source=Source(path=str(source))),
                 output_dir=tmp_path / "out", watch=False)
    assert run.state is LaunchState.SUCCEEDED
    assert run.trials == [] and run.artifacts == []


def test_deterministic_failure_is_not_relaunched(tmp_path: Path) -> None:
    script = _script(tmp_path, "bad.py", IMPORT_ERROR)
    run = submit(CommandWorkload(command=[PY, str(script)]), output_dir=tmp_path / "out", max_restarts=2, watch=False)
    assert run.state is LaunchState.FAILED
    assert [a["attempt_id"] for a in run.attempts] == ["task-000"]
    classified = [e for e in run.events if e["type"] == "FAILURE_CLASSIFIED"]
    action = [e for e in run.events if e["type"] == "RECOVERY_ACTION_SELECTED"]
    assert len(classified) == 1 and classified[0]["message"].startswith("task-000: application_error (exit 1; ")
    assert "ModuleNotFoundError" in classified[0]["message"]
    assert len(action) == 1 and action[0]["message"].startswith("task-000: fail_job — ")
    doc = json.loads(run.run_json_path.read_text())
    assert {"FAILURE_CLASSIFIED", "RECOVERY_ACTION_SELECTED"} <= {e["type"] for e in doc["events"]}


def test_killed_worker_is_relaunched_and_succeeds(tmp_path: Path) -> None:
    script = _script(tmp_path, "crash.py", CRASH_ONCE)
    run = submit(CommandWorkload(command=[PY, str(script)]), output_dir=tmp_path / "out", max_restarts=1, watch=False)
    assert run.state is LaunchState.SUCCEEDED
    assert [(a["attempt_id"], a["state"], a["exit_code"]) for a in run.attempts] == [
        ("task-000", "FAILED", -9), ("task-000-r1", "SUCCEEDED", 0)
    ]
    messages = {e["type"]: e["message"] for e in run.events}
    assert messages["FAILURE_CLASSIFIED"].startswith("task-000: worker_crash (exit -9; ")
    assert "killed by SIGKILL" in messages["FAILURE_CLASSIFIED"]
    assert messages["RECOVERY_ACTION_SELECTED"] == ("task-000: restart_group — transient worker crash: relaunch the "
                                                    "command from the last valid checkpoint")  # one process, no group
    assert messages["RESUME_SELECTED"] == "task-000-r1 starts at step 0 (no valid checkpoint)"
    assert run.trials == [{"ok": 1}]


def test_restart_budget_is_respected(tmp_path: Path) -> None:
    run = submit(CommandWorkload(command=[PY, "-c", "import os; os.kill(os.getpid(), 9)"]),
                 output_dir=tmp_path / "out", max_restarts=2, watch=False)
    assert run.state is LaunchState.FAILED
    assert [a["attempt_id"] for a in run.attempts] == ["task-000", "task-000-r1", "task-000-r2"]


def test_fan_out_sweep_collects_one_trial_per_param_set(tmp_path: Path) -> None:
    script = _script(tmp_path, "sweep.py", WRITE_METRICS)
    workload = CommandWorkload(command=[PY, str(script), "{x}"], source=Source(path=str(script.parent)),
                               task_params=[{"x": 1}, {"x": 5}, {"x": 2}],
                               outputs=OutputSpec(primary_metric="score"))
    run = flash.submit(workload, output_dir=tmp_path / "out", watch=False)
    assert run.state is LaunchState.SUCCEEDED
    assert run.trials == [{"score": 2.0, "params": {"x": 1}}, {"score": 10.0, "params": {"x": 5}},
                          {"score": 4.0, "params": {"x": 2}}]
    assert run.best_trial() == {"score": 10.0, "params": {"x": 5}}
    assert run.best_trial(maximize=False) == {"score": 2.0, "params": {"x": 1}}
    assert run.best_trial(metric="missing") is None
    assert [a["job_id"] for a in run.attempts] == ["local-000", "local-001", "local-002"]
    assert (tmp_path / "out" / "local-001" / "task-001" / "metrics.json").exists()


def test_best_trial_needs_a_metric(tmp_path: Path) -> None:
    run = Run(CommandWorkload(command="x"), tmp_path)
    with pytest.raises(ValueError, match="best_trial needs a metric"):
        run.best_trial()


def test_wait_false_and_cancel_leave_nothing_running(tmp_path: Path) -> None:
    code = "import os, time; open(os.path.join(os.environ['FLASHML_OUTPUT_DIR'], 'pid'), 'w').write(str(os.getpid())); time.sleep(120)"
    run = submit(CommandWorkload(command=[PY, "-c", code]), output_dir=tmp_path / "out", wait=False,
                 max_restarts=3, watch=False)
    assert run.state in (LaunchState.PENDING, LaunchState.RUNNING)
    pid_file = tmp_path / "out" / "local" / "task-000" / "pid"
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = int(pid_file.read_text())
    run.cancel()
    assert run.wait(timeout=60) is LaunchState.CANCELLED
    assert [e for e in run.events if e["type"] == "RUN_CANCELLED"][0]["message"] == "run cancelled (task-000 stopped)"
    assert [a["attempt_id"] for a in run.attempts] == ["task-000"]  # no restart after a cancel
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[-1][:3]
    run.cancel()  # idempotent once terminal
    assert run.state is LaunchState.CANCELLED


def test_launch_error_is_recorded_and_reraised(tmp_path: Path) -> None:
    workload = CommandWorkload(command=[PY, "-c", "pass"], source=Source(path=str(tmp_path / "missing")))
    with pytest.raises(LaunchError, match="does not exist"):
        submit(workload, output_dir=tmp_path / "out", watch=False)
    doc = json.loads((tmp_path / "out" / "run.json").read_text())
    assert doc["state"] == "FAILED" and doc["events"][-1]["type"] == "LAUNCH_FAILED"
    background = submit(workload, output_dir=tmp_path / "out2", wait=False, watch=False)
    assert background.wait(timeout=60) is LaunchState.FAILED


def test_argument_errors(tmp_path: Path) -> None:
    fan_out = CommandWorkload(command="python t.py {a}", task_params=[{"a": 1}])
    with pytest.raises(ValueError, match="checkpoint_dir cannot be combined with a fan-out"):
        submit(fan_out, output_dir=tmp_path, checkpoint_dir=tmp_path / "ck", watch=False)
    with pytest.raises(ValueError, match="max_restarts must be an integer >= 0"):
        submit(CommandWorkload(command="x"), output_dir=tmp_path, max_restarts=-1, watch=False)
    with pytest.raises(TypeError, match="takes a CommandWorkload"):
        submit("python t.py", output_dir=tmp_path)  # type: ignore[arg-type]


def test_without_an_output_dir_each_run_gets_a_new_directory_under_the_runs_root(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLASHML_RUNS_DIR", str(tmp_path / "runs"))
    first = submit(CommandWorkload(command=[PY, "-c", "pass"]), watch=False, quiet=True)
    second = submit(CommandWorkload(command=[PY, "-c", "pass"]), watch=False, quiet=True)
    assert first.output_dir.parent == second.output_dir.parent == tmp_path / "runs"
    assert first.output_dir != second.output_dir
    assert first.run_json_path.exists() and second.run_json_path.exists()


def test_a_viewer_that_cannot_start_never_fails_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from flashruntime.viewer.server import RunViewerServer

    def refuse(self: RunViewerServer) -> str:
        raise OSError(98, "Address already in use")

    monkeypatch.setattr(RunViewerServer, "start", refuse)
    run = submit(CommandWorkload(command=[PY, "-c", "pass"]), output_dir=tmp_path, watch=True)
    assert run.state is LaunchState.SUCCEEDED and run.viewer_url is None
    assert "viewer: unavailable (OSError: [Errno 98] Address already in use)" in capsys.readouterr().err


# Run 1 writes metrics.json straight into its attempt dir and a file into the checkpoint dir;
# run 2, into the same output_dir, writes no metrics and reports whether run 1's checkpoint is visible.
RERUN = """
import json, os, sys
out, ckpt = os.environ["FLASHML_OUTPUT_DIR"], os.environ["FLASHML_CKPT_DIR"]
if sys.argv[1] == "first":
    os.makedirs(ckpt, exist_ok=True)
    open(os.path.join(ckpt, "kept.txt"), "w").write("from the first run")
    json.dump({"score": 1}, open(os.path.join(out, "metrics.json"), "w"))
    print("first run", flush=True)
else:
    print("second run sees checkpoint:", os.path.exists(os.path.join(ckpt, "kept.txt")), flush=True)
"""


def test_rerun_into_the_same_output_dir_never_credits_the_earlier_run(tmp_path: Path) -> None:
    script = _script(tmp_path, "rerun.py", RERUN)
    out = tmp_path / "out"
    first = submit(CommandWorkload(command=[PY, str(script), "first"]), output_dir=out, watch=False)
    assert first.state is LaunchState.SUCCEEDED and first.trials == [{"score": 1}]
    second = submit(CommandWorkload(command=[PY, str(script), "second"]), output_dir=out, watch=False)
    assert second.state is LaunchState.SUCCEEDED
    assert second.trials == []  # the earlier run's metrics.json is not this run's trial
    assert "second run sees checkpoint: True" in second.logs()  # resume still finds the job's checkpoints
    assert "first run" not in second.logs()
    attempt_dir = out / "local" / "task-000"
    assert not (attempt_dir / "metrics.json").exists()
    assert "first run" not in (attempt_dir / "launcher.log").read_text()
    # The earlier run's attempt directory was moved aside, whole, and the move is recorded.
    [aside] = [p for p in (out / "local").iterdir() if p.name.startswith("task-000.prev-")]
    assert re.fullmatch(r"task-000\.prev-\d{8}T\d{6}(-\d+)?", aside.name)
    assert json.loads((aside / "metrics.json").read_text()) == {"score": 1}
    assert "first run" in (aside / "launcher.log").read_text()
    launched = [e["message"] for e in second.events if e["type"] == "LAUNCH_STARTED"]
    assert len(launched) == 1 and launched[0].startswith("task-000 launched (pid ")
    assert launched[0].endswith(f"; an earlier run's task-000/ was moved to {aside.name}/")
    assert (out / "local" / "ckpt" / "kept.txt").exists()


def test_a_metrics_json_older_than_the_attempt_is_never_credited(tmp_path: Path) -> None:
    cached = tmp_path / "cache" / "metrics.json"
    cached.parent.mkdir()
    cached.write_text(json.dumps({"score": 99}))
    old = time.time() - 3600
    os.utime(cached, (old, old))
    code = (f"import os, shutil; shutil.copy2({str(cached)!r}, "
            "os.path.join(os.environ['FLASHML_OUTPUT_DIR'], 'metrics.json'))")
    run = submit(CommandWorkload(command=[PY, "-c", code]), output_dir=tmp_path / "out", watch=False)
    assert run.state is LaunchState.SUCCEEDED
    assert (tmp_path / "out" / "local" / "task-000" / "metrics.json").exists()
    assert run.trials == []


# flash.submit(wait=True) in a process of its own, so a real SIGINT (Ctrl-C) reaches it.
INTERRUPTED_DRIVER = """
import sys
sys.path.insert(0, sys.argv[2])
import flashruntime as flash
code = ("import os, time; open(os.path.join(os.environ['FLASHML_OUTPUT_DIR'], 'pid'), 'w')"
        ".write(str(os.getpid())); time.sleep(120)")
try:
    flash.submit(flash.CommandWorkload(command=[sys.executable, "-c", code]), output_dir=sys.argv[1],
                 max_restarts=2, watch=False)
except KeyboardInterrupt:
    print("KeyboardInterrupt reached the caller", flush=True)
    raise SystemExit(130)
print("submit returned", flush=True)
"""


def test_ctrl_c_during_submit_settles_the_attempt_and_propagates(tmp_path: Path) -> None:
    out = tmp_path / "out"
    driver = subprocess.Popen([PY, "-c", INTERRUPTED_DRIVER, str(out), str(REPO_ROOT)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pid_file = out / "local" / "task-000" / "pid"
    child = None
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        child = int(pid_file.read_text())
        driver.send_signal(signal.SIGINT)
        output, _ = driver.communicate(timeout=120)
        assert driver.returncode == 130, output
        assert "KeyboardInterrupt reached the caller" in output
        doc = json.loads((out / "run.json").read_text())
        assert doc["state"] == "CANCELLED" and doc["finished_at"] is not None
        [row] = doc["attempts"]  # no restart after an interrupt
        assert row["attempt_id"] == "task-000" and row["state"] == "CANCELLED"
        assert row["exit_code"] is not None and row["finished_at"] is not None
        events = [(e["type"], e["message"]) for e in doc["events"]]
        assert events[-2:] == [("ATTEMPT_FINISHED", f"task-000 finished CANCELLED (exit {row['exit_code']})"),
                               ("RUN_CANCELLED", "run cancelled (task-000 stopped)")]
        assert not pid_alive(child)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        if child is not None and pid_alive(child):
            os.kill(child, signal.SIGKILL)


def test_a_relative_checkpoint_dir_is_stored_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """run.json is read from other working directories (``flashruntime view``), so the
    checkpoint root it names is the absolute one the launcher used."""
    monkeypatch.chdir(tmp_path)
    script = _script(tmp_path, "ok.py", "print('ok')")
    workload = CommandWorkload(command=[PY, str(script)], source=Source(path=str(script.parent)))
    run = submit(workload, output_dir=tmp_path / "out", checkpoint_dir="relckpt", watch=False)
    assert run.state is LaunchState.SUCCEEDED
    expected = str((tmp_path / "relckpt").resolve())
    assert str(run.checkpoint_dir) == expected
    assert json.loads(run.run_json_path.read_text())["checkpoint_dir"] == expected


def test_a_collect_pattern_reaching_outside_the_source_is_refused_before_launching(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    ran = tmp_path / "ran"
    workload = CommandWorkload(command=[PY, "-c", f"open({str(ran)!r}, 'w').write('x')"],
                               source=Source(path=str(source)), outputs=OutputSpec(collect=["../escape/*.txt"]))
    with pytest.raises(ValueError, match=r"pattern '\.\./escape/\*\.txt' reaches outside the source directory"):
        submit(workload, output_dir=tmp_path / "out", watch=False)
    assert not ran.exists() and not (tmp_path / "out").exists()  # nothing launched, no run recorded


def test_a_placeholder_a_parameter_set_cannot_fill_is_refused_before_launching(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    workload = CommandWorkload(command=[PY, "-c", f"open({str(ran)!r}, 'w').write('x')", "--c {C}"],
                               task_params=[{"C": 1}, {"D": 1}])
    with pytest.raises(ValueError) as refused:
        submit(workload, output_dir=tmp_path / "out", watch=False)
    assert str(refused.value) == (
        "task_params[1] has no key 'C' for the placeholder {C} in argv token '--c {C}' (keys: ['D']); "
        "add it to every parameter set, or write literal braces as '{{' and '}}'"
    )
    assert not ran.exists() and not (tmp_path / "out").exists()  # not even the first trial ran; no run recorded
    background = CommandWorkload(command=[PY, "-c", "pass"], env={"TAG": "{tag}"}, task_params=[{"lr": 1}])
    with pytest.raises(ValueError, match=r"task_params\[0\] has no key 'tag' for the placeholder \{tag\} in env TAG"):
        submit(background, output_dir=tmp_path / "out2", wait=False, watch=False)
    assert not (tmp_path / "out2").exists()


def test_braces_without_task_params_reach_the_command_verbatim(tmp_path: Path) -> None:
    code = "import json, sys; json.dump({'argv': sys.argv[1:]}, open('metrics.json', 'w'))"
    run = submit(CommandWorkload(command=[PY, "-c", code, "{C}", "{"], source=Source(path=str(tmp_path))),
                 output_dir=tmp_path / "out", watch=False)
    assert run.state is LaunchState.SUCCEEDED
    assert run.trials == [{"argv": ["{C}", "{"]}]


def test_collect_never_copies_a_match_that_resolves_outside_the_source(tmp_path: Path) -> None:
    source, outside = tmp_path / "src", tmp_path / "outside"
    source.mkdir()
    outside.mkdir()
    (source / "leak.json").symlink_to(outside / "secret.json")
    code = (f"import json; open({str(outside / 'secret.json')!r}, 'w').write('{{}}'); "
            "json.dump({'score': 1}, open('metrics.json', 'w'))")
    workload = CommandWorkload(command=[PY, "-c", code], source=Source(path=str(source)),
                               outputs=OutputSpec(collect=["*.json"]))
    run = submit(workload, output_dir=tmp_path / "out", watch=False)
    assert run.state is LaunchState.SUCCEEDED
    attempt_dir = tmp_path / "out" / "local" / "task-000"
    assert run.artifacts == [attempt_dir / "metrics.json"]
    assert not (attempt_dir / "leak.json").exists()


def test_a_cancel_after_the_last_attempt_ended_names_no_stopped_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cancel() lands while the drive loop collects the finished attempt's outputs: the
    attempt stopped by itself, so RUN_CANCELLED is the plain "run cancelled"."""
    import threading

    from flashruntime.local import attempts as sdk  # where an attempt's outputs are collected

    collecting, cancelled = threading.Event(), threading.Event()
    collect = sdk._collect_outputs

    def gated(*args: object, **kwargs: object) -> None:
        collecting.set()
        assert cancelled.wait(60), "hang guard"
        collect(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sdk, "_collect_outputs", gated)
    run = submit(CommandWorkload(command=[PY, "-c", "print('done')"]), output_dir=tmp_path / "out", wait=False,
                 watch=False)
    assert collecting.wait(60), "hang guard"
    run.cancel()
    cancelled.set()
    assert run.wait(timeout=60) is LaunchState.CANCELLED
    assert [(a["attempt_id"], a["state"]) for a in run.attempts] == [("task-000", "SUCCEEDED")]
    assert [(e["type"], e["message"]) for e in run.events][-2:] == [
        ("ATTEMPT_FINISHED", "task-000 finished SUCCEEDED (exit 0)"), ("RUN_CANCELLED", "run cancelled")]
