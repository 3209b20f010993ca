"""What ``flash.submit`` tells its caller: the live output on a stream, the failure
summary, and sweeps whose trials run side by side and stop together."""

from __future__ import annotations

import io
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from flashruntime.errors import InvalidSubmission, LaunchError
from flashruntime.launchers import LaunchState
from flashruntime.local.submit import submit
from flashruntime.workloads.command import CommandWorkload, OutputSpec, Source
from tests._support import pid_alive

PY = sys.executable
HANG_GUARD_S = 120


def _wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_the_output_reaches_the_stream_in_order_with_the_last_unterminated_line(tmp_path: Path) -> None:
    script = tmp_path / "talk.py"
    script.write_text("import sys\nprint('one', flush=True)\nprint('two', flush=True)\nsys.stdout.write('last')\n")
    stream = io.StringIO()
    run = submit(CommandWorkload(command=[PY, str(script)]), output_dir=tmp_path / "out", wait=False,
                 watch=False, stream=stream)
    assert run.wait(HANG_GUARD_S) is LaunchState.SUCCEEDED
    assert stream.getvalue() == "one\ntwo\nlast\n"  # all of it by the time wait() returns


def test_quiet_writes_nothing_and_the_events_come_after_the_lines_they_follow(tmp_path: Path) -> None:
    script = tmp_path / "boom.py"
    script.write_text("print('about to fail', flush=True)\nraise KeyError('lr')\n")
    quiet = io.StringIO()
    submit(CommandWorkload(command=[PY, str(script)]), output_dir=tmp_path / "a", watch=False, quiet=True,
           stream=quiet)
    assert quiet.getvalue() == ""
    shown = io.StringIO()
    submit(CommandWorkload(command=[PY, str(script)]), output_dir=tmp_path / "b", watch=False, stream=shown)
    lines = shown.getvalue().splitlines()
    assert lines[0] == "about to fail"
    assert lines.index("KeyError: 'lr'") < lines.index(
        "flashruntime: task-000: application_error (exit 1; traceback without ChildFailedError)")


def test_the_summary_of_a_crash_says_the_restarts_are_spent(tmp_path: Path) -> None:
    script = tmp_path / "die.py"
    script.write_text("import os, signal\nprint('dying', flush=True)\nos.kill(os.getpid(), signal.SIGKILL)\n")
    run = submit(CommandWorkload(command=[PY, str(script)]), output_dir=tmp_path / "out", max_restarts=1,
                 watch=False, quiet=True)
    assert run.state is LaunchState.FAILED
    summary = run.failure_summary()
    assert summary is not None
    assert "attempt   task-000-r1 (2 of 2), exit -9" in summary
    assert "failure   worker_crash (killed by SIGKILL)" in summary
    assert "; no restarts left (max_restarts=1)" in summary
    assert "\n  error " not in summary  # no exception line to show: none is made up
    assert "output    dying" in summary  # the log's last lines instead
    assert "hint      a SIGKILL is most often the kernel's out-of-memory killer" in summary
    decisions = [e["message"] for e in run.events if e["type"] == "RECOVERY_ACTION_SELECTED"]
    assert not decisions[0].endswith("no restarts left (max_restarts=1)")
    assert decisions[1].endswith("; no restarts left (max_restarts=1)")  # said as it happens, not only at the end
    assert summary.rstrip().endswith(f"{tmp_path / 'out'}/local/task-000-r1/launcher.log")


def test_a_command_that_cannot_be_started_has_a_summary_too(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match="could not start"):
        submit(CommandWorkload(command=["flashruntime-no-such-command"]), output_dir=tmp_path / "out",
               watch=False, quiet=True)
    import json

    document = json.loads((tmp_path / "out" / "run.json").read_text())
    assert document["state"] == "FAILED" and document["attempts"] == []


def test_a_succeeded_run_has_no_failure_summary(tmp_path: Path) -> None:
    run = submit(CommandWorkload(command=[PY, "-c", "pass"]), output_dir=tmp_path / "out", watch=False, quiet=True)
    assert run.state is LaunchState.SUCCEEDED and run.failure_summary() is None


def test_sweep_arguments_are_checked_before_anything_runs(tmp_path: Path) -> None:
    sweep = CommandWorkload(command=[PY, "-c", "pass", "{x}"], task_params=[{"x": 1}])
    for bad in ({"max_concurrent_trials": 0}, {"max_concurrent_trials": True}, {"mode": "lowest"},
                {"metric": ""}, {"metric": 3}):
        with pytest.raises(InvalidSubmission):
            submit(sweep, output_dir=tmp_path / "never", watch=False, **bad)
    assert not (tmp_path / "never").exists()


