"""fedavg_driver against the in-process FakeCoordinator, with a fake clock."""

from __future__ import annotations

import json
import math
import urllib.error

import pytest

from flashml_workloads import fedavg_driver as fd
from flashml_workloads.fedavg_driver import (
    DEFAULT_IMAGE,
    ArtifactNotFound,
    CoordinatorUnavailable,
    QuorumNotMet,
    _round_body,
    resume_state,
    run_fedavg,
)
from flashml_workloads.fedavg_weights import NonFiniteWeights, decode
from flashruntime import errors
from tests._support import FakeClock
from tests.fedavg_fakes import FakeCoordinator, FakeCoordinatorWithoutTasks, quadratic_worker

TARGETS = [[1.0, 2.0], [1.5, 1.0], [0.5, 3.0], [1.0, 2.5]]
ZEROS = {"w": {"shape": [2], "data": [0.0, 0.0]}}


def run(coord, clock=None, **kw):
    clock = clock or FakeClock()
    args = dict(rounds=1, num_shards=4, min_participants=4, worker_params={"lr": 0.5}, initial_weights=ZEROS,
                poll_seconds=1.0, clock=clock, sleep=clock.sleep)
    args.update(kw)
    return run_fedavg(coord, **args)


def test_public_names():
    assert fd.__all__ == ["ArtifactNotFound", "BuildRound", "Coordinator", "CoordinatorUnavailable", "DEFAULT_IMAGE",
                          "HttpCoordinator", "QuorumNotMet", "RoundPlan", "RoundResult", "resume_state", "run_fedavg"]
    assert DEFAULT_IMAGE == "local/tier1:dev"
    assert fd.QuorumNotMet is errors.QuorumNotMet and issubclass(QuorumNotMet, RuntimeError)
    assert fd.CoordinatorUnavailable is errors.CoordinatorUnavailable
    assert fd.ArtifactNotFound is errors.ArtifactNotFound and issubclass(ArtifactNotFound, LookupError)


# --- round body -------------------------------------------------------------------------------------------------


def test_round_body_matches_the_spec_example():
    body = _round_body(3, 4, {"lr": 0.1}, "artifact://jobs/ab12/round-002/weights.json", 120.0, "local/tier1:dev",
                       "standard", False, pool="team-7")
    assert body == json.loads("""
    {"apiVersion": "flashml.dev/v1alpha1", "kind": "Job", "metadata": {"name": "fedavg-r003"}, "spec": {
      "execution": {"backend": "leases"}, "image": {"repository": "local/tier1", "tag": "dev"},
      "isolation": {"tier": "standard", "allowFallback": false}, "placement": {"pool": "team-7"},
      "workload": {"type": "federated_averaging", "parameters": {"lr": 0.1, "round": 3, "num_shards": 4,
        "lease_seconds": 120.0, "weights": "artifact://jobs/ab12/round-002/weights.json"}}}}""")
    assert list(body["spec"]) == ["execution", "image", "isolation", "placement", "workload"]


def test_pool_none_and_any_leave_placement_absent_byte_identically():
    args = (0, 2, {"lr": 0.1}, None, 60.0, "reg.example:5000/img:v1", "sandboxed", True)
    plain = json.dumps(_round_body(*args))
    assert json.dumps(_round_body(*args, pool=None)) == plain
    assert json.dumps(_round_body(*args, pool="any")) == plain
    assert "placement" not in plain and "weights" not in plain
    assert _round_body(*args)["spec"]["image"] == {"repository": "reg.example:5000/img", "tag": "v1"}


@pytest.mark.parametrize("image", ["local/tier1", "local/tier1:", ":dev", ""])
def test_image_needs_a_pinned_tag(image):
    with pytest.raises(ValueError, match="image must be 'repository:tag' with a pinned tag"):
        _round_body(0, 1, {}, None, 60.0, image, "standard", False)


def test_worker_params_are_copied_not_mutated():
    params = {"lr": 0.1}
    _round_body(0, 1, params, "artifact://x", 60.0, DEFAULT_IMAGE, "standard", False)
    assert params == {"lr": 0.1}


# --- validation -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kw", "match"), [
    ({"min_participants": 0}, "1 <= min_participants <= num_shards"),
    ({"min_participants": 5}, "1 <= min_participants <= num_shards"),
    ({"poll_attempts": 0}, "poll_attempts must be an int >= 1"),
])
def test_validation(kw, match):
    coord = FakeCoordinator(quadratic_worker(TARGETS))
    with pytest.raises(ValueError, match=match):
        run(coord, **kw)
    assert coord.bodies == []


# --- rounds -----------------------------------------------------------------------------------------------------


