"""``flashruntime submit`` and ``flashruntime runs`` as a user types them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests._support import REPO_ROOT

PY = sys.executable


def _cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "flashruntime.cli", *args], capture_output=True, text=True,
                          cwd=cwd or REPO_ROOT, timeout=120, check=False, env={**os.environ, **(env or {})})


def test_submit_success_prints_summary(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "t.py").write_text("import json; json.dump({'acc': 0.9}, open('metrics.json', 'w'))")
    out = tmp_path / "out"
    result = _cli("submit", f"{PY} t.py", "--source", str(src), "--output-dir", str(out), "--no-watch")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["state: SUCCEEDED", "trials: 1", f"output: {out}"]


def test_submit_json_and_failure_exit_code(tmp_path: Path) -> None:
    result = _cli("submit", f"{PY} -c 'raise SystemExit(4)'", "--output-dir", str(tmp_path), "--json", "--no-watch")
    assert result.returncode == 1
    summary = json.loads(result.stdout)
    failure = summary.pop("failure")
    assert summary == {"state": "FAILED", "trials": 0, "best": None, "output_dir": str(tmp_path), "viewer_url": None,
                       "metric": None, "mode": None, "table": []}
    assert failure.startswith("Run FAILED.\n  attempt   task-000 (1 of 1), exit 4\n")
    assert failure in result.stderr  # the summary on stderr too, for whoever reads the terminal


def test_submit_json_with_watch_keeps_stdout_one_json_object(tmp_path: Path) -> None:
    """``--json`` promises one JSON object on stdout; the viewer's line goes to stderr."""
    import os

    env = {**os.environ, "BROWSER": "true"}  # webbrowser.open runs `true <url>`: nothing opens
    result = subprocess.run(
        [PY, "-m", "flashruntime.cli", "submit", f"{PY} -c pass", "--output-dir", str(tmp_path),
         "--json", "--watch"],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=120, check=False, env=env,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["state"] == "SUCCEEDED" and summary["viewer_url"].startswith("http://127.0.0.1:")
    assert f"viewer: {summary['viewer_url']}" in result.stderr


def test_submit_fan_out_with_task_params(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "t.py").write_text("import json, sys; json.dump({'v': float(sys.argv[1])}, open('metrics.json', 'w'))")
    result = _cli("submit", f"{PY} t.py {{v}}", "--source", str(src), "--task-params", '[{"v": 1}, {"v": 2}]',
                  "--output-dir", str(tmp_path / "out"), "--json", "--no-watch")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["trials"] == 2


def test_submit_invalid_task_params_exit_2(tmp_path: Path) -> None:
    for bad in ("{not json", '{"a": 1}', "[1, 2]"):
        result = _cli("submit", "python t.py", "--task-params", bad, "--output-dir", str(tmp_path))
        assert result.returncode == 2 and "invalid --task-params" in result.stderr


def test_submit_launch_error_exit_1(tmp_path: Path) -> None:
    result = _cli("submit", "python t.py", "--source", str(tmp_path / "nope"), "--output-dir", str(tmp_path / "o"))
    assert result.returncode == 1 and "does not exist" in result.stderr
    # the fix is named in this command's terms, not the SDK's Source(path=...)
    missing = str(tmp_path / "nope")
    expected = f"  error     working directory {missing!r} does not exist; point --source at your project directory"
    assert expected in result.stderr
    assert "failure   application_error (the command could not start)" in result.stderr
    assert "Source(" not in result.stderr


def test_submit_placeholder_missing_from_task_params_exits_1_before_launching(tmp_path: Path) -> None:
    """Refused before anything runs; exit 1 as for any launch error (2 is kept for JSON
    that does not parse), with the reason on stderr instead of a FAILED run."""
    result = _cli("submit", "python t.py --c {C}", "--task-params", '[{"D": 1}]', "--output-dir",
                  str(tmp_path / "out"), "--no-watch")
    assert result.returncode == 1, result.stderr
    assert result.stderr == (
        "error: task_params[0] has no key 'C' for the placeholder {C} in argv token '{C}' "
        "(keys: ['D']); add it to every parameter set, or write literal braces as '{{' and '}}'\n"
    )
    assert result.stdout == "" and not (tmp_path / "out").exists()


def _with_stdout_closed(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI writing into a pipe whose reader is already gone (``| head -1`` that has quit)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([PY, "-m", "flashruntime.cli", *args], stdout=write_end, stderr=subprocess.PIPE,
                              text=True, cwd=REPO_ROOT, timeout=120, check=False)
    finally:
        os.close(write_end)


def test_runs_into_a_closed_pipe_exits_1_without_a_traceback(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "run.json").write_text(json.dumps({"contract": "viewer_v1", "state": "SUCCEEDED",
                                                              "started_at": 1000.0, "attempts": []}))
    for output in ((), ("--json",)):
        result = _with_stdout_closed("runs", "--root", str(tmp_path), *output)
        assert (result.returncode, result.stderr) == (1, "")


def test_runs_lists_newest_first_and_marks_unreadable(tmp_path: Path) -> None:
    for name, started in (("old", 1000.0), ("new", 2000.0)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "run.json").write_text(json.dumps({
            "contract": "viewer_v1", "workload": {"command": ["x"], "mode": "local", "source": "."},
            "state": "SUCCEEDED", "started_at": started, "finished_at": started + 12.5, "attempts": [{}, {}],
            "events": [], "trials": [], "max_restarts": 0, "checkpoint_dir": None,
        }))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "run.json").write_text("{truncated")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "run.json").write_text(json.dumps({"contract": "something_else"}))
    (tmp_path / "empty").mkdir()
    result = _cli("runs", "--root", str(tmp_path), "--json")
    assert result.returncode == 0
    rows = json.loads(result.stdout)
    by_name = {Path(r["path"]).name: r for r in rows}
    assert set(by_name) == {"old", "new", "broken"}
    assert by_name["broken"]["state"] == "?"
    ordered = [Path(r["path"]).name for r in rows if r["state"] != "?"]
    assert ordered == ["new", "old"]
    assert by_name["new"] == {"name": "new", "path": str(tmp_path / "new"), "state": "SUCCEEDED", "mode": "local",
                              "attempts": 2, "started": "1970-01-01T00:33:20Z", "duration_s": 12.5, "command": "x"}
    table = _cli("runs", "--root", str(tmp_path)).stdout.splitlines()
    # The root once, above the table; each run by the short name that --show and view take.
    assert table[0].startswith(f"runs under {tmp_path} (`flashruntime runs --show RUN` for one;")
    assert table[1].split() == ["run", "state", "mode", "attempts", "started", "duration", "command"]
    assert sorted(line.split()[0] for line in table[2:]) == ["broken", "new", "old"]


