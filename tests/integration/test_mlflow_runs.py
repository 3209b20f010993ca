"""Runs in MLflow, read back with MLflow's own client: every trial of a local sweep (to a file
store, a SQLite store and a real ``mlflow server``) and every task of a coordinator job, with
the params, metric history, final figures and files the run recorded, under a parent run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import flashruntime as flash
from flashruntime.errors import ConfigurationError, InvalidSubmission
from flashruntime.workloads.command import CommandWorkload, Source
from tests.service_server import free_port, process_env

mlflow_tracking = pytest.importorskip("mlflow.tracking")

# Ten steps in flashruntime.torch's record format (step, ts, figures, one nested), then metrics.json.
TRIAL = """
import json, os, sys, time
lr = float(sys.argv[1])
out = os.environ["FLASHML_OUTPUT_DIR"]
with open(os.path.join(out, "metrics.jsonl"), "w") as lines:
    for step in range(1, 11):
        lines.write(json.dumps({"step": step, "ts": time.time(), "loss": lr / step, "opt": {"lr": lr}}) + "\\n")
json.dump({"loss": lr / 10, "accuracy": 1 - lr / 10}, open(os.path.join(out, "metrics.json"), "w"))
"""
RATES = [{"lr": 0.5}, {"lr": 0.25}]


@pytest.fixture(autouse=True)
def _no_mlflow_settings_of_the_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_ALLOW_FILE_STORE"):
        monkeypatch.delenv(name, raising=False)


def _source(tmp_path: Path) -> Path:
    source = tmp_path / "src"
    source.mkdir(exist_ok=True)
    (source / "trial.py").write_text(TRIAL)
    return source


def _history(client: Any, run_id: str, key: str) -> list[tuple[int, int, float]]:
    return sorted((m.step, m.timestamp, m.value) for m in client.get_metric_history(run_id, key))


def _recorded(lines: list[dict[str, Any]], key: str, value: Any = None) -> list[tuple[int, int, float]]:
    """What the run wrote, as MLflow keeps it: (step, ts in ms, value)."""
    return sorted((line["step"], round(line["ts"] * 1000), value(line) if value else line[key]) for line in lines)


def _assert_sweep_in_mlflow(client: Any, run_dir: Path, experiment: str) -> None:
    """The run in ``run_dir`` is a parent run with one FINISHED child run per trial, each with
    the trial's params, step history, final figures and output files."""
    document = json.loads((run_dir / "run.json").read_text())
    trials = {trial["trial_id"]: trial for trial in document["sweep"]["trials"]}
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id])
    (parent,) = [run for run in runs if "mlflow.parentRunId" not in run.data.tags]
    children = {run.info.run_name: run for run in runs if run is not parent}
    assert parent.info.run_name == run_dir.name and parent.info.status == "FINISHED"
    assert parent.data.params == {"sweep.metric": "loss", "sweep.mode": "min"}
    assert parent.data.tags["flashruntime.best_trial"] == document["sweep"]["best_trial_id"]
    assert [f.path for f in client.list_artifacts(parent.info.run_id)] == ["run.json"]
    assert sorted(children) == sorted(trials)
    for trial_id, trial in trials.items():
        child = children[trial_id]
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert child.info.status == "FINISHED"
        assert child.data.params == {key: str(value) for key, value in trial["params"].items()}
        (attempt,) = trial["attempt_ids"]
        attempt_dir = run_dir / trial_id / attempt
        lines = [json.loads(line) for line in (attempt_dir / "metrics.jsonl").read_text().splitlines()]
        assert _history(client, child.info.run_id, "loss") == _recorded(lines, "loss")
        assert _history(client, child.info.run_id, "opt/lr") == _recorded(lines, "opt/lr", lambda r: r["opt"]["lr"])
        assert child.data.metrics["final/loss"] == trial["metrics"]["loss"]
        assert child.data.metrics["final/accuracy"] == trial["metrics"]["accuracy"]
        assert child.data.metrics["loss"] == lines[-1]["loss"]  # the latest point is the last step's
        names = {f.path for f in client.list_artifacts(child.info.run_id)}
        assert {"metrics.json", "metrics.jsonl", "launcher.log", "params.json"} <= names, names
        got = Path(client.download_artifacts(child.info.run_id, "metrics.json", str(run_dir.parent / trial_id)))
        assert json.loads(got.read_text()) == json.loads((attempt_dir / "metrics.json").read_text())