def test_cancelling_a_parallel_sweep_stops_every_running_trial(tmp_path: Path) -> None:
    script = tmp_path / "sleep.py"
    script.write_text("import os, sys, time\nopen(sys.argv[1], 'w').write(str(os.getpid()))\ntime.sleep(300)\n")
    pids = [tmp_path / f"pid-{n}" for n in range(3)]
    workload = CommandWorkload(command=[PY, str(script), "{pidfile}"], source=Source(path=str(tmp_path)),
                               task_params=[{"pidfile": str(p)} for p in pids])
    run = submit(workload, output_dir=tmp_path / "out", wait=False, watch=False, quiet=True,
                 max_concurrent_trials=2)
    _wait_for(lambda: pids[0].exists() and pids[1].exists(), "two trials running")
    running = [int(p.read_text()) for p in pids[:2]]
    run.cancel()
    assert run.wait(HANG_GUARD_S) is LaunchState.CANCELLED
    assert not any(pid_alive(pid) for pid in running)
    assert not pids[2].exists()  # the third trial never started
    cancelled = run.events[-1]
    assert cancelled["type"] == "RUN_CANCELLED"
    assert "task-000" in cancelled["message"] and "task-001" in cancelled["message"]
    assert [t["state"] for t in run.sweep["trials"]] == ["CANCELLED", "CANCELLED", "CANCELLED"]


def test_sigterm_to_a_process_driving_a_parallel_sweep_leaves_no_trial_running(tmp_path: Path) -> None:
    script = tmp_path / "sleep.py"
    script.write_text("import os, sys, time\nopen(sys.argv[1], 'w').write(str(os.getpid()))\ntime.sleep(300)\n")
    pids = [tmp_path / f"pid-{n}" for n in range(2)]
    driver = tmp_path / "driver.py"
    driver.write_text(
        "import sys\nfrom flashruntime.local.submit import submit\n"
        "from flashruntime.workloads.command import CommandWorkload\n"
        f"w = CommandWorkload(command=[{PY!r}, {str(script)!r}, '{{pidfile}}'], "
        f"task_params=[{{'pidfile': {str(pids[0])!r}}}, {{'pidfile': {str(pids[1])!r}}}])\n"
        f"submit(w, output_dir={str(tmp_path / 'out')!r}, watch=False, quiet=True, max_concurrent_trials=2)\n"
    )
    import subprocess

    process = subprocess.Popen([PY, str(driver)], cwd=tmp_path)
    try:
        _wait_for(lambda: all(p.exists() and p.read_text() for p in pids), "both trials running")
        running = [int(p.read_text()) for p in pids]
        process.send_signal(signal.SIGTERM)
        assert process.wait(HANG_GUARD_S) == -signal.SIGTERM
    finally:
        if process.poll() is None:
            process.kill()
    assert not any(pid_alive(pid) for pid in running)
    import json

    document = json.loads((tmp_path / "out" / "run.json").read_text())
    assert document["state"] == "CANCELLED"
    # SIGTERM is a preemption notice: each trial's attempt got it and ended PREEMPTED.
    assert {a["state"] for a in document["attempts"]} == {"PREEMPTED"}
    assert [t["state"] for t in document["sweep"]["trials"]] == ["CANCELLED", "CANCELLED"]


def test_the_best_trial_and_the_table_follow_the_metric_and_mode(tmp_path: Path) -> None:
    script = tmp_path / "score.py"
    script.write_text("import json, os, sys\njson.dump({'score': float(sys.argv[1])}, "
                      "open(os.path.join(os.environ['FLASHML_OUTPUT_DIR'], 'metrics.json'), 'w'))\n")
    workload = CommandWorkload(command=[PY, str(script), "{s}"], task_params=[{"s": 2}, {"s": 7}, {"s": 4}],
                               outputs=OutputSpec(primary_metric="score", maximize=False))
    by_default = submit(workload, output_dir=tmp_path / "a", watch=False, quiet=True)
    assert by_default.best_trial()["params"] == {"s": 2}  # OutputSpec: minimise
    highest = submit(workload, output_dir=tmp_path / "b", watch=False, quiet=True, mode="max",
                     max_concurrent_trials=3)
    assert highest.best_trial()["params"] == {"s": 7}
    assert [row["params"]["s"] for row in highest.trial_table()] == [7, 4, 2]
    assert [t["params"]["s"] for t in highest.trials] == [2, 7, 4]  # run.trials: in trial order
    assert highest.sweep["best_trial_id"] == "local-001"
    assert os.path.isdir(tmp_path / "b" / "local-002" / "task-002")
