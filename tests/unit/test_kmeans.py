"""K-means: ``kmeans_shard`` partials, ``kmeans_driver`` reduce/init/sharding, and
``run_kmeans`` against a stdlib stand-in coordinator that computes partials with ``run_shard``."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
import tempfile
import threading
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from flashml_workloads import kmeans_driver as kd
from flashml_workloads import kmeans_shard as ks
from tests._support import REPO_ROOT, FakeClock
from tests.kmeans_reference import lloyd_step

CENTROIDS = [[0.0, 0.0], [4.0, 0.0], [0.0, 4.0]]


def write_csv(path: Path, rows: list[list[float]]) -> Path:
    path.write_text("".join(",".join(repr(v) for v in row) + "\n" for row in rows), encoding="utf-8")
    return path


def shard_spec(path: Path, centroids: Any = CENTROIDS, task_id: str = "it00-shard-000") -> dict[str, Any]:
    return {"task_id": task_id, "params": {"centroids": centroids}, "inputs": {"shard": str(path)}}


def blobs(n: int, seed: int) -> list[list[float]]:
    rng = random.Random(seed)
    centers = [(0.0, 0.0, 0.0), (5.0, 5.0, 0.0), (0.0, 6.0, 4.0)]
    return [[round(rng.gauss(c, 1.0), 6) for c in centers[i % 3]] for i in range(n)]


# --- kmeans_shard ---------------------------------------------------------------------------


def test_run_shard_assigns_nearest_and_reports_exact_keys(tmp_path: Path) -> None:
    rows = [[0.5, 0.0], [3.0, 1.0], [0.0, 5.0], [-1.0, -1.0]]
    metrics = ks.run_shard(shard_spec(write_csv(tmp_path / "s.csv", rows)))
    assert list(metrics) == ["task_id", "sums", "counts", "inertia", "n"] == list(ks.METRIC_KEYS)
    assert metrics["task_id"] == "it00-shard-000"
    assert metrics["counts"] == [2, 1, 1]
    assert metrics["sums"] == [[-0.5, -1.0], [3.0, 1.0], [0.0, 5.0]]
    assert metrics["inertia"] == pytest.approx(0.25 + 2.0 + 1.0 + 2.0, abs=1e-12)
    assert metrics["n"] == 4


def test_ties_go_to_the_lowest_centroid_index(tmp_path: Path) -> None:
    # distances to CENTROIDS: (2,0) -> 4, 4, 20; (2,2) -> 8, 8, 8; (0,2) -> 4, 20, 4
    rows = [[2.0, 0.0], [2.0, 2.0], [0.0, 2.0]]
    metrics = ks.run_shard(shard_spec(write_csv(tmp_path / "s.csv", rows)))
    assert metrics["counts"] == [3, 0, 0]
    assert metrics["inertia"] == 4.0 + 8.0 + 4.0
    # permuted: (2,0) -> 20, 4, 4 (goes to 1); (2,2) -> 8, 8, 8 (to 0); (0,2) -> 4, 20, 4 (to 0)
    permuted = [[0.0, 4.0], [4.0, 0.0], [0.0, 0.0]]
    metrics = ks.run_shard(shard_spec(tmp_path / "s.csv", permuted))
    assert metrics["counts"] == [2, 1, 0]
    assert ks.assign(rows, permuted) == ([1, 0, 0], [4.0, 8.0, 4.0])


def test_sums_are_rounded_to_ten_decimals_and_empty_clusters_are_zero(tmp_path: Path) -> None:
    rows = [[0.1, 0.123456789012345], [0.2, 0.000000000049]]
    metrics = ks.run_shard(shard_spec(write_csv(tmp_path / "s.csv", rows)))
    assert metrics["sums"][0] == [0.3, 0.1234567891]  # fsum(0.1, 0.2) = 0.30000000000000004 before rounding
    assert metrics["sums"][1:] == [[0.0, 0.0], [0.0, 0.0]] and metrics["counts"] == [2, 0, 0]
    assert metrics["sums"][0][0] == round(0.1 + 0.2, 10) != 0.1 + 0.2


def test_blank_lines_are_skipped_and_an_empty_shard_is_a_valid_partial(tmp_path: Path) -> None:
    (tmp_path / "s.csv").write_text("\n1,1\n\n  \n3,3\n", encoding="utf-8")
    assert ks.run_shard(shard_spec(tmp_path / "s.csv"))["n"] == 2
    (tmp_path / "e.csv").write_text("", encoding="utf-8")
    assert ks.run_shard(shard_spec(tmp_path / "e.csv")) == {
        "task_id": "it00-shard-000", "sums": [[0.0, 0.0]] * 3, "counts": [0, 0, 0], "inertia": 0.0, "n": 0,
    }


@pytest.mark.parametrize(("text", "centroids", "match"), [
    ("1,2\n3\n", CENTROIDS, r"shard line 2 has 1 values but the centroids have 2 coordinates"),
    ("1,2,3\n", CENTROIDS, r"shard line 1 has 3 values but the centroids have 2 coordinates"),
    ("x,y\n1,2\n", CENTROIDS, r"shard line 1, column 1 is 'x', which is not a number.*without a header"),
    ("1,\n", CENTROIDS, r"shard line 1, column 2 is '', which is not a number"),
    ("1,nan\n", CENTROIDS, r"shard line 1, column 2 is 'nan'; values must be finite"),
    ("inf,1\n", CENTROIDS, r"shard line 1, column 1 is 'inf'; values must be finite"),
    ("1,2\n", [], r"params.centroids is \[\]; give a non-empty list"),
    ("1,2\n", [[1.0, 2.0], [3.0]], r"params.centroids\[1\] has 1 coordinates but params.centroids\[0\] has 2"),
    ("1,2\n", [[1.0, float("nan")]], r"params.centroids\[0\]\[1\] is nan; it must be finite"),
    ("1,2\n", [[True, 2.0]], r"params.centroids\[0\]\[0\] is True; it must be a number"),
    ("1,2\n", [[]], r"params.centroids\[0\] is \[\]; each centroid must be a non-empty list"),
])
def test_bad_shards_and_centroids_are_refused(tmp_path: Path, text: str, centroids: Any, match: str) -> None:
    (tmp_path / "s.csv").write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=match):
        ks.run_shard(shard_spec(tmp_path / "s.csv", centroids))


def test_distances_beyond_float64_are_refused_naming_the_line(tmp_path: Path) -> None:
    (tmp_path / "s.csv").write_text("0.5\n\n1e200\n-1e200\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"^shard line 3: the squared distance from this row to its nearest "
                                         r"centroid overflows float64 .*rescale the data"):
        ks.run_shard(shard_spec(tmp_path / "s.csv", [[0.0], [1.0]]))
    # huge coordinates near a centroid are fine: only the nearest distance has to be a float
    (tmp_path / "near.csv").write_text("1e200\n", encoding="utf-8")
    metrics = ks.run_shard(shard_spec(tmp_path / "near.csv", [[0.0], [1e200]]))
    assert metrics["counts"] == [0, 1] and metrics["inertia"] == 0.0 and metrics["sums"] == [[0.0], [1e200]]
    # finite squares whose sum leaves float64 count as an infinite distance
    assert ks.assign([[1e154, 1e154]], [[0.0, 0.0], [1e154, 1e154]]) == ([1], [0.0])
    assert ks.assign([[1e154, 1e154]], [[0.0, 0.0]]) == ([0], [math.inf])


def test_sums_beyond_float64_are_refused(tmp_path: Path) -> None:
    (tmp_path / "s.csv").write_text("1e308\n1e308\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"^shard: the sum of column 1 of the rows nearest params.centroids\[1\] "
                                         r"overflows float64"):
        ks.run_shard(shard_spec(tmp_path / "s.csv", [[0.0], [1e308]]))


def test_cli_refuses_huge_coordinates_with_exit_one_and_no_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "s.csv").write_text("1e200\n-1e200\n", encoding="utf-8")
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(shard_spec(tmp_path / "s.csv", [[0.0], [1.0]])), encoding="utf-8")
    assert ks.main(["--spec", str(spec_path), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("kmeans_shard: ValueError: shard line 1: the squared distance"), err
    assert not (tmp_path / "out" / "metrics.json").exists()


def test_ragged_rows_without_a_known_dimension_name_both_lines(tmp_path: Path) -> None:
    (tmp_path / "s.csv").write_text("1,2,3\n\n4,5\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"shard line 3 has 2 values but line 1 has 3"):
        ks.read_rows(tmp_path / "s.csv")


def test_missing_params_or_inputs_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"params.centroids is missing"):
        ks.run_shard({"task_id": "t", "params": {}, "inputs": {"shard": str(tmp_path / "s.csv")}})
    with pytest.raises(ValueError, match=r"input 'shard' is missing"):
        ks.run_shard({"task_id": "t", "params": {"centroids": CENTROIDS}, "inputs": {}})


def test_cli_writes_metrics_json_and_exits_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(shard_spec(write_csv(tmp_path / "s.csv", [[1.0, 0.5], [0.0, 3.5]]))))
    assert ks.main(["--spec", str(spec_path), "--out", str(tmp_path / "out")]) == 0
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics == {"task_id": "it00-shard-000", "sums": [[1.0, 0.5], [0.0, 0.0], [0.0, 3.5]],
                       "counts": [1, 0, 1], "inertia": 1.25 + 0.25, "n": 2}
    assert json.loads(capsys.readouterr().out)["n"] == 2


@pytest.mark.parametrize(("spec", "csv_text", "expected"), [
    ("ok", "1,2,3\n", "kmeans_shard: ValueError: shard line 1 has 3 values but the centroids have 2 coordinates"),
    ("ok", "1,abc\n", "kmeans_shard: ValueError: shard line 1, column 2 is 'abc', which is not a number"),
    ("empty-centroids", "1,2\n", "kmeans_shard: ValueError: params.centroids is []"),
    ("not-json", "1,2\n", "kmeans_shard: JSONDecodeError: "),
    ("list", "1,2\n", "kmeans_shard: ValueError: "),
])
def test_cli_errors_exit_one_with_the_error_type_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: str, csv_text: str, expected: str
) -> None:
    (tmp_path / "s.csv").write_text(csv_text, encoding="utf-8")
    spec_path = tmp_path / "spec.json"
    body = {"ok": json.dumps(shard_spec(tmp_path / "s.csv")),
            "empty-centroids": json.dumps(shard_spec(tmp_path / "s.csv", [])),
            "not-json": "{", "list": "[]"}[spec]
    spec_path.write_text(body, encoding="utf-8")
    assert ks.main(["--spec", str(spec_path), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(expected), err
    assert not (tmp_path / "out" / "metrics.json").exists()


def test_module_runs_as_python_dash_m(tmp_path: Path) -> None:
    (tmp_path / "s.csv").write_text("1,2\nnan,1\n", encoding="utf-8")
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(shard_spec(tmp_path / "s.csv")))
    done = subprocess.run([sys.executable, "-m", "flashml_workloads.kmeans_shard", "--spec", str(spec_path),
                           "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=60, check=False)
    assert done.returncode == 1
    assert done.stderr.strip() == "kmeans_shard: ValueError: shard line 2, column 1 is 'nan'; values must be finite"


# --- kmeans_driver: pure parts --------------------------------------------------------------


def test_reduce_partials_weights_by_counts_and_sums_inertia() -> None:
    prev = [[0.0, 0.0], [10.0, 10.0]]
    partials = [
        {"task_id": "a", "sums": [[2.0, 4.0], [30.0, 33.0]], "counts": [2, 3], "inertia": 1.5, "n": 5},
        {"task_id": "b", "sums": [[1.0, -1.0], [0.0, 0.0]], "counts": [1, 0], "inertia": 0.25, "n": 1},
    ]
    centroids, inertia = kd.reduce_partials(partials, prev)
    assert centroids == [[1.0, 1.0], [10.0, 11.0]]
    assert inertia == 1.75


def test_reduce_partials_keeps_the_previous_centroid_of_an_empty_cluster() -> None:
    prev = [[0.0, 0.0], [7.5, -2.0], [1.0, 1.0]]
    partial = {"task_id": "a", "sums": [[3.0, 3.0], [0.0, 0.0], [0.0, 0.0]], "counts": [3, 0, 0], "inertia": 2.0,
               "n": 3}
    centroids, inertia = kd.reduce_partials([partial, dict(partial)], prev)
    assert centroids == [[1.0, 1.0], [7.5, -2.0], [1.0, 1.0]]
    assert inertia == 4.0
    centroids[1][0] = 99.0
    assert prev[1] == [7.5, -2.0]  # a copy, not the caller's row


def test_reduce_partials_takes_prev_centroids_by_keyword_and_keeps_an_empty_clusters_centroid() -> None:
    prev = [[0.0, 0.0], [7.5, -2.0]]
    partial = {"task_id": "a", "sums": [[3.0, 3.0], [0.0, 0.0]], "counts": [3, 0], "inertia": 2.0, "n": 3}
    assert kd.reduce_partials([partial], prev_centroids=prev) == ([[1.0, 1.0], [7.5, -2.0]], 2.0)
    assert kd.reduce_partials([partial], prev_centroids=prev) == kd.reduce_partials([partial], prev)
    with pytest.raises(TypeError, match=r"give the previous centroids once, .*; got both"):
        kd.reduce_partials([partial], prev, prev_centroids=prev)
    with pytest.raises(TypeError, match=r"got neither"):
        kd.reduce_partials([partial])
    with pytest.raises(ValueError, match=r"reduce_partials: prev_centroids is \[\]"):
        kd.reduce_partials([partial], prev_centroids=[])


@pytest.mark.parametrize(("partials", "match"), [
    ([], r"partials must be a non-empty list"),
    ([{"sums": [[0.0, 0.0]], "counts": [1]}], r"partials\[0\].sums must hold 2 rows"),
    ([{"sums": [[0.0, 0.0], [0.0]], "counts": [1, 0], "inertia": 0.0}], r"partials\[0\].sums\[1\] must hold 2 values"),
    ([{"sums": [[0.0, 0.0]] * 2, "counts": [1, -1], "inertia": 0.0}], r"partials\[0\].counts\[1\] is -1"),
    ([{"sums": [[0.0, 0.0]] * 2, "counts": [1, 0], "inertia": float("nan")}], r"partials\[0\].inertia is nan"),
    ([{"sums": [[0.0, float("inf")]] * 2, "counts": [1, 0], "inertia": 0.0}], r"sums\[0\]\[1\] is inf"),
    ([{"sums": [[0.0, 0.0]] * 2, "counts": [1, 0], "inertia": 0.0, "n": 2}], r"n=2 but its counts sum to 1"),
    ([{"counts": [1, 0], "inertia": 0.0}], r"partials\[0\] has no 'sums'"),
])
def test_reduce_partials_refuses_malformed_partials(partials: list[Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        kd.reduce_partials(partials, [[0.0, 0.0], [1.0, 1.0]])


def test_init_centroids_is_a_seeded_sample_of_distinct_rows() -> None:
    rows = [[float(i), float(-i)] for i in range(50)]
    first = kd.init_centroids(rows, 4, seed=3)
    assert first == kd.init_centroids(rows, 4, seed=3)
    assert first == [rows[i] for i in random.Random(3).sample(range(50), 4)]
    assert len({tuple(c) for c in first}) == 4 and all(c in rows for c in first)
    assert kd.init_centroids(rows, 4, seed=4) != first
    assert kd.init_centroids(rows, 4) == kd.init_centroids(rows, 4, seed=0)
    first[0][0] = 1e9
    assert [1e9, first[0][1]] not in rows  # fresh lists


def test_init_centroids_refusals() -> None:
    with pytest.raises(ValueError, match=r"k=3 is more than the 2 rows"):
        kd.init_centroids([[1.0], [2.0]], 3)
    with pytest.raises(ValueError, match=r"k must be an int >= 1, got 0"):
        kd.init_centroids([[1.0], [2.0]], 0)
    with pytest.raises(ValueError, match=r"rows\[1\] has 1 values but rows\[0\] has 2"):
        kd.init_centroids([[1.0, 2.0], [2.0]], 1)


@pytest.mark.parametrize(("k", "n_shards"), [(3, 1), (4, 5), (5, 7)])
def test_sharded_iteration_plus_reduce_equals_single_process_lloyd(tmp_path: Path, k: int, n_shards: int) -> None:
    rows = blobs(301, seed=k)
    centroids = kd.init_centroids(rows, k, seed=1)
    for _ in range(3):  # a few iterations, each compared from the same starting centroids
        partials = []
        for s in range(n_shards):
            path = write_csv(tmp_path / f"shard-{s}.csv", rows[s::n_shards])
            partials.append(ks.run_shard(shard_spec(path, centroids, f"it00-shard-{s:03d}")))
        assert sum(p["n"] for p in partials) == len(rows)
        sharded, inertia = kd.reduce_partials(partials, centroids)
        expected, expected_inertia = lloyd_step(rows, centroids)
        assert inertia == pytest.approx(expected_inertia, rel=1e-12)
        for got, want in zip(sharded, expected, strict=True):
            assert all(abs(g - w) <= 1e-9 for g, w in zip(got, want, strict=True)), (got, want)
        centroids = sharded


# --- run_kmeans against a stand-in coordinator ------------------------------------------------


class StandInCoordinator:
    """Artifacts, job submission, job state and task listing. A submitted job's partials are
    computed at once with ``run_shard``; its state then follows ``states`` (the last repeats)."""

    def __init__(self) -> None:
        self.artifacts: dict[str, bytes] = {}
        self.content_types: dict[str, str] = {}
        self.jobs: dict[str, dict[str, Any]] = {}
        self.states: list[str] = ["RUNNING", "SUCCEEDED"]
        self.state_errors: deque[int] = deque()  # statuses answered to the next job-state reads
        self.skip_partials: set[str] = set()  # task ids left without metrics.json and not COMPLETED
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _reply(self, status: int, body: Any, raw: bool = False) -> None:
                data = body if raw else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self) -> None:
                key = self.path.removeprefix("/v1alpha1/artifacts/")
                with fake.lock:
                    fake.artifacts[key] = self.rfile.read(int(self.headers["Content-Length"]))
                    fake.content_types[key] = self.headers.get("Content-Type", "")
                self._reply(200, {"uri": f"artifact://{key}", "object_key": key})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                self._reply(201, {"job_id": fake.submit(body)})

            def do_GET(self) -> None:
                parts = self.path.strip("/").split("/")
                with fake.lock:
                    if parts[1] == "artifacts":
                        key = "/".join(parts[2:])
                        if key in fake.artifacts:
                            return self._reply(200, fake.artifacts[key], raw=True)
                        return self._reply(404, {"detail": f"no artifact {key!r}"})
                    job = fake.jobs[parts[2]]
                    if len(parts) == 4:
                        return self._reply(200, job["tasks"])
                    if fake.state_errors:
                        return self._reply(fake.state_errors.popleft(), {"detail": "busy"})
                    state = fake.states[min(job["reads"], len(fake.states) - 1)]
                    job["reads"] += 1
                    return self._reply(200, {"job_id": parts[2], "state": state})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def submit(self, body: dict[str, Any]) -> str:
        with self.lock:
            job_id = f"{len(self.jobs):012x}"
            params = body["spec"]["workload"]["parameters"]
            tasks = []
            with tempfile.TemporaryDirectory() as tmp:
                for i, uri in enumerate(params["shards"]):
                    task_id = f"it{params['iteration']:02d}-shard-{i:03d}"
                    if task_id in self.skip_partials:
                        tasks.append({"task_id": task_id, "state": "FAILED"})
                        continue
                    path = Path(tmp) / "shard.csv"
                    path.write_bytes(self.artifacts[uri.removeprefix("artifact://")])
                    metrics = ks.run_shard(shard_spec(path, params["centroids"], task_id))
                    self.artifacts[f"jobs/{job_id}/{task_id}/metrics.json"] = json.dumps(metrics).encode()
                    tasks.append({"task_id": task_id, "state": "COMPLETED"})
            self.jobs[job_id] = {"body": body, "tasks": tasks, "reads": 0}
            return job_id

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def coordinator() -> Any:
    fake = StandInCoordinator()
    yield fake
    fake.close()


def test_shard_and_upload_puts_strided_six_decimal_csvs(coordinator: StandInCoordinator) -> None:
    rows = [[i + 0.1234567, -i / 3] for i in range(7)]
    uris = kd.shard_and_upload(coordinator.url, rows, 3, "data/km/")
    assert uris == [f"artifact://data/km/shard-{s:03d}.csv" for s in range(3)]
    assert coordinator.artifacts["data/km/shard-001.csv"].decode() == (
        "1.123457,-0.333333\n4.123457,-1.333333\n"
    )
    assert coordinator.artifacts["data/km/shard-000.csv"].decode().count("\n") == 3
    assert set(coordinator.content_types.values()) == {"text/csv"}
    with pytest.raises(ValueError, match=r"n_shards=8 must be at most the number of rows \(7\)"):
        kd.shard_and_upload(coordinator.url, rows, 8, "data/km")
    with pytest.raises(ValueError, match=r"prefix must be a non-empty"):
        kd.shard_and_upload(coordinator.url, rows, 2, "/")


def test_run_kmeans_submits_one_job_per_iteration_and_matches_lloyd(coordinator: StandInCoordinator) -> None:
    rows = blobs(90, seed=5)
    uris = kd.shard_and_upload(coordinator.url, rows, 4, "data/km")
    local = [[float(f"{v:.6f}") for v in row] for row in rows]
    start = kd.init_centroids(local, 3, seed=0)
    clock = FakeClock()
    out = kd.run_kmeans(coordinator.url, uris, start, iterations=3, lease_seconds=12.0, poll_seconds=0.25,
                        clock=clock, sleep=clock.sleep)
    assert set(out) == {"centroids", "inertia_history", "job_ids"}
    assert len(out["job_ids"]) == 3 and len(set(out["job_ids"])) == 3
    bodies = [coordinator.jobs[j]["body"] for j in out["job_ids"]]
    assert [b["metadata"]["name"] for b in bodies] == ["kmeans-it00", "kmeans-it01", "kmeans-it02"]
    first = bodies[0]
    assert first["spec"]["execution"] == {"backend": "leases"}
    assert first["spec"]["image"] == {"repository": "local/tier1", "tag": "dev"}
    assert first["spec"]["workload"] == {"type": "sharded_kmeans", "parameters": {
        "shards": uris, "centroids": start, "iteration": 0, "lease_seconds": 12.0}}
    assert clock.sleeps == [0.25] * 3  # one RUNNING read per iteration
    expected, history = start, []
    for body in bodies:  # each iteration starts from the previous one's reduce, as a local Lloyd run does
        sent = body["spec"]["workload"]["parameters"]["centroids"]
        assert all(s == pytest.approx(e, abs=1e-9) for s, e in zip(sent, expected, strict=True))
        expected, inertia = lloyd_step(local, expected)
        history.append(inertia)
    assert out["inertia_history"] == pytest.approx(history, rel=1e-12)
    assert all(o == pytest.approx(e, abs=1e-9) for o, e in zip(out["centroids"], expected, strict=True))
    assert out["centroids"] != start


def test_run_kmeans_retries_a_5xx_state_read(coordinator: StandInCoordinator) -> None:
    uris = kd.shard_and_upload(coordinator.url, [[0.0], [1.0], [5.0]], 2, "d")
    coordinator.state_errors.extend([503, 502])
    coordinator.states = ["SUCCEEDED"]
    clock = FakeClock()
    out = kd.run_kmeans(coordinator.url, uris, [[0.0], [4.0]], iterations=1, poll_seconds=1.0, clock=clock,
                        sleep=clock.sleep)
    assert out["centroids"] == [[0.5], [5.0]] and out["inertia_history"] == [0.0 + 1.0 + 1.0]
    assert clock.sleeps == [1.0, 1.0]


@pytest.mark.parametrize("state", ["FAILED", "CANCELLED"])
def test_run_kmeans_raises_naming_a_failed_or_cancelled_job(coordinator: StandInCoordinator, state: str) -> None:
    uris = kd.shard_and_upload(coordinator.url, [[0.0], [1.0]], 2, "d")
    coordinator.states = ["RUNNING", state]
    clock = FakeClock()
    with pytest.raises(RuntimeError, match=rf"iteration 0 \(job 000000000000, kmeans-it00\) ended {state}"):
        kd.run_kmeans(coordinator.url, uris, [[0.0]], poll_seconds=0.5, clock=clock, sleep=clock.sleep)


def test_run_kmeans_times_out_by_the_injected_clock(coordinator: StandInCoordinator) -> None:
    uris = kd.shard_and_upload(coordinator.url, [[0.0], [1.0]], 1, "d")
    coordinator.states = ["RUNNING"]
    clock = FakeClock()
    with pytest.raises(RuntimeError, match=r"job 000000000000, kmeans-it00\) is still RUNNING after 3 s"):
        kd.run_kmeans(coordinator.url, uris, [[0.0]], poll_seconds=1.0, timeout_per_iteration_s=3.0, clock=clock,
                      sleep=clock.sleep)
    assert clock.sleeps == [1.0, 1.0, 1.0] and clock.now == 3.0


def test_run_kmeans_requires_every_shards_partial(coordinator: StandInCoordinator) -> None:
    uris = kd.shard_and_upload(coordinator.url, [[0.0], [1.0], [2.0]], 3, "d")
    coordinator.skip_partials = {"it00-shard-001"}
    coordinator.states = ["SUCCEEDED"]  # a stand-in that claims success anyway
    with pytest.raises(RuntimeError, match=r"task it00-shard-001 is FAILED, so shard 1 has no partial"):
        kd.run_kmeans(coordinator.url, uris, [[0.0]], iterations=1)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"shard_uris": []}, r"shard_uris must be a non-empty list"),
    ({"shard_uris": ["s3://x"]}, r"shard_uris \['s3://x'\] are not artifact:// URIs"),
    ({"centroids": []}, r"run_kmeans: centroids is \[\]"),
    ({"iterations": 0}, r"iterations must be an int >= 1"),
    ({"poll_seconds": 0}, r"poll_seconds must be a number of seconds > 0"),
    ({"image": "local/tier1"}, r"image must be 'repository:tag'"),
])
def test_run_kmeans_refuses_bad_arguments_before_submitting(
    coordinator: StandInCoordinator, kwargs: dict[str, Any], match: str
) -> None:
    args: dict[str, Any] = {"shard_uris": ["artifact://d/shard-000.csv"], "centroids": [[0.0]], **kwargs}
    with pytest.raises(ValueError, match=match):
        kd.run_kmeans(coordinator.url, **args)
    assert coordinator.jobs == {}


def test_kmeans_shard_is_stdlib_only_and_the_driver_needs_only_the_core() -> None:
    from tests._support import blocking_prelude

    shard = blocking_prelude(allowed=("flashml_workloads",)) + (
        "import flashml_workloads.kmeans_shard\n"
        "assert 'flashruntime' not in sys.modules and 'pydantic' not in sys.modules\n"
    )
    driver = blocking_prelude() + "import flashml_workloads.kmeans_driver\n"  # pydantic via flashruntime.errors
    for code in (shard, driver):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