@pytest.mark.parametrize("store", ["file", "sqlite"])
def test_every_trial_of_a_sweep_reads_back_from_mlflow_as_the_run_recorded_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: str) -> None:
    monkeypatch.chdir(tmp_path)  # a database store's new experiment keeps its artifacts in ./mlruns
    if store == "file":
        monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow's opt-in to its file store
        uri = (tmp_path / "mlruns").as_uri()
    else:
        uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = flash.submit(CommandWorkload(command=[sys.executable, "trial.py", "{lr}"], source=Source(path=str(_source(
        tmp_path))), task_params=RATES), output_dir=tmp_path / "run", metric="loss", quiet=True, watch=False,
        mlflow_uri=uri, mlflow_experiment="lr-sweep")
    assert run.state.value == "SUCCEEDED"
    (logged,) = [event for event in run.events if event["type"] == "MLFLOW_LOGGED"]
    assert f"logged to MLflow at {uri}, experiment 'lr-sweep': parent run " in logged["message"]
    assert "with 2 trial run(s)" in logged["message"]
    _assert_sweep_in_mlflow(mlflow_tracking.MlflowClient(tracking_uri=uri), run.output_dir, "lr-sweep")


def test_mlflows_own_variables_name_the_store_and_experiment_of_a_plain_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "from-the-environment")
    run = flash.submit(CommandWorkload(command=[sys.executable, "trial.py", "0.5"], source=Source(path=str(_source(
        tmp_path)))), output_dir=tmp_path / "single", quiet=True, watch=False)
    assert run.state.value == "SUCCEEDED"
    client = mlflow_tracking.MlflowClient(tracking_uri=uri)
    (only,) = client.search_runs([client.get_experiment_by_name("from-the-environment").experiment_id])
    assert only.info.run_name == "single" and "mlflow.parentRunId" not in only.data.tags and not only.data.params
    attempt = json.loads((run.output_dir / "run.json").read_text())["attempts"][0]["output_dir"]
    lines = [json.loads(line) for line in (Path(attempt) / "metrics.jsonl").read_text().splitlines()]
    assert _history(client, only.info.run_id, "loss") == _recorded(lines, "loss")
    assert only.data.metrics["final/accuracy"] == 0.95
    assert {"run.json", "metrics.json", "metrics.jsonl"} <= {f.path for f in client.list_artifacts(only.info.run_id)}


