"""Code written for the 0.4 line runs unchanged: drivers with their own ``Coordinator`` whose
``get_artifact`` returns parsed JSON, the error phrases alerting rules match, and the module
paths such code imports. Each test drives the real code path."""

from __future__ import annotations

import importlib
import inspect
import json
import math
import random
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from flashml_workloads import kmeans_driver as kd
from flashml_workloads import kmeans_shard as ks
from flashml_workloads.fedavg_driver import resume_state, run_fedavg
from flashml_workloads.fedavg_weights import NonFiniteWeights, apply_delta
from flashruntime import errors
from flashruntime.coordinator.expansion import ExpansionError, expand_tasks
from flashruntime.leases import InMemoryLeaseStore, LeaseManager
from flashruntime.protocol.v1alpha1 import Event, JobSpec, TaskSpec
from flashruntime.recipes import WorkloadRecipe, base, register_recipe
from tests._support import FakeClock
from tests.fedavg_fakes import FakeCoordinator, ParsedJsonCoordinator, Worker, quadratic_worker
from tests.kmeans_reference import lloyd_step

TARGETS = [[1.0, 2.0], [1.5, 1.0], [0.5, 3.0], [1.0, 2.5]]
ZEROS = {"w": {"shape": [2], "data": [0.0, 0.0]}}


def run(coord: Any, **kw: Any) -> dict[str, Any]:
    clock = FakeClock()
    args: dict[str, Any] = {"rounds": 1, "num_shards": 4, "min_participants": 4, "worker_params": {"lr": 0.5},
                            "initial_weights": ZEROS, "poll_seconds": 1.0, "clock": clock, "sleep": clock.sleep}
    args.update(kw)
    return run_fedavg(coord, **args)


class TextCoordinator(FakeCoordinator):
    """``get_artifact`` answers the artifact's text (``str``) rather than bytes."""

    def get_artifact(self, key: str) -> str:  # type: ignore[override]
        return super().get_artifact(key).decode("utf-8")


# --- drivers take a coordinator whose get_artifact returns parsed JSON -----------------------------------------


@pytest.mark.parametrize("coordinator", [ParsedJsonCoordinator, TextCoordinator])
def test_run_fedavg_and_resume_read_parsed_json_through_quorum_and_the_clip_report(coordinator: type) -> None:
    worker = quadratic_worker(TARGETS, scale={1: 1e6})  # shard 1 sends a huge delta: it is clipped
    late = {"shard-003": 99}  # never commits: each round freezes a quorum of 3
    coord = coordinator(worker, commit_after=late)
    out = run(coord, rounds=2, min_participants=3)
    reference = run(FakeCoordinator(worker, commit_after=late), rounds=2, min_participants=3)
    assert out["weights"] == reference["weights"] and out["history"] == reference["history"]
    assert [h["participants"] for h in out["history"]] == [3, 3]
    assert [[c["task_id"] for c in h["clipped"]] for h in out["history"]] == [["shard-001"], ["shard-001"]]
    assert all(c["norm"] > c["cap"] for h in out["history"] for c in h["clipped"])

    next_round, weights, uri = resume_state(coord, out["job_ids"])
    assert (next_round, weights, uri) == (2, out["weights"], "artifact://jobs/000000000002/round-001/weights.json")
    resumed = run(coord, rounds=3, min_participants=3, start_round=next_round, weights_uri=uri,
                  initial_weights=weights, prior_job_ids=out["job_ids"])
    uninterrupted = run(FakeCoordinator(worker, commit_after=late), rounds=3, min_participants=3)
    assert resumed["weights"] == uninterrupted["weights"]
    assert [r for r, _ in resumed["job_ids"]] == [0, 1, 2]


def test_resume_state_refuses_a_parsed_artifact_that_is_neither_object_nor_list() -> None:
    coord = ParsedJsonCoordinator(quadratic_worker(TARGETS))
    coord.store["jobs/j/round-000/weights.json"] = b"7"
    with pytest.raises(TypeError, match=r"get_artifact\('jobs/j/round-000/weights.json'\) returned int"):
        resume_state(coord, [(0, "j")])


