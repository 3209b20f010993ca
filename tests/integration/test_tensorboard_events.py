"""A run's metrics in TensorBoard, read back with TensorBoard's own event reader: every
trial's step curves, final figures and parameters as the run recorded them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import flashruntime as flash
from flashruntime.errors import InvalidSubmission
from flashruntime.workloads.command import CommandWorkload, Source

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

# Ten steps through flashruntime.torch's record format (step, ts and figures), then metrics.json.
TRIAL = """
import json, os, sys, time
lr = float(sys.argv[1])
out = os.environ["FLASHML_OUTPUT_DIR"]
with open(os.path.join(out, "metrics.jsonl"), "w") as lines:
    for step in range(1, 11):
        lines.write(json.dumps({"step": step, "ts": time.time(), "loss": lr / step, "opt": {"lr": lr}}) + "\\n")
json.dump({"loss": lr / 10, "accuracy": 1 - lr / 10}, open(os.path.join(out, "metrics.json"), "w"))
"""


def _read(directory: Path) -> event_accumulator.EventAccumulator:
    reader = event_accumulator.EventAccumulator(str(directory))
    reader.Reload()
    return reader


def test_every_trial_of_a_sweep_reads_back_from_tensorboard_as_the_run_recorded_it(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "trial.py").write_text(TRIAL)
    logdir = tmp_path / "tb"
    run = flash.submit(CommandWorkload(command=[sys.executable, "trial.py", "{lr}"], source=Source(path=str(source)),
                                       task_params=[{"lr": 0.5}, {"lr": 0.25}]),
                       output_dir=tmp_path / "run", metric="loss", quiet=True, watch=False, tensorboard_dir=logdir)
    assert run.state.value == "SUCCEEDED"
    recorded = {trial["trial_id"]: trial for trial in json.loads((run.output_dir / "run.json").read_text())["sweep"]
                ["trials"]}
    assert sorted(path.name for path in (logdir / "run").iterdir()) == sorted(recorded)
    for trial_id, trial in recorded.items():
        reader = _read(logdir / "run" / trial_id)
        assert set(reader.Tags()["scalars"]) == {"loss", "opt/lr", "final/loss", "final/accuracy"}
        lines = [json.loads(line) for attempt in trial["attempt_ids"]
                 for line in (run.output_dir / trial_id / attempt / "metrics.jsonl").read_text().splitlines()]
        curve = reader.Scalars("loss")  # stored as float32: equal to its precision
        assert [e.step for e in curve] == [line["step"] for line in lines]
        assert [e.value for e in curve] == pytest.approx([line["loss"] for line in lines], rel=1e-6)
        assert [e.wall_time for e in curve] == pytest.approx([line["ts"] for line in lines])
        assert [e.value for e in reader.Scalars("final/accuracy")] == pytest.approx([trial["metrics"]["accuracy"]], rel=1e-6)
        (params,) = reader.Tensors("params")
        assert json.loads(params.tensor_proto.string_val[0]) == trial["params"]
    assert any(event["type"] == "TENSORBOARD_WRITTEN" and f"tensorboard --logdir {logdir}" in event["message"]
               for event in run.events)


def test_the_environment_names_the_directory_and_a_second_write_replaces_the_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flashruntime.trackers.tensorboard_events import write_run_events

    source = tmp_path / "src"
    source.mkdir()
    (source / "trial.py").write_text(TRIAL)
    monkeypatch.setenv("FLASHML_TENSORBOARD_DIR", str(tmp_path / "tb"))
    run = flash.submit(CommandWorkload(command=[sys.executable, "trial.py", "0.5"], source=Source(path=str(source))),
                       output_dir=tmp_path / "single", quiet=True, watch=False)
    assert run.state.value == "SUCCEEDED"
    (written,) = write_run_events(run.output_dir, tmp_path / "tb")  # again: the same directory, one file
    assert written == tmp_path / "tb" / "single"
    assert len(list(written.glob("events.out.tfevents.*"))) == 1
    assert [e.step for e in _read(written).Scalars("loss")] == list(range(1, 11))


def test_a_tensorboard_dir_that_cannot_be_made_is_refused_before_anything_runs(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(InvalidSubmission, match="tensorboard_dir .* cannot be created"):
        flash.submit(CommandWorkload(command=[sys.executable, "-c", "pass"]), output_dir=tmp_path / "never",
                     quiet=True, watch=False, tensorboard_dir=blocker / "tb")
    assert not (tmp_path / "never").exists()


def test_a_coordinator_writes_every_committed_task_as_its_worker_uploaded_it(tmp_path: Path) -> None:
    """A real coordinator with FLASHML_TENSORBOARD_DIR: two tasks committed over HTTP, each with
    the metrics.jsonl and metrics.json a worker uploads; TensorBoard's reader finds every step."""
    import hashlib

    httpx = pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    from tests.integration.test_service_app import job_spec, registration
    from tests.service_server import serve_in_thread, settings_for

    logdir = tmp_path / "tb"
    with serve_in_thread(settings_for(tmp_path / "data", tensorboard_dir=str(logdir))) as url, \
            httpx.Client(base_url=url, timeout=10) as api:
        job_id = api.post("/v1alpha1/jobs", json=job_spec(trials=2)).json()["job_id"]
        api.post("/v1alpha1/nodes/register", json=registration())
        uploaded = {}
        for index in range(2):
            lease = api.post("/v1alpha1/leases/claim", json={"node_id": "node-a"}).json()
            prefix = lease["payload"]["output_prefix"]
            steps = [{"step": step, "ts": 1000.0 + step, "loss": 1.0 / (step + index)} for step in (1, 2, 3)]
            lines = "".join(json.dumps(record) + "\n" for record in steps).encode()
            final = json.dumps({"score": 0.5 + index}).encode()
            assert api.put(f"/v1alpha1/artifacts/{prefix}metrics.jsonl", content=lines).status_code == 200
            assert api.put(f"/v1alpha1/artifacts/{prefix}metrics.json", content=final).status_code == 200
            done = api.post(f"/v1alpha1/attempts/{lease['lease_id']}/complete",
                            json={"output_sha256": hashlib.sha256(final).hexdigest()})
            assert done.json() == {"accepted": True}
            uploaded[lease["task_id"]] = (steps, 0.5 + index, lease["payload"]["params"])
    assert sorted(path.name for path in (logdir / f"sweep-{job_id}").iterdir()) == sorted(uploaded)
    for task_id, (steps, score, params) in uploaded.items():
        reader = _read(logdir / f"sweep-{job_id}" / task_id)
        assert [(e.step, e.wall_time, e.value) for e in reader.Scalars("loss")] == [
            (r["step"], r["ts"], pytest.approx(r["loss"])) for r in steps]
        assert [e.value for e in reader.Scalars("final/score")] == [pytest.approx(score)]
        (text,) = reader.Tensors("params")
        assert json.loads(text.tensor_proto.string_val[0]) == params