def test_a_file_over_the_size_cap_is_left_out_and_said_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flashruntime.trackers.mlflow_runs import log_run

    monkeypatch.chdir(tmp_path)
    run = flash.submit(CommandWorkload(command=[sys.executable, "trial.py", "0.5"], source=Source(path=str(_source(
        tmp_path)))), output_dir=tmp_path / "capped", quiet=True, watch=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    attempt = Path(json.loads((run.output_dir / "run.json").read_text())["attempts"][0]["output_dir"])
    size = (attempt / "metrics.jsonl").stat().st_size
    logged = log_run(run.output_dir, uri, max_artifact_bytes=size - 1)
    assert f"capped: metrics.jsonl: {size} bytes, over {size - 1}" in logged.skipped
    client = mlflow_tracking.MlflowClient(tracking_uri=uri)
    (only,) = client.search_runs([logged.experiment_id])
    assert only.info.run_id == logged.run_ids[0] and logged.experiment == "flashruntime"
    names = {f.path for f in client.list_artifacts(only.info.run_id)}
    assert "metrics.jsonl" not in names and "metrics.json" in names
    assert f"metrics.jsonl: {size} bytes, over {size - 1}" in only.data.tags["flashruntime.skipped"]
    assert len(client.get_metric_history(only.info.run_id, "loss")) == 10  # the history is all there


def test_a_deleted_experiment_is_refused_saying_how_to_restore_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flashruntime.trackers.mlflow_runs import log_run

    monkeypatch.chdir(tmp_path)
    run = flash.submit(CommandWorkload(command=[sys.executable, "trial.py", "0.5"], source=Source(path=str(_source(
        tmp_path)))), output_dir=tmp_path / "once", quiet=True, watch=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow_tracking.MlflowClient(tracking_uri=uri)
    client.delete_experiment(experiment_id := client.create_experiment("gone"))
    with pytest.raises(ConfigurationError, match=rf"^MLflow experiment 'gone' is deleted: restore it \(mlflow "
                                                 rf"experiments restore --experiment-id {experiment_id}\) or choose "
                                                 r"another experiment name$"):
        log_run(run.output_dir, uri, "gone")
    assert client.search_runs([experiment_id], run_view_type=3) == []  # ALL: nothing logged, not even deleted


@pytest.fixture
def mlflow_server(tmp_path: Path) -> Iterator[str]:
    """A real ``mlflow server`` on 127.0.0.1: runs in SQLite, artifacts uploaded to it."""
    import httpx

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
         "--artifacts-destination", str(tmp_path / "server-artifacts")],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120  # a hang guard: it migrates a fresh database first
        while True:
            assert server.poll() is None, server.communicate()[0]
            assert time.monotonic() < deadline, "mlflow server not healthy"
            try:
                if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # its own session: the server and the workers it started
        try:
            server.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.communicate()


def _cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in process_env(**extra).items() if not k.startswith("MLFLOW_")}
    return {**env, **extra}


@pytest.mark.slow
def test_the_cli_logs_a_sweep_to_a_real_mlflow_server(tmp_path: Path, mlflow_server: str) -> None:
    submitted = subprocess.run(
        [sys.executable, "-m", "flashruntime.cli", "submit", f"{sys.executable} trial.py {{lr}}", "--source",
         str(_source(tmp_path)), "--task-params", json.dumps(RATES), "--metric", "loss", "--output-dir",
         str(tmp_path / "run"), "--no-watch", "--quiet", "--mlflow", mlflow_server],
        env=_cli_env(), capture_output=True, text=True, timeout=300, check=False)
    assert submitted.returncode == 0, submitted.stderr
    events = json.loads((tmp_path / "run" / "run.json").read_text())["events"]
    (logged,) = [event for event in events if event["type"] == "MLFLOW_LOGGED"]
    assert f"{mlflow_server}/#/experiments/" in logged["message"]
    _assert_sweep_in_mlflow(mlflow_tracking.MlflowClient(tracking_uri=mlflow_server), tmp_path / "run",
                            "flashruntime")
    assert list((tmp_path / "server-artifacts").rglob("metrics.jsonl"))  # uploaded through the server


def test_the_cli_refuses_a_uri_mlflow_cannot_log_to_before_anything_runs(tmp_path: Path) -> None:
    refused = subprocess.run(
        [sys.executable, "-m", "flashruntime.cli", "submit", "python -c pass", "--output-dir", str(tmp_path / "never"),
         "--no-watch", "--mlflow", "nope://somewhere"],
        env=_cli_env(), capture_output=True, text=True, timeout=120, check=False)
    assert refused.returncode == 1
    assert "error: mlflow_uri 'nope://somewhere' is no tracking URI MLflow can log to: " in refused.stderr
    assert "Supported URI schemes are" in refused.stderr and "(forms: http://host:port" in refused.stderr
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize(("uri", "message"), [
    ("nope://x", r"mlflow_uri 'nope://x' is no tracking URI MLflow can log to: .*unsupported URI 'nope://x'"),
    ("http://", (r"mlflow_uri 'http://' is no tracking URI MLflow can log to: it names no host; give the server's "
                r"address, e.g. http://127.0.0.1:5000")),
    ("  ", (r"mlflow_uri must be an MLflow tracking URI, http://host:port \(a tracking server\), "
           r"sqlite:///path/mlflow.db, or file:///path/mlruns; got '  '")),
])
def test_a_uri_mlflow_cannot_log_to_is_refused_before_anything_runs(tmp_path: Path, uri: str, message: str) -> None:
    with pytest.raises(InvalidSubmission, match=message):
        flash.submit(CommandWorkload(command=[sys.executable, "-c", "pass"]), output_dir=tmp_path / "never",
                     quiet=True, watch=False, mlflow_uri=uri)
    assert not (tmp_path / "never").exists()