def test_rounds_chain_weights_uris_and_record_history():
    coord = FakeCoordinator(quadratic_worker(TARGETS))
    seen = []
    out = run(coord, rounds=3, on_round=seen.append, prior_job_ids=[(7, "old")], pool="team-7")
    assert [h["round"] for h in out["history"]] == [0, 1, 2] and seen == out["history"]
    assert out["job_ids"] == [(7, "old"), (0, "000000000001"), (1, "000000000002"), (2, "000000000003")]
    params = [b["spec"]["workload"]["parameters"] for b in coord.bodies]
    assert "weights" not in params[0]
    assert params[1]["weights"] == "artifact://jobs/000000000001/round-000/weights.json"
    assert params[2]["weights"] == "artifact://jobs/000000000002/round-001/weights.json"
    assert all(b["spec"]["placement"] == {"pool": "team-7"} for b in coord.bodies)
    published = json.loads(coord.store["jobs/000000000003/round-002/weights.json"])
    assert published == out["weights"]
    h0 = out["history"][0]
    assert h0["participants"] == 4 and h0["clipped"] == [] and h0["job_id"] == "000000000001"
    # sample-weighted loss: shard i trains on 10 + i samples
    losses = [sum(t * t for t in target) for target in TARGETS]
    assert h0["mean_loss"] == pytest.approx(sum((10 + i) * l for i, l in enumerate(losses)) / 46)


@pytest.mark.parametrize("pool", [None, "any"])
def test_every_round_body_leaves_placement_absent_without_a_team_pool(pool):
    coord = FakeCoordinator(quadratic_worker(TARGETS))
    run(coord, rounds=2, pool=pool)
    assert len(coord.bodies) == 2 and all("placement" not in b["spec"] for b in coord.bodies)


def test_quorum_freezes_the_committed_set_and_downloads_nothing_before():
    coord = FakeCoordinator(quadratic_worker(TARGETS), commit_after={"shard-000": 2, "shard-002": 99})
    clock = FakeClock()
    out = run(coord, clock=clock, min_participants=3)
    assert out["history"][0]["participants"] == 3
    polls_before_quorum = coord.calls.index("get_artifact")
    assert coord.calls[:polls_before_quorum].count("artifacts") == 3
    downloaded = [c for c in coord.calls if c == "get_artifact"]
    assert len(downloaded) == 6  # metrics + delta of the 3 frozen tasks, never shard-002
    assert clock.sleeps == [1.0, 1.0]


def test_tasks_not_completed_do_not_count_even_with_files():
    coord = FakeCoordinator(quadratic_worker(TARGETS), not_completed=frozenset({"shard-001"}))
    with pytest.raises(QuorumNotMet, match=r"round 0 .* timed out after 5.0 s with 3 of 4"):
        run(coord, round_timeout_s=5.0)
    coord = FakeCoordinatorWithoutTasks(quadratic_worker(TARGETS))
    assert run(coord)["history"][0]["participants"] == 4


def test_failed_or_cancelled_job_below_quorum_raises():
    for state in ("FAILED", "CANCELLED"):
        coord = FakeCoordinator(quadratic_worker(TARGETS), commit_after={"shard-003": 5}, job_state=state)
        with pytest.raises(QuorumNotMet, match=rf"round 0 \(job 000000000001\) is {state} with 3 of 4"):
            run(coord)
    # a failed job that still reached quorum is reduced
    coord = FakeCoordinator(quadratic_worker(TARGETS), commit_after={"shard-003": 5}, job_state="FAILED")
    assert run(coord, min_participants=3)["history"][0]["participants"] == 3


def test_timeout_sleeps_min_of_poll_and_remaining():
    coord = FakeCoordinator(quadratic_worker(TARGETS), commit_after={"shard-003": 99})
    clock = FakeClock()
    with pytest.raises(QuorumNotMet, match="timed out after 2.5 s with 3 of 4"):
        run(coord, clock=clock, round_timeout_s=2.5)
    assert clock.sleeps == [1.0, 1.0, 0.5]


def test_transient_errors_are_retried_with_capped_exponential_backoff():
    coord = FakeCoordinator(quadratic_worker(TARGETS))
    coord.raise_next["artifacts"] = [ConnectionError("reset"), urllib.error.URLError("refused"),
                                     urllib.error.HTTPError("u", 503, "unavailable", None, None)]
    clock = FakeClock()
    out = run(coord, clock=clock, poll_backoff_s=2.0, round_timeout_s=600.0)
    assert out["history"][0]["participants"] == 4
    assert clock.sleeps == [2.0, 4.0, 5.0]  # doubling, capped at 5 s