def test_runs_shows_malformed_fields_as_question_marks_and_exits_0(tmp_path: Path) -> None:
    """One hand-edited or foreign-but-labelled run.json must not hide every other run."""
    docs = {
        "workload_str": {"workload": "cmd", "state": "SUCCEEDED", "attempts": []},
        "attempts_int": {"state": "RUNNING", "attempts": 3, "started_at": 1000, "finished_at": 1010},
        "huge_start": {"state": "RUNNING", "started_at": 1e20, "finished_at": 1e20 + 1},
        "state_number": {"state": 7, "started_at": True, "workload": {"mode": ["local"]}},
        "good": {"state": "SUCCEEDED", "workload": {"mode": "local"}, "attempts": [{}], "started_at": 2000.0,
                 "finished_at": 2012.5},
    }
    for name, doc in docs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "run.json").write_text(json.dumps({"contract": "viewer_v1", **doc}))
    result = _cli("runs", "--root", str(tmp_path), "--json")
    assert result.returncode == 0, result.stderr
    by_name = {Path(r.pop("path")).name: r for r in json.loads(result.stdout)}
    for name, row in by_name.items():
        assert row.pop("command") is None  # none of them names its command
        assert row.pop("name") == name
    assert by_name == {
        "workload_str": {"state": "SUCCEEDED", "mode": "?", "attempts": 0, "started": None, "duration_s": None},
        "attempts_int": {"state": "RUNNING", "mode": None, "attempts": "?", "started": "1970-01-01T00:16:40Z",
                         "duration_s": 10},
        "huge_start": {"state": "RUNNING", "mode": None, "attempts": 0, "started": "?", "duration_s": "?"},
        "state_number": {"state": "?", "mode": "?", "attempts": 0, "started": "?", "duration_s": None},
        "good": {"state": "SUCCEEDED", "mode": "local", "attempts": 1, "started": "1970-01-01T00:33:20Z",
                 "duration_s": 12.5},
    }
    table = _cli("runs", "--root", str(tmp_path))
    assert table.returncode == 0 and table.stderr == ""
    rows = {line.split()[0]: line.split()[1:] for line in table.stdout.splitlines()[2:]}
    assert rows["huge_start"] == ["RUNNING", "-", "0", "?", "?", "-"]
    assert rows["attempts_int"] == ["RUNNING", "-", "?", "1970-01-01T00:16:40Z", "10s", "-"]
    assert rows["good"] == ["SUCCEEDED", "local", "1", "1970-01-01T00:33:20Z", "12.5s", "-"]