def test_mlflows_file_store_without_mlflows_opt_in_is_refused_in_mlflows_words(tmp_path: Path) -> None:
    from mlflow.exceptions import MlflowException

    uri = (tmp_path / "mlruns").as_uri()
    try:
        mlflow_tracking.MlflowClient(tracking_uri=uri)
    except MlflowException as exc:
        refusal = exc.message
    else:
        pytest.skip("this MLflow opens its file store without MLFLOW_ALLOW_FILE_STORE")
    with pytest.raises(InvalidSubmission) as refused:
        flash.submit(CommandWorkload(command=[sys.executable, "-c", "pass"]), output_dir=tmp_path / "never",
                     quiet=True, watch=False, mlflow_uri=uri)
    assert str(refused.value).startswith(f"mlflow_uri {uri!r} is no tracking URI MLflow can log to: {refusal} (forms: ")
    assert not (tmp_path / "never").exists()


def test_without_mlflow_installed_the_run_is_refused_naming_the_extra(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)  # what an interpreter without mlflow finds
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    with pytest.raises(InvalidSubmission, match=r"^MLFLOW_TRACKING_URI needs mlflow: pip install "
                                                r"'flashruntime\[mlflow\]' \(or pip install mlflow\), or unset it$"):
        flash.submit(CommandWorkload(command=[sys.executable, "-c", "pass"]), output_dir=tmp_path / "never",
                     quiet=True, watch=False)
    with pytest.raises(ConfigurationError, match=r"^FLASHML_MLFLOW_URI needs mlflow: pip install "):
        from flashruntime.coordinator.mlflow_tasks import MlflowTasks

        MlflowTasks(f"sqlite:///{tmp_path / 'mlflow.db'}", "flashruntime")
    assert not (tmp_path / "never").exists()


def test_an_experiment_without_a_uri_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidSubmission, match=r"mlflow_experiment='x' names where to log, but there is no "
                                                r"tracking URI: pass mlflow_uri as well \(or set MLFLOW_TRACKING_URI\)"):
        flash.submit(CommandWorkload(command=[sys.executable, "-c", "pass"]), output_dir=tmp_path / "never",
                     quiet=True, watch=False, mlflow_experiment="x")


def test_a_tracking_server_that_is_down_when_the_run_ends_leaves_the_run_succeeded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # MLflow's own retry setting: fail at once
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    run = flash.submit(CommandWorkload(command=[sys.executable, "trial.py", "0.5"], source=Source(path=str(_source(
        tmp_path)))), output_dir=tmp_path / "down", quiet=True, watch=False, mlflow_uri=uri)
    assert run.state.value == "SUCCEEDED"
    (failed,) = [event for event in run.events if event["type"] == "MLFLOW_FAILED"]
    assert failed["message"].startswith(f"not logged to MLflow at {uri}: ")
    assert json.loads((run.output_dir / "run.json").read_text())["state"] == "SUCCEEDED"


# A coordinator task: five steps to metrics.jsonl, then metrics.json, both in the output the worker
# uploads (no braces: the command's placeholders are filled from task_params).
TASK = ("import json, os, sys, time; i = int(sys.argv[1]); out = os.environ['FLASHML_OUTPUT_DIR']\n"
        "with open(os.path.join(out, 'metrics.jsonl'), 'w') as f:\n"
        "    for step in range(1, 6): f.write(json.dumps(dict(step=step, ts=time.time(), loss=1 / (step + i))) + '\\n')\n"
        "json.dump(dict(score=0.5 + i), open(os.path.join(out, 'metrics.json'), 'w'))\n")