def test_retries_exhausted_raise_coordinator_unavailable():
    coord = FakeCoordinator(quadratic_worker(TARGETS))
    coord.raise_next["job_state"] = [ConnectionError("down")] * 3
    clock = FakeClock()
    with pytest.raises(CoordinatorUnavailable, match=r"job_state\(000000000001\) failed 3 time\(s\).*down"):
        run(coord, clock=clock, poll_attempts=3, poll_backoff_s=0.5)
    assert clock.sleeps == [0.5, 1.0]


def test_backoff_is_capped_at_the_deadline():
    coord = FakeCoordinator(quadratic_worker(TARGETS))
    coord.raise_next["artifacts"] = [ConnectionError("x")] * 2
    clock = FakeClock()
    run(coord, clock=clock, poll_backoff_s=4.0, round_timeout_s=5.0)
    assert clock.sleeps == [4.0, 1.0]


def test_client_errors_are_not_retried():
    coord = FakeCoordinator(quadratic_worker(TARGETS))
    coord.raise_next["artifacts"] = [urllib.error.HTTPError("u", 404, "gone", None, None)]
    clock = FakeClock()
    with pytest.raises(urllib.error.HTTPError):
        run(coord, clock=clock)
    assert clock.sleeps == []


def test_submit_is_not_retried():
    coord = FakeCoordinator(quadratic_worker(TARGETS))
    coord.raise_next["submit"] = [ConnectionError("refused")]
    with pytest.raises(CoordinatorUnavailable, match="submitting round 0 failed: refused; nothing was retried"):
        run(coord)
    assert coord.calls == ["submit"]


def _with_metrics(coord: FakeCoordinator, task: str, **changes) -> FakeCoordinator:
    inner = coord.worker

    def worker(task_id, params, weights):
        files = inner(task_id, params, weights)
        if task_id == task:
            metrics = json.loads(files["metrics.json"])
            metrics.update(changes)
            files["metrics.json"] = json.dumps(metrics).encode()
            if isinstance(changes.get("delta_file"), str):
                files[changes["delta_file"]] = files["delta.json"]
        return files

    coord.worker = worker
    return coord


@pytest.mark.parametrize("bad", ["../delta.json", "a/b.json", ".delta", "", "delta json", 5, "delta.json\n"])
def test_delta_file_must_stay_inside_the_task_prefix(bad):
    coord = _with_metrics(FakeCoordinator(quadratic_worker(TARGETS)), "shard-001", delta_file=bad)
    with pytest.raises(ValueError, match=r"task shard-001: delta_file .* must be a plain file name"):
        run(coord)


def test_custom_delta_file_and_default():
    coord = _with_metrics(FakeCoordinator(quadratic_worker(TARGETS)), "shard-001", delta_file="d-1.json")
    reference = run(FakeCoordinator(quadratic_worker(TARGETS)))
    assert run(coord)["weights"] == reference["weights"]
    coord = FakeCoordinator(quadratic_worker(TARGETS))
    coord = _with_metrics(coord, "shard-002")
    inner = coord.worker
    coord.worker = lambda t, p, w: {k: (v if k != "metrics.json" else json.dumps(
        {x: y for x, y in json.loads(v).items() if x != "delta_file"}).encode()) for k, v in inner(t, p, w).items()}
    assert run(coord)["weights"] == reference["weights"]


def test_bad_contribution_is_attributed_to_its_task():
    coord = _with_metrics(FakeCoordinator(quadratic_worker(TARGETS)), "shard-002", samples=0)
    with pytest.raises(ValueError, match="contribution 2 has sample count 0") as info:
        run(coord)
    assert "shard-000, shard-001, shard-002, shard-003" in "".join(getattr(info.value, "__notes__", []))
    coord = _with_metrics(FakeCoordinator(quadratic_worker(TARGETS)), "shard-002", loss=math.nan)
    with pytest.raises(ValueError, match="task shard-002: metrics.json loss must be a finite number"):
        run(coord)


def test_clipped_events_name_task_ids():
    coord = FakeCoordinator(quadratic_worker(TARGETS, scale={2: 1e6}))
    out = run(coord)
    (event,) = out["history"][0]["clipped"]
    assert event["task_id"] == "shard-002" and set(event) == {"task_id", "norm", "cap", "scale"}
    assert event["norm"] > event["cap"] and event["scale"] == pytest.approx(event["cap"] / event["norm"])


def test_bootstrap_takes_the_reduced_blob_as_weights():
    coord = FakeCoordinator(quadratic_worker(TARGETS))
    out = run(coord, initial_weights={})
    reference = run(FakeCoordinator(quadratic_worker(TARGETS)))  # zeros + delta == delta
    assert out["weights"] == reference["weights"]