class KMeansCoordinator:
    """A user-written coordinator object for the K-means driver: ``get_artifact`` returns parsed
    JSON and there is no ``tasks`` route. A submitted iteration's partials are computed at once
    with ``run_shard`` from the uploaded shard CSVs."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.store: dict[str, bytes] = {}
        self.bodies: list[dict[str, Any]] = []

    def put_bytes(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> dict[str, Any]:
        self.store[key] = data
        return {"uri": f"artifact://{key}", "key": key}

    def submit(self, body: dict[str, Any]) -> dict[str, Any]:
        job_id = f"{len(self.bodies):012x}"
        self.bodies.append(body)
        params = body["spec"]["workload"]["parameters"]
        for i, uri in enumerate(params["shards"]):
            task_id = f"it{params['iteration']:02d}-shard-{i:03d}"
            path = self.scratch / "shard.csv"
            path.write_bytes(self.store[uri.removeprefix("artifact://")])
            metrics = ks.run_shard({"task_id": task_id, "params": {"centroids": params["centroids"]},
                                    "inputs": {"shard": str(path)}})
            self.store[f"jobs/{job_id}/{task_id}/metrics.json"] = json.dumps(metrics).encode()
        return {"job_id": job_id, "state": "RUNNING"}

    def job_state(self, job_id: str) -> str:
        return "SUCCEEDED"

    def get_artifact(self, key: str) -> Any:
        if key not in self.store:
            raise errors.ArtifactNotFound(f"artifact {key!r} not found")
        return json.loads(self.store[key])


def test_run_kmeans_takes_a_coordinator_object_that_returns_parsed_json(tmp_path: Path) -> None:
    rng = random.Random(3)
    rows = [[round(rng.gauss(c, 1.0), 6), round(rng.gauss(-c, 1.0), 6)] for c in (0.0, 5.0, 9.0) for _ in range(20)]
    coord = KMeansCoordinator(tmp_path)
    uris = kd.shard_and_upload(coord, rows, 3, "data/km")
    start = kd.init_centroids(rows, 3, seed=0)
    out = kd.run_kmeans(coord, uris, start, iterations=2)
    assert len(coord.bodies) == 2 and out["job_ids"] == ["000000000000", "000000000001"]
    expected, history = start, []
    for _ in range(2):
        expected, inertia = lloyd_step(rows, expected)
        history.append(inertia)
    assert out["inertia_history"] == pytest.approx(history, rel=1e-12)
    assert all(o == pytest.approx(e, abs=1e-9) for o, e in zip(out["centroids"], expected, strict=True))


def test_the_kmeans_driver_says_what_a_coordinator_object_lacks(tmp_path: Path) -> None:
    args = (["artifact://d/shard-000.csv"], [[0.0]])
    with pytest.raises(TypeError, match=r"run_kmeans: object has no submit, job_state, get_artifact"):
        kd.run_kmeans(object(), *args)
    with pytest.raises(ValueError, match=r"run_kmeans: headers go with a coordinator URL"):
        kd.run_kmeans(KMeansCoordinator(tmp_path), *args, headers={"Authorization": "Bearer t"})
    with pytest.raises(TypeError, match=r"shard_and_upload: object has no put_bytes"):
        kd.shard_and_upload(object(), [[0.0]], 1, "d")


# --- the error phrases of 0.4 -----------------------------------------------------------------------------------


def tampered(samples: dict[int, Any] | None = None, nan_at: dict[int, int] | None = None) -> Worker:
    """``quadratic_worker`` whose chosen shards report other sample counts, or a NaN at a delta index."""
    inner = quadratic_worker(TARGETS)

    def worker(task_id: str, params: dict[str, Any], weights: bytes | None) -> dict[str, bytes]:
        files = inner(task_id, params, weights)
        shard = params["shard"]
        if shard in (samples or {}):
            metrics = json.loads(files["metrics.json"])
            metrics["samples"] = samples[shard]  # type: ignore[index]
            files["metrics.json"] = json.dumps(metrics).encode()
        if shard in (nan_at or {}):
            delta = json.loads(files["delta.json"])
            delta["w"]["data"][nan_at[shard]] = math.nan  # type: ignore[index]
            files["delta.json"] = json.dumps(delta).encode()
        return files

    return worker


@pytest.mark.parametrize(("worker", "phrase"), [
    (tampered(samples={2: 0}), r"contribution 2 has sample count 0, a non-positive sample count"),
    (tampered(samples={1: -3}), r"contribution 1 has sample count -3, a non-positive sample count"),
    (tampered(samples={0: 0, 1: 0, 2: 0, 3: 0}), r"total sample count is 0; .*zero total samples"),
    (tampered(samples={1: 2.5}), r"contribution 1 has sample count 2.5 \(float\), a non-integer sample count"),
    (tampered(samples={3: "12"}), r"contribution 3 has sample count '12' \(str\), a non-integer sample count"),
])
def test_fedavg_sample_count_errors_keep_the_phrases(worker: Worker, phrase: str) -> None:
    with pytest.raises(ValueError, match=phrase):
        run(ParsedJsonCoordinator(worker))


def test_a_non_finite_contribution_names_the_contribution_and_the_parameter_index() -> None:
    with pytest.raises(NonFiniteWeights, match=r"contribution 2: 'w' index 1 is not finite: it holds a non-finite "
                                               r"value nan .*non-finite values cannot be averaged"):
        run(ParsedJsonCoordinator(tampered(nan_at={2: 1})))


def test_apply_delta_names_the_parameter_index() -> None:
    with pytest.raises(NonFiniteWeights, match=r"^apply_delta: delta: 'w' index 1 is not finite"):
        apply_delta(ZEROS, {"w": {"shape": [2], "data": [0.0, math.inf]}})
    with pytest.raises(NonFiniteWeights, match=r"^apply_delta result: 'w' index 0 is not finite"):
        apply_delta({"w": {"shape": [1], "data": [1e308]}}, {"w": {"shape": [1], "data": [1e308]}})


def test_min_participants_above_the_shard_count_exceeds_num_shards() -> None:
    coord = ParsedJsonCoordinator(quadratic_worker(TARGETS))
    with pytest.raises(ValueError, match=r"min_participants=5, num_shards=4; min_participants exceeds num_shards"):
        run(coord, min_participants=5)
    assert coord.bodies == []


def test_a_commit_after_another_lease_won_is_rejected_as_late_duplicate() -> None:
    events: list[Event] = []
    manager = LeaseManager(InMemoryLeaseStore(), on_event=events.append)
    t0 = datetime(2030, 1, 1, tzinfo=timezone.utc)
    manager.add_task(TaskSpec(task_id="task-000", job_id="job-a", commit_key="job-a/task-000", lease_seconds=10),
                     now=t0)
    slow = manager.claim("slow-node", now=t0)
    fast = manager.claim("fast-node", now=t0 + timedelta(seconds=11))  # the slow lease expired first
    assert slow is not None and fast is not None
    assert manager.complete(fast.lease_id, "ab" * 32, now=t0 + timedelta(seconds=12)) is True
    assert manager.complete(slow.lease_id, "cd" * 32, now=t0 + timedelta(seconds=13)) is False
    rejected = [event for event in events if event.type == "TASK_COMMIT_REJECTED"]
    assert [event.message for event in rejected] == [(
        f"commit of task task-000 from lease {slow.lease_id} rejected as a late/duplicate commit: the task was "
        f"already committed by lease {fast.lease_id}"
    )]


def _job(kind: str, parameters: dict[str, Any]) -> JobSpec:
    return JobSpec.model_validate({"metadata": {"name": "compat"}, "spec": {
        "execution": {"backend": "leases"}, "image": {"repository": "local/tier1", "tag": "dev"},
        "isolation": {"tier": "sandboxed"}, "workload": {"type": kind, "parameters": parameters}}})


def test_duplicate_task_ids_collide(monkeypatch: pytest.MonkeyPatch) -> None:
    class Twice(WorkloadRecipe):
        kind = "twice"
        task_module = "flashml_workloads.kmeans_shard"

        def expand(self, job_id: str, spec: JobSpec) -> list[TaskSpec]:
            return [TaskSpec(task_id="t", job_id=job_id, commit_key=f"jobs/{job_id}/t/metrics.json")] * 2

        def validate_output(self, metrics: Any) -> None:
            return None

    monkeypatch.setattr(base, "_RECIPES", dict(base._RECIPES))
    register_recipe(Twice())
    with pytest.raises(ExpansionError, match=r"duplicate task ids \('t'\) .*a repeated id collides with another "
                                             r"task's jobs/<job>/<task>/ directory"):
        expand_tasks("j-1", _job("twice", {}))


def test_an_input_referenced_but_not_declared_is_not_declared_in_inputs() -> None:
    with pytest.raises(ExpansionError, match=r"unpack_inputs names \['data'\], which are not declared in 'inputs'"):
        expand_tasks("j-1", _job("command", {"command": ["run"], "unpack_inputs": ["data"]}))


# --- module paths of 0.4 ----------------------------------------------------------------------------------------


def test_service_dashboard_is_the_coordinator_dashboard() -> None:
    from flashruntime.coordinator.dashboard import DASHBOARD_HTML
    from flashruntime.service.dashboard import DASHBOARD_HTML as compat

    assert compat is DASHBOARD_HTML


def test_sharded_kmeans_of_0_4_imports_without_ray_and_names_the_extra_when_used(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sharded_kmeans = importlib.import_module("flashml_workloads.sharded_kmeans")
    assert {"init_centroids", "reduce_partials", "run_kmeans", "shard_rows"} <= set(sharded_kmeans.__all__)
    monkeypatch.setitem(sys.modules, "ray", None)  # as without the ray extra: ``import ray`` fails
    with pytest.raises(ImportError) as caught:
        sharded_kmeans.shard_rows([[0.0, 1.0], [1.0, 0.0]], 2)
    assert isinstance(caught.value, errors.ModuleUnavailable) and caught.value.name == "ray"
    assert "pip install 'flashruntime[ray]'" in str(caught.value)


def test_the_profiling_module_of_0_4_keeps_its_names() -> None:
    profiling = importlib.import_module("flashruntime.profiling")
    for name in ("Profiler", "ProfileResult", "ProfileCache", "ProfileError"):
        assert hasattr(profiling, name), name
    assert profiling.ProfileError is errors.ProfileError
    assert profiling.ProfileResult(step_time_s=1.0, measured_steps=1).basis == "profiled"
    assert list(inspect.signature(profiling.Profiler.profile).parameters) == [
        "self", "request", "plan", "budget_seconds"]
    assert inspect.signature(profiling.Profiler.profile).parameters["budget_seconds"].default == 300.0
