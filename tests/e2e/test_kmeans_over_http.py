"""Sharded K-means over real HTTP: a real coordinator, two real
``flashruntime worker`` processes running ``kmeans_shard`` tasks, and ``run_kmeans``
driving three Lloyd iterations over four CSV shards. The result must match an
in-process Lloyd run from the same initial centroids."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from flashml_workloads.kmeans_driver import init_centroids, run_kmeans, shard_and_upload
from tests._support import REPO_ROOT
from tests.kmeans_reference import lloyd
from tests.service_server import process_env, serve_in_thread, settings_for, stop_process

pytestmark = [pytest.mark.service, pytest.mark.slow]
pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")

ITERATIONS, SHARDS, K = 3, 4, 3
WORKERS = ("w1", "w2")


def three_blobs(n: int = 240, seed: int = 11) -> list[list[float]]:
    """Seeded 2-D Gaussian blobs, already at the shards' 6 dp so workers and the reference read the same rows."""
    rng = random.Random(seed)
    centers = [(0.0, 0.0), (8.0, 1.0), (3.0, 9.0)]
    return [[round(rng.gauss(c, 1.2), 6) for c in centers[i % 3]] for i in range(n)]


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def test_three_iterations_over_a_real_coordinator_and_two_workers_match_local_lloyd(tmp_path: Path) -> None:
    rows = three_blobs()
    start = init_centroids(rows, K, seed=0)
    env = process_env()
    workers: list[subprocess.Popen[str]] = []
    with serve_in_thread(settings_for(tmp_path / "data")) as url:
        try:
            for node in WORKERS:
                workers.append(subprocess.Popen(
                    [sys.executable, "-m", "flashruntime.cli", "--api", url, "worker", "--node-id", node,
                     "--work-dir", str(tmp_path / node), "--poll-seconds", "0.2"],
                    env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
            deadline = time.monotonic() + 60
            while {n["node_id"] for n in get_json(f"{url}/v1alpha1/nodes")} != set(WORKERS):
                assert time.monotonic() < deadline, "workers did not register within 60 s"
                assert all(w.poll() is None for w in workers), "a worker exited early"
                time.sleep(0.1)

            uris = shard_and_upload(url, rows, SHARDS, "datasets/blobs")
            out = run_kmeans(url, uris, start, iterations=ITERATIONS, poll_seconds=0.2, timeout_per_iteration_s=120.0)
            nodes = {n["node_id"]: n["accepted_tasks"] for n in get_json(f"{url}/v1alpha1/nodes")}
            states = [get_json(f"{url}/v1alpha1/jobs/{job}")["state"] for job in out["job_ids"]]
        finally:
            logs = [stop_process(worker) for worker in workers]

    assert uris == [f"artifact://datasets/blobs/shard-{s:03d}.csv" for s in range(SHARDS)]
    expected, history = lloyd(rows, start, ITERATIONS)
    assert len(out["job_ids"]) == ITERATIONS and states == ["SUCCEEDED"] * ITERATIONS
    for got, want in zip(out["centroids"], expected, strict=True):
        assert all(abs(g - w) <= 1e-6 for g, w in zip(got, want, strict=True)), (out["centroids"], expected)
    assert out["inertia_history"] == pytest.approx(history, rel=1e-9)
    assert all(b <= a for a, b in zip(out["inertia_history"], out["inertia_history"][1:])), out["inertia_history"]
    assert out["inertia_history"][-1] < 0.5 * out["inertia_history"][0]  # the run actually moved the centroids
    # both workers ran tasks, and every shard of every iteration was an accepted commit
    assert sum(nodes.values()) == ITERATIONS * SHARDS and all(count > 0 for count in nodes.values()), nodes
    assert all(worker.returncode == 0 for worker in workers), logs