def test_compact_publishing():
    coord = FakeCoordinator(quadratic_worker(TARGETS))
    out = run(coord, rounds=1, compact=True)
    published = json.loads(coord.store["jobs/000000000001/round-000/weights.json"])
    assert published["w"]["encoding"] == "f64le-b64"
    assert list(decode(published)["w"][1]) == out["weights"]["w"]["data"]


# --- build_round ------------------------------------------------------------------------------------------------


def test_build_round_plans_every_round():
    coord = FakeCoordinator(quadratic_worker(TARGETS))
    calls = []

    def build(r, uri):
        calls.append((r, uri))
        body = _round_body(r, 4, {"lr": 0.5}, uri, 30.0, "x/y:1", "standard", False, pool="p")
        return {"body": body, "task_ids": ["shard-003", "shard-001", "shard-000"]}

    out = run(coord, rounds=2, min_participants=3, build_round=build, worker_params={"ignored": True})
    assert calls == [(0, None), (1, "artifact://jobs/000000000001/round-000/weights.json")]
    assert all(b["spec"]["placement"] == {"pool": "p"} for b in coord.bodies)
    assert out["history"][0]["participants"] == 3


@pytest.mark.parametrize(("ids", "match"), [
    (["a", "a", "b"], "duplicate task ids"),
    (["a", "b"], "fewer than min_participants"),
])
def test_build_round_refusals_happen_before_submitting(ids, match):
    coord = FakeCoordinator(quadratic_worker(TARGETS))
    with pytest.raises(ValueError, match=match):
        run(coord, min_participants=3, build_round=lambda r, uri: {"body": {}, "task_ids": ids})
    assert coord.calls == []


# --- resume_state -----------------------------------------------------------------------------------------------


def test_resume_state_picks_the_newest_published_round():
    coord = FakeCoordinator(quadratic_worker(TARGETS))
    out = run(coord, rounds=3)
    next_round, weights, uri = resume_state(coord, out["job_ids"])
    assert next_round == 3 and weights == out["weights"]
    assert uri == "artifact://jobs/000000000003/round-002/weights.json"
    # the round-2 weights vanish → fall back to round 1
    del coord.store["jobs/000000000003/round-002/weights.json"]
    assert resume_state(coord, list(reversed(out["job_ids"])))[0] == 2


def test_resume_state_edge_cases():
    coord = FakeCoordinator(quadratic_worker(TARGETS))
    assert resume_state(coord, []) == (0, {}, None)
    assert resume_state(coord, [(0, "nojob")]) == (0, {}, None)
    with pytest.raises(RuntimeError, match="history gap"):
        resume_state(coord, [(2, "nojob")])
    with pytest.raises(TypeError, match="bare string 'abc'"):
        resume_state(coord, ["abc"])
    coord.store["jobs/j/round-004/weights.json"] = b"{}"
    with pytest.raises(RuntimeError, match="present but empty"):
        resume_state(coord, [(4, "j")])
    coord.store["jobs/k/round-001/weights.json"] = json.dumps({"w": {"shape": [1], "data": [math.nan]}}).encode()
    with pytest.raises(NonFiniteWeights, match="round-001/weights.json: 'w' index 0 is not finite"):
        resume_state(coord, [(1, "k")])
    coord.raise_next["get_artifact"] = [ConnectionError("down")]
    with pytest.raises(ConnectionError):
        resume_state(coord, [(1, "k")])


@pytest.mark.parametrize("raw", [b"", b"  \n", "", b"{}"])
def test_resume_state_reads_a_blank_weights_artifact_as_present_but_empty(raw):
    coord = FakeCoordinator(quadratic_worker(TARGETS))
    coord.store["jobs/j/round-004/weights.json"] = raw
    with pytest.raises(RuntimeError, match=r"resume_state: jobs/j/round-004/weights.json is present but empty"):
        resume_state(coord, [(4, "j")])


def test_resume_state_names_the_key_of_undecodable_weights():
    coord = FakeCoordinator(quadratic_worker(TARGETS))
    coord.store["jobs/j/round-004/weights.json"] = b'{"w": '
    with pytest.raises(json.JSONDecodeError, match=r"resume_state: jobs/j/round-004/weights.json is not valid JSON"):
        resume_state(coord, [(4, "j")])
    coord.store["jobs/j/round-004/weights.json"] = b"\x80{}"
    with pytest.raises(UnicodeDecodeError, match=r"resume_state: jobs/j/round-004/weights.json is not valid JSON"):
        resume_state(coord, [(4, "j")])