def test_runs_on_a_missing_root_exit_2(tmp_path: Path) -> None:
    result = _cli("runs", "--root", str(tmp_path / "nope"))
    assert result.returncode == 2 and "is not a directory" in result.stderr
    assert _cli("runs", "--root", str(tmp_path)).stdout.startswith("no runs under")


def test_view_serves_a_finished_run_until_sigterm(tmp_path: Path) -> None:
    import signal
    import urllib.request

    src = tmp_path / "src"
    src.mkdir()
    (src / "t.py").write_text("print('from the run')")
    out = tmp_path / "out"
    assert _cli("submit", f"{PY} t.py", "--source", str(src), "--output-dir", str(out), "--no-watch").returncode == 0
    viewer = subprocess.Popen([PY, "-m", "flashruntime.cli", "view", str(out), "--no-open"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT)
    try:
        line = viewer.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("viewer: http://127.0.0.1:") and line.rstrip().endswith("(Ctrl-C to stop)"), line
        url = line.split()[1]
        with urllib.request.urlopen(f"{url}/api/state", timeout=10) as response:
            state = json.load(response)
        assert state["state"] == "SUCCEEDED" and "from the run" in state["attempts"][0]["log_tail"]
        viewer.send_signal(signal.SIGTERM)
        assert viewer.wait(timeout=30) == 0
    finally:
        if viewer.poll() is None:
            viewer.kill()
            viewer.wait()


def test_view_of_a_directory_without_run_json_exit_2(tmp_path: Path) -> None:
    result = _cli("view", str(tmp_path), "--no-open")
    assert result.returncode == 2
    assert (f"flashruntime view: {tmp_path} is no run directory (it holds no run.json) and no run of that name is "
            "under the runs root; `flashruntime runs` lists the runs") in result.stderr


TRIAL = ("import json, os, sys\n"
         "json.dump({'loss': float(sys.argv[1])}, open(os.path.join(os.environ['FLASHML_OUTPUT_DIR'], 'metrics.json'), 'w'))\n"
         "raise SystemExit(0 if float(sys.argv[1]) < 1 else 3)\n")


def test_runs_show_of_a_sweep_has_its_trials_best_first_and_why_one_failed(tmp_path: Path) -> None:
    src, runs = tmp_path / "src", tmp_path / "runs"
    src.mkdir()
    (src / "trial.py").write_text(TRIAL)
    params = json.dumps([{"lr": 0.5}, {"lr": 0.2}, {"lr": 7}])
    ran = _cli("submit", f"{PY} trial.py {{lr}}", "--source", str(src), "--task-params", params, "--metric", "loss",
               "--no-watch", "--quiet", env={"FLASHML_RUNS_DIR": str(runs)})
    assert ran.returncode == 1, ran.stderr
    (name,) = [path.name for path in runs.iterdir()]
    shown = _cli("runs", "--show", name, env={"FLASHML_RUNS_DIR": str(runs)})
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == f"run       {name} ({runs / name})"
    table = [line.split() for line in lines if line.lstrip("* ").startswith("local-")]
    assert table == [["*", "local-001", "0.2", "SUCCEEDED", "0.2", table[0][5], "1"],
                     ["local-000", "0.5", "SUCCEEDED", "0.5", table[1][4], "1"],
                     ["local-002", "7", "FAILED", "7", table[2][4], "1"]]
    assert "best      local-001 (loss 0.2)" in lines
    assert "Run FAILED: 1 of 3 trials failed." in shown.stdout
    assert "trial local-002 (lr=7)\n  attempt   task-002 (1 of 1), exit 3" in shown.stdout
    assert lines[-1].startswith("goodput   not timed: the run logged no steps")
    as_json = json.loads(_cli("runs", "--show", name, "--json", env={"FLASHML_RUNS_DIR": str(runs)}).stdout)
    assert [trial["trial_id"] for trial in as_json["trials"]] == ["local-001", "local-000", "local-002"]
    assert as_json["failure"].startswith("Run FAILED: 1 of 3 trials failed.")
    # view takes the same name
    viewer = subprocess.Popen([PY, "-m", "flashruntime.cli", "view", name, "--no-open"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT,
                              env={**os.environ, "FLASHML_RUNS_DIR": str(runs)})
    try:
        assert viewer.stdout.readline().startswith("viewer: http://127.0.0.1:")  # type: ignore[union-attr]
    finally:
        viewer.kill()
        viewer.wait()
