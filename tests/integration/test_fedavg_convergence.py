"""FedAvg converges like centralized training (the reference comparison), and the worker CLI.

Three rounds over four shards of the worker's model and synthetic data, driven through the
in-process FakeCoordinator that runs the real ``run_worker`` per shard, must reach a union loss
within 10 % of centralized training on the union. The same run against a real ``flashruntime serve``
with real ``flashruntime worker`` processes is ``tests/e2e/test_fedavg_over_http.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flashml_workloads.fedavg_driver import run_fedavg
from flashml_workloads.fedavg_weights import decode
from tests.fedavg_fakes import FakeCoordinator

pytestmark = pytest.mark.torch
pytest.importorskip("torch")

from flashml_workloads import fedavg_worker as fw  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
WORKER_PARAMS = {"local_steps": 25, "lr": 0.2, "batch_size": 16, "seed": 7, "in_dim": 8, "hidden": 16, "out_dim": 2,
                 "dataset_size": 512}
ROUNDS, SHARDS = 3, 4
FULL = {**WORKER_PARAMS, "round": 0, "shard": 0, "num_shards": SHARDS}


def in_process_worker(tmp_path: Path):
    counter = iter(range(10**6))

    def worker(task_id, params, weights):
        workdir = tmp_path / f"attempt-{next(counter)}"
        workdir.mkdir()
        inputs = {}
        if weights is not None:
            (workdir / "weights.json").write_bytes(weights)
            inputs["weights"] = str(workdir / "weights.json")
        fw.run_worker({"task_id": task_id, "params": params, "inputs": inputs}, workdir / "out")
        return {name: (workdir / "out" / name).read_bytes() for name in ("metrics.json", "delta.json")}

    return worker


def test_three_round_four_shard_fedavg_is_within_10_percent_of_centralized(tmp_path):
    coord = FakeCoordinator(in_process_worker(tmp_path))
    initial = fw.state_to_blob(fw.build_model(FULL))  # what round-0 workers start from (seeded init)
    out = run_fedavg(coord, rounds=ROUNDS, num_shards=SHARDS, min_participants=SHARDS, worker_params=WORKER_PARAMS,
                     initial_weights=initial, poll_seconds=0.0)
    assert [h["participants"] for h in out["history"]] == [SHARDS] * ROUNDS
    assert all(h["clipped"] == [] for h in out["history"])  # honest shards are never clipped
    losses = [h["mean_loss"] for h in out["history"]]
    assert losses[0] > losses[1] > losses[2]
    federated = fw.union_loss(FULL, out["weights"])
    centralized = fw.centralized_loss(FULL, ROUNDS)
    initial_loss = fw.union_loss(FULL)
    assert federated < 0.5 * initial_loss  # it learned something
    assert federated <= 1.10 * centralized, (federated, centralized)


@pytest.mark.slow  # two interpreters importing torch
def test_worker_cli_writes_outputs_and_fails_with_a_reason(tmp_path):
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps({"task_id": "shard-001", "params": {**FULL, "shard": 1, "local_steps": 3},
                                     "inputs": {}}))
    proc = subprocess.run([sys.executable, "-m", "flashml_workloads.fedavg_worker", "--spec", str(spec_path),
                           "--out", str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["shard"] == 1 and metrics["samples"] == 128 and metrics["delta_file"] == "delta.json"
    assert set(decode(json.loads((tmp_path / "out" / "delta.json").read_text()))) == {
        "0.weight", "0.bias", "2.weight", "2.bias"}
    spec_path.write_text(json.dumps({"task_id": "x", "params": {"lr": 0.1}, "inputs": {}}))
    proc = subprocess.run([sys.executable, "-m", "flashml_workloads.fedavg_worker", "--spec", str(spec_path),
                           "--out", str(tmp_path / "bad")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "fedavg_worker: ValueError: fedavg_worker: missing params" in proc.stderr
    assert not (tmp_path / "bad" / "metrics.json").exists()