@pytest.mark.service
@pytest.mark.slow
def test_a_coordinator_logs_every_task_of_a_job_a_real_worker_ran(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real coordinator with FLASHML_MLFLOW_URI and a real worker: each task of a two-task
    command job is an MLflow run under the job's parent run, with its params, step history and
    final figures as the worker uploaded them; the parent ends with the job."""
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    from tests.service_server import run_worker, serve_in_thread, settings_for

    monkeypatch.chdir(tmp_path)  # a database store's new experiment keeps its artifacts in ./mlruns
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec = {"metadata": {"name": "scores"}, "spec": {
        "workload": {"type": "command", "parameters": {
            "command": [sys.executable, "-c", TASK, "{i}"], "task_params": [{"i": 0}, {"i": 1}]}},
        "isolation": {"tier": "sandboxed", "allowFallback": True}, "placement": {"pool": "team-7"},
        "retryPolicy": {"maxTaskAttempts": 1}}}
    settings = settings_for(tmp_path / "data", mlflow_uri=uri, mlflow_experiment="fleet")
    with serve_in_thread(settings) as url, httpx.Client(base_url=url, timeout=10) as api:
        created = api.post("/v1alpha1/jobs", json=spec)
        assert created.status_code == 201, created.text
        job_id = created.json()["job_id"]
        code, log = run_worker(url, tmp_path / "work", "--node-id", "w1", "--runner", "trusted", "--pools", "team-7",
                               max_tasks=2)
        assert code == 0, log
        deadline = time.monotonic() + 60  # a hang guard
        while (job := api.get(f"/v1alpha1/jobs/{job_id}").json())["state"] in ("PENDING", "RUNNING"):
            assert time.monotonic() < deadline, job
            time.sleep(0.1)
        assert job["state"] == "SUCCEEDED", log
        uploaded = {}
        for task in api.get(f"/v1alpha1/jobs/{job_id}/tasks").json():
            lines = api.get(f"/v1alpha1/artifacts/jobs/{job_id}/{task['task_id']}/metrics.jsonl").text
            uploaded[task["task_id"]] = [json.loads(line) for line in lines.splitlines()]
    # Leaving the block stopped the coordinator, which logs what it queued before it stops.
    client = mlflow_tracking.MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("fleet").experiment_id])
    (parent,) = [run for run in runs if "mlflow.parentRunId" not in run.data.tags]
    assert parent.info.run_name == f"scores-{job_id}" and parent.info.status == "FINISHED"
    children = {run.info.run_name: run for run in runs if run is not parent}
    assert sorted(children) == sorted(uploaded) == ["task-000", "task-001"]
    for index, (task_id, lines) in enumerate(sorted(uploaded.items())):
        child = children[task_id]
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert child.data.tags["flashruntime.node_id"] == "w1" and child.info.status == "FINISHED"
        assert child.data.params == {"i": str(index)}
        assert len(lines) == 5 and _history(client, child.info.run_id, "loss") == _recorded(lines, "loss")
        assert child.data.metrics["final/score"] == 0.5 + index
        assert {"metrics.json", "metrics.jsonl"} <= {f.path for f in client.list_artifacts(child.info.run_id)}


def test_a_coordinator_refuses_a_uri_mlflow_cannot_log_to_before_it_serves(tmp_path: Path) -> None:
    pytest.importorskip("pydantic_settings")
    from flashruntime.coordinator.core import Coordinator
    from tests.service_server import settings_for

    with pytest.raises(ConfigurationError, match=r"^FLASHML_MLFLOW_URI 'nope://x' is no tracking URI MLflow can log "
                                                 r"to: "):
        Coordinator(settings_for(tmp_path / "data", mlflow_uri="nope://x"))
    assert not (tmp_path / "data" / "flashruntime.db").exists()
